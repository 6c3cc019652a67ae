"""A KV cache driven entirely by tensors, so one compiled decode step serves every position.

transformers' ``StaticCache`` keeps Python ints beside its tensors (``StaticSlidingWindowLayer``'s
``cumulative_length_int``) and derives masks and positions from them: traced, they either recompile the
step at every token or, frozen, give wrong tokens. Here every layer is a ``[batch, kv_heads, length,
head_dim]`` buffer written at a traced slot with ``dynamic_update_slice``; which slots a query may see
(causal, padding, sliding window) is decided by the attention mask hfax builds (``hfax.masks``), and
positions are passed explicitly. A sliding layer keeps the full length: exact for any prompt and
generation length, at the cost of the memory a ring buffer would save.
"""

from __future__ import annotations

from typing import Any

import jax
import torch
from hfax.backends.jax.runtime import torchax
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, written at ``cache.write_slot`` (a 0-d integer tensor)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: SlotCache, keys: Any = None, values: Any = None) -> None:
        super().__init__()
        self.cache = cache
        self.keys, self.values = keys, values
        self.is_initialized = keys is not None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        shape = (batch, heads, self.cache.length)
        self.keys = torch.zeros(shape + key_states.shape[-1:], dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(shape + value_states.shape[-1:], dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = _write(self.keys, key_states, self.cache.write_slot)
        self.values = _write(self.values, value_states, self.cache.write_slot)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.length, 0

    def get_seq_length(self) -> Any:
        return self.cache.write_slot

    def get_max_length(self) -> int:
        return self.cache.length


def _write(buffer: torch.Tensor, states: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """``buffer[:, :, slot:slot + n] = states`` as one in-place-able XLA update (no scatter)."""
    return torchax.interop.call_jax(
        lambda b, s, i: jax.lax.dynamic_update_slice_in_dim(b, s.astype(b.dtype), i, axis=2), buffer, states, slot
    )


class SlotCache(Cache):
    """The cache hfax's compiled prefill and decode steps hand to a transformers model."""

    def __init__(self, length: int, write_slot: torch.Tensor, buffers: list[tuple[Any, Any]] | None = None) -> None:
        self.length = length
        self.write_slot = write_slot
        if buffers is None:
            super().__init__(layer_class_to_replicate=lambda: SlotLayer(self))
        else:
            super().__init__(layers=[SlotLayer(self, keys, values) for keys, values in buffers])

    def buffers(self) -> list[tuple[Any, Any]]:
        """Every layer's ``(keys, values)``, in layer order."""
        return [(layer.keys, layer.values) for layer in self.layers]

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        return self.write_slot
