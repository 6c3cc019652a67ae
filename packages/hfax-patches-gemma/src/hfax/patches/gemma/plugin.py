"""The Gemma family's hook implementations (entry point ``gemma`` in group ``hfax``).

Importing this module imports neither torch nor jax, so ``hfax plugins`` stays cheap; a backend's
patches import it only when they run.
"""

from __future__ import annotations

from typing import Any

from hfax import FamilySpec, Patcher, hookimpl

FAMILY = "gemma"

#: Gemma 1, 2 and 3; ``gemma3`` is the multimodal checkpoint's config, claimed for text-only use (hfax
#: passes token ids only). Each has a parity test against PyTorch in ``tests/``.
MODEL_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3")

#: The transformers versions the patches below were tested with; outside them hfax warns (strict: raises).
TRANSFORMERS = ">=5.23,<5.24"


@hookimpl
def hfax_families() -> list[FamilySpec]:
    return [FamilySpec(FAMILY, MODEL_TYPES, TRANSFORMERS)]


@hookimpl
def hfax_detect_model(config: Any) -> str | None:
    return FAMILY if getattr(config, "model_type", None) in MODEL_TYPES else None


@hookimpl
def hfax_patch_model(model: Any, family: str, backend: str, patcher: Patcher) -> None:
    if family != FAMILY:
        return
    if backend == "jax":
        from hfax.backends.jax import attention

        # Gemma 2 soft-caps its attention logits, so transformers runs it eagerly (exact and finite on
        # JAX); switch() leaves every attention but the default sdpa alone.
        attention.switch(model, patcher)
