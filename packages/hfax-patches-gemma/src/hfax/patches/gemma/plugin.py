"""The Gemma family's hook implementations (entry point ``gemma`` in group ``hfax``).

The family claims its model types and declares what its tested models allow (``FamilySpec.features``);
each backend's own patch hook acts on that, so this module imports no backend, nor torch or jax.
"""

from __future__ import annotations

from typing import Any

from hfax import FamilySpec, hookimpl
from hfax.specs import ATTENTION_INTERFACE, STREAMED_LOADING

FAMILY = "gemma"

#: Gemma 1, 2 and 3; ``gemma3`` is the multimodal checkpoint's config, claimed for text-only use (hfax
#: passes token ids only). Each has a parity test against PyTorch in ``tests/``.
MODEL_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3")

#: The transformers versions the family was tested with; outside them hfax warns (strict: raises).
TRANSFORMERS = ">=5.23,<5.26"


@hookimpl
def hfax_families() -> list[FamilySpec]:
    return [
        FamilySpec(
            FAMILY, MODEL_TYPES, TRANSFORMERS, features=(ATTENTION_INTERFACE, STREAMED_LOADING)
        )
    ]


@hookimpl
def hfax_detect_model(config: Any) -> str | None:
    return FAMILY if getattr(config, "model_type", None) in MODEL_TYPES else None
