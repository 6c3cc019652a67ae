"""How a generate program holds its weights and KV cache: the CPU decode-layout decisions, in one place.

XLA:CPU's speed on a decode step depends on the layout of what it reads, and the fastest layout depends
on the rows, the weights' dtype and the loop's length (docs/PERFORMANCE.md, "CPU decode layouts", has the
measurements). :func:`choose` makes every decision for one program; ``generation`` only follows it. On
other platforms and on a mesh, PyTorch's layouts stay (XLA's own layout assignment handles them, and a
sharded copy would cost collectives).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax.numpy as jnp
import torch

from hfax.backends.jax import cache as slot_cache

#: The fewest decode steps a loop must be able to run for its weights to be transposed.
TRANSPOSE_FROM_STEPS = 64


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
    """``transposed``: the weights read from an ``[in, out]`` copy; ``row_products``: 16-bit one-row
    products read the 16-bit weights (``lowerings.row_products``); ``in_place_cache``: the slot cache is
    updated in place, its keys stored transposed (``cache.SlotCache``)."""

    transposed: frozenset[str] = frozenset()
    row_products: bool = False
    in_place_cache: bool = False

    @property
    def carries_weights(self) -> bool:
        """Whether the decode loop carries the weights past an optimization barrier. Loop invariants would
        let XLA:CPU hoist a float32 conversion of 16-bit weights out of the loop (each step then reads
        float32) and fold a transposed copy back into the original layout."""
        return bool(self.transposed) or self.row_products


def choose(
    model: Any, *, layer_types: Any, encoder_decoder: bool, rows: int, steps: int
) -> DecodeLayout:
    """The layout of a program over ``rows`` rows that decodes up to ``steps`` tokens (0 for prefill)."""
    return DecodeLayout(
        transposed=transposed_weights(model, rows, steps),
        row_products=reads_16_bits(model),
        in_place_cache=in_place_cache(model, layer_types, encoder_decoder),
    )


def reads_16_bits(model: Any) -> bool:
    """Whether 16-bit weights are multiplied as they are, on one CPU device: XLA:CPU otherwise converts
    them to float32 for its dots (and resident memory then holds the float32 copy too)."""
    dtype = model.dtype
    return (
        model.platform == "cpu"
        and model.mesh is None
        and jnp.issubdtype(dtype, jnp.floating)
        and jnp.finfo(dtype).bits == 16
    )


def transposed_weights(model: Any, rows: int, steps: int) -> frozenset[str]:
    """The ``nn.Linear`` weights a loop of ``steps`` steps over ``rows`` rows reads from an ``[in, out]``
    copy, on one CPU device.

    XLA:CPU multiplies a few rows by 16-bit weights faster from an ``[in, out]`` copy than from PyTorch's
    ``[out, in]``; one row (a matrix-vector product) reads ``[out, in]`` as fast or faster. The copy is
    made before the loop, holds memory while it runs and costs some steps' savings: so from eight rows,
    and only for loops of :data:`TRANSPOSE_FROM_STEPS` steps or more. float32 weights keep their layout:
    :func:`hfax.backends.jax.lowerings.linear` multiplies a few rows by them columns first, faster than
    from a copy, and a copy would defeat it (each step would transpose it back). A weight tied to another
    (an embedding that is also the output layer) keeps its layout, which its other use wants.
    """
    if model.platform != "cpu" or model.mesh is not None or steps < TRANSPOSE_FROM_STEPS:
        return frozenset()
    if not reads_16_bits(model) or rows < 8:
        return frozenset()
    uses = collections.Counter(
        id(tensor) for _, tensor in model.module.named_parameters(remove_duplicate=False)
    )
    return frozenset(
        f"{prefix}.weight"
        for prefix, module in model.module.named_modules()
        if isinstance(module, torch.nn.Linear)
        and f"{prefix}.weight" in model.params
        and uses[id(module.weight)] == 1
    )


def in_place_cache(model: Any, layer_types: Any, encoder_decoder: bool) -> bool:
    """Whether the slot cache updates in place: a decoder-only model whose layers all attend, on one
    device."""
    kinds = {kind for kind, _ in layer_types or ()}
    return model.mesh is None and not encoder_decoder and kinds <= set(slot_cache.ATTENTION_TYPES)
