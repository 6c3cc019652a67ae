"""hfax-core's own hook implementations: the defaults every other plugin can override."""

from __future__ import annotations

from typing import Any

from hfax.hookspecs import hookimpl
from hfax.registry import ShardingPlan


@hookimpl(trylast=True)
def hfax_sharding_plan(model: Any, config: Any, family: str) -> ShardingPlan:
    """transformers' own tensor-parallel plan: ``config.base_model_tp_plan`` plus the head's ``_tp_plan``."""
    styles = dict(getattr(config, "base_model_tp_plan", None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    inner = getattr(model, prefix, None) if prefix else None
    head_plan = getattr(model, "_tp_plan", None) or {}
    base = ShardingPlan.from_tp_styles(styles, prefix=f"{prefix}." if inner is not None and inner is not model else "")
    return ShardingPlan(base.rules + ShardingPlan.from_tp_styles(head_plan).rules)
