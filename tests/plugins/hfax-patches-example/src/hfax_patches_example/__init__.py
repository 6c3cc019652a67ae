"""An example hfax family: claims GPT-2 models and marks the ones it patched."""

from __future__ import annotations

from typing import Any

import hfax

FAMILY = "example"


@hfax.hookimpl
def hfax_families() -> list[hfax.FamilySpec]:
    return [hfax.FamilySpec(FAMILY, model_types=("gpt2",), transformers=">=5.23,<5.26")]


@hfax.hookimpl
def hfax_detect_model(config: Any) -> str | None:
    return FAMILY if config.model_type == "gpt2" else None


@hfax.hookimpl
def hfax_patch_model(model: Any, family: str, backend: str, patcher: hfax.Patcher) -> None:
    if family == FAMILY:
        # A real family changes what its models need here (through patcher, on the instance only).
        patcher.setattr(model, "patched_by_example", backend)
