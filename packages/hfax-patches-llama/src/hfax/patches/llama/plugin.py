"""The Llama family's hook implementations (entry point ``llama`` in group ``hfax``).

Importing this module imports neither torch nor jax, so ``hfax plugins`` stays cheap; a backend's
patches import it only when they run.
"""

from __future__ import annotations

from typing import Any

from hfax import FamilySpec, Patcher, hookimpl

FAMILY = "llama"

#: The ``model_type`` values whose decoder is Llama's (RMSNorm, rotary positions, grouped-query attention,
#: gated MLP; Granite adds scalar multipliers, SmolLM3 layers without rotary positions) and whose attention
#: calls follow transformers' ``AttentionInterface`` contract with nothing model-specific beside it. Each
#: has a parity test against PyTorch in ``tests/``.
MODEL_TYPES = ("llama", "mistral", "ministral", "qwen2", "qwen3", "smollm3", "granite")

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

        attention.switch(model, patcher)
