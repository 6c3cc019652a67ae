"""hfax-core's own hook implementations: the defaults every other plugin can override."""

from __future__ import annotations

from typing import Any, Mapping

from hfax.hookspecs import hookimpl
from hfax.specs import FamilySpec, ShardingPlan

#: The transformers releases hfax-core's generic path was tested on: the oldest one its pyproject declares
#: (nox session ``transformers_oldest``) through the newest (``transformers_newest``). Outside it hfax
#: warns once (strict mode: raises), naming this range; the newest session fails until a new release is
#: verified and the range widened.
TESTED_TRANSFORMERS = ">=5.23,<5.26"


@hookimpl(trylast=True)
def hfax_families() -> list[FamilySpec]:
    """The generic family: every model no family plugin claims, tested on :data:`TESTED_TRANSFORMERS`."""
    return [FamilySpec("generic", (), TESTED_TRANSFORMERS)]


@hookimpl(trylast=True)
def hfax_sharding_plan(model: Any, config: Any, family: str) -> ShardingPlan:
    """transformers' own tensor-parallel plan: ``config.base_model_tp_plan`` plus the head's ``_tp_plan``,
    split between attention heads."""
    styles = dict(getattr(config, "base_model_tp_plan", None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    inner = getattr(model, prefix, None) if prefix else None
    prefix = f"{prefix}." if inner is not None and inner is not model else ""
    head_plan = getattr(model, "_tp_plan", None) or {}
    base = ShardingPlan.from_tp_styles(
        styles, prefix=prefix, units=_head_sizes(model, styles, prefix)
    )
    head = ShardingPlan.from_tp_styles(head_plan, units=_head_sizes(model, head_plan))
    return ShardingPlan(base.rules + head.rules, base.units + head.units)


def _head_sizes(model: Any, styles: Mapping[str, str], prefix: str = "") -> dict[str, int]:
    """The ``head_dim`` of the attention block around each planned module that sits in one."""
    modules = dict(model.named_modules()) if hasattr(model, "named_modules") else {}
    sizes = {}
    for path in styles:
        block = modules.get((prefix + path).replace("*", "0").rpartition(".")[0])
        head_dim = getattr(block, "head_dim", None)
        if isinstance(head_dim, int) and head_dim > 1:
            sizes[path] = head_dim
    return sizes
