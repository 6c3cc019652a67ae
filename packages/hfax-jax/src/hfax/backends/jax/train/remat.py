"""Per-layer rematerialisation (gradient checkpointing): each decoder layer's forward runs under
``jax.checkpoint``, so the backward pass recomputes a layer's activations instead of keeping them.

The layers are the classes transformers names in ``_no_split_modules`` (the blocks it never splits
across devices: ``LlamaDecoderLayer``, ``GPT2Block``, ...). Their ``forward`` is wrapped by a recorded
patch that does nothing unless a module with ``remat=True`` is being called.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax
import torch
from torch.utils import _pytree

from hfax.backends.jax.runtime import to_array, to_tensor
from hfax.patching import Patcher

_SLOT = "_hfax_remat_slot"


class _Slot:
    on = False


def layers(torch_module: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks of ``torch_module`` (by transformers' ``_no_split_modules``)."""
    names = set(getattr(torch_module, "_no_split_modules", None) or ())
    return [layer for layer in torch_module.modules() if type(layer).__name__ in names]


def install(torch_module: torch.nn.Module) -> None:
    """Patch every decoder block once; :func:`active` turns the checkpointing on."""
    if _SLOT in vars(torch_module):
        return
    blocks = layers(torch_module)
    if not blocks:
        raise ValueError(
            f"{type(torch_module).__name__} names no decoder layer class in _no_split_modules, so hfax "
            "cannot checkpoint its layers; train it with remat=False"
        )
    patcher = Patcher(torch_module)
    slot = _Slot()
    patcher.setattr(torch_module, _SLOT, slot)
    for block in blocks:
        patcher.bind(block, "forward", _checkpointed(block.forward, slot))


@contextlib.contextmanager
def active(torch_module: torch.nn.Module, on: bool) -> Iterator[None]:
    slot = vars(torch_module).get(_SLOT)
    if slot is None or not on:
        yield
        return
    slot.on = True
    try:
        yield
    finally:
        slot.on = False


def _checkpointed(original: Any, slot: _Slot) -> Any:
    def forward(block: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not slot.on:
            return original(*args, **kwargs)
        leaves, spec = _pytree.tree_flatten((args, kwargs))
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        structure: list[Any] = []

        def run(arrays: list[jax.Array]) -> list[jax.Array]:
            filled = list(leaves)
            for index, array in zip(where, arrays):
                filled[index] = to_tensor(array)
            inner_args, inner_kwargs = _pytree.tree_unflatten(filled, spec)
            out_leaves, out_spec = _pytree.tree_flatten(original(*inner_args, **inner_kwargs))
            structure[:] = [out_leaves, out_spec]
            return [
                to_array(leaf) if isinstance(leaf, torch.Tensor) else None for leaf in out_leaves
            ]

        # The block's weights are closed over: jax.checkpoint makes them inputs of the recomputation.
        arrays = jax.checkpoint(run)([to_array(leaves[index]) for index in where])
        out_leaves, out_spec = structure
        rebuilt = [
            to_tensor(array) if array is not None else leaf
            for leaf, array in zip(out_leaves, arrays)
        ]
        return _pytree.tree_unflatten(rebuilt, out_spec)

    return forward
