"""The small value types that plugins hand to core: backends, families, claims and sharding plans."""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Mapping

#: A per-dimension layout: one mesh axis name (or ``None`` for "not split") per tensor dimension.
Spec = tuple[str | None, ...]

#: The mesh axes hfax understands: batch, gathered-per-layer parameter sharding, tensor parallelism.
MESH_AXES = ("data", "fsdp", "model")


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A backend as named by its plugin: ``target`` is ``"module:attribute"`` of its backend class."""

    name: str
    target: str
    description: str = ""

    def load(self) -> Any:
        """Import the backend and return an instance (this is where torch / jax get imported)."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)()


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """A model family: its name, the ``model_type`` values it claims and the transformers versions tested."""

    name: str
    model_types: tuple[str, ...] = ()
    transformers: str = ""


@dataclasses.dataclass(frozen=True)
class Claim:
    """A plugin's answer to ``hfax_detect_model``; the highest ``priority`` wins."""

    family: str
    priority: int = 0


# transformers' tensor-parallel styles, as the dimension of a weight they split (Linear weights are
# [out_features, in_features]: colwise splits outputs, rowwise splits inputs). Biases follow the output.
_STYLE_DIM = {
    "colwise": 0,
    "colwise_gather_output": 0,
    "packed_colwise": 0,
    "local_colwise": 0,
    "rowwise": 1,
    "rowwise_split_input": 1,
    "packed_rowwise": 1,
    "local_rowwise": 1,
    "embedding_rowwise": 0,
}


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """Ordered rules ``(regex over state_dict names, Spec)``; the first match wins, no match replicates.

    ``units`` are ``(regex, n)`` pairs: a matching tensor is split over ``model`` only into pieces holding a
    whole number of ``n``-element blocks, so an attention projection is split between heads, never inside
    one (a model with fewer key/value heads than the ``model`` axis keeps its k/v projections whole).
    """

    rules: tuple[tuple[str, Spec], ...] = ()
    units: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_tp_styles(cls, styles: Mapping[str, str], prefix: str = "", units: Mapping[str, int] | None = None) -> ShardingPlan:
        """Build a plan from a transformers ``tp_plan`` (``{"layers.*.mlp.up_proj": "colwise", ...}``).

        ``prefix`` is where the plan's module paths start inside the full model (``"model."`` for the base
        model of a ``*ForCausalLM``); a ``*`` stands for a layer index. Styles that do not split a weight
        (``"gather"``, ``"sequence_parallel"``, ...) replicate it. ``units`` maps a module path of ``styles``
        to the block size its split must respect (an attention projection's ``head_dim``).
        """
        rules, unit_rules = [], []
        for path, style in styles.items():
            dim = _STYLE_DIM.get(style)
            if dim is None:
                continue
            module = re.escape(prefix + path).replace(r"\*", r"\d+")
            weight: list[str | None] = [None, None]
            weight[dim] = "model"
            rules.append((rf"(^|\.){module}\.weight$", tuple(weight)))
            if dim == 0:
                rules.append((rf"(^|\.){module}\.bias$", ("model",)))
            if units and units.get(path, 1) > 1:
                unit_rules.append((rf"(^|\.){module}\.(weight|bias)$", units[path]))
        return cls(tuple(rules), tuple(unit_rules))

    def spec_for(self, name: str, ndim: int) -> Spec:
        """The layout of parameter ``name`` with ``ndim`` dimensions (all ``None`` = replicated)."""
        for pattern, spec in self.rules:
            if re.search(pattern, name) and len(spec) == ndim:
                return spec
        return (None,) * ndim

    def unit_for(self, name: str) -> int:
        """The block size a split of ``name`` over ``model`` must respect (1: any even split)."""
        return next((unit for pattern, unit in self.units if re.search(pattern, name)), 1)

    def describe(self, shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, Spec]]:
        """Pair every named shape with its layout, for printing a plan."""
        return [(name, self.spec_for(name, len(shape))) for name, shape in shapes.items()]

