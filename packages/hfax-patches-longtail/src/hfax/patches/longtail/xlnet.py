"""XLNet's memory, kept with a slice whose start is clamped to the tensor, on torch_xla.

PyTorch clamps a slice's start to the tensor: ``x[-512:]`` of a 10-row ``x`` is all 10 rows. torch_xla 2.9
refuses it, eager and compiled alike ("Value out of range (expected to be in range of [-10, 9], but got
-512)"). XLNet's ``cache_mem`` keeps the last ``mem_len`` (512 by default) hidden states of every layer
that way, on every forward: without this, no XLNet model runs on torch_xla. The JAX backend clamps as
PyTorch does, so it keeps transformers' code.
"""

from __future__ import annotations

from typing import Any

import torch

#: The backends whose models get :data:`PATCHES`.
BACKENDS = ("torch_xla",)


def cache_mem(self: Any, curr_out: torch.Tensor, prev_mem: torch.Tensor | None) -> torch.Tensor:
    """XLNet's ``cache_mem``: the last ``mem_len`` positions of the previous memory and this layer's output
    (all of them when ``mem_len`` is unset), with the slice's start clamped as PyTorch clamps it."""
    if self.reuse_len is not None and self.reuse_len > 0:
        curr_out = curr_out[: self.reuse_len]
    held = curr_out if prev_mem is None else torch.cat([prev_mem, curr_out], dim=0)
    kept = held.shape[0] if not self.mem_len else min(self.mem_len, held.shape[0])
    return held[held.shape[0] - kept :].detach()


#: class name -> (method, its replacement)
PATCHES = {"XLNetModel": ("cache_mem", cache_mem)}
