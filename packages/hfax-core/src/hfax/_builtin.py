"""hfax-core's own hook implementations: the defaults every other plugin can override."""

from __future__ import annotations

from typing import Any, Mapping

from hfax.hookspecs import hookimpl
from hfax.registry import FamilySpec, ShardingPlan

#: The transformers releases hfax-core's generic path was tested on: the oldest one its pyproject declares
#: (nox session ``transformers_oldest``) through the newest (``transformers_newest``). Outside it hfax
#: warns once (strict mode: raises), naming this range; the newest session fails until a new release is
#: verified and the range widened.
TESTED_TRANSFORMERS = ">=5.23,<5.25"


@hookimpl(trylast=True)
def hfax_families() -> list[FamilySpec]:
    """The generic family: every model no family plugin claims, tested on :data:`TESTED_TRANSFORMERS`."""
    return [FamilySpec("generic", (), TESTED_TRANSFORMERS)]


@hookimpl
def hfax_patch_model(model: Any, family: str, backend: str, patcher: Any) -> None:
    """Expert layers that loop in Python over the experts a batch hits (DBRX, LongCat-Flash, JetMoE,
    X-MOD's language adapters) run every expert with static shapes instead, on every backend
    (:mod:`hfax.experts`), sparse-attention indexers that loop over the queries choose their keys with
    static shapes too (:mod:`hfax.sparse_attention`), ProphetNet's decoder decodes over a static cache
    (:mod:`hfax.prophetnet`), Longformer's attention runs without data-dependent shapes
    (:mod:`hfax.longformer`), encoder-decoder classifiers gather each row's last ``<eos>`` state
    (:mod:`hfax.eos_pooling`), decoders that drop their mask on one-token steps get it back
    (:mod:`hfax.step_masks`), position embeddings that count from the cache's length size their range
    statically (:mod:`hfax.cache_positions`), FSMT always makes its decoder's padding mask
    (:mod:`hfax.fsmt`), Ovis2 places its visual indicators without a branch (:mod:`hfax.ovis2`) and
    Reformer looks its axial positions up in the whole grid (:mod:`hfax.axial_positions`)."""
    from hfax import (
        axial_positions,
        cache_positions,
        eos_pooling,
        experts,
        fsmt,
        longformer,
        ovis2,
        prophetnet,
        sparse_attention,
        step_masks,
    )

    patcher.bind_by_class(model, experts.LOOPS)
    patcher.bind_by_class(model, sparse_attention.LOOPS)
    patcher.bind_by_class(model, prophetnet.DECODE)
    patcher.bind_by_class(model, longformer.STATIC)
    patcher.bind_by_class(model, eos_pooling.STATIC)
    patcher.bind_by_class(model, step_masks.STEPS)
    patcher.bind_by_class(model, cache_positions.COUNTED)
    patcher.bind_by_class(model, fsmt.MASKS)
    patcher.bind_by_class(model, ovis2.INDICATORS)
    patcher.bind_by_class(model, axial_positions.AXIAL)


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
