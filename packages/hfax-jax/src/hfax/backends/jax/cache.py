"""A KV cache driven entirely by tensors, so one compiled decode step serves every position.

transformers' ``StaticCache`` keeps Python ints beside its tensors (``StaticSlidingWindowLayer``'s
``cumulative_length_int``) and derives masks and positions from them: traced, they either recompile the
step at every token or, frozen, give wrong tokens. Here every layer is a pair of buffers written at a
traced slot with ``dynamic_update_slice``; which slots a query may see (causal, padding, sliding window)
is decided by the attention mask hfax builds (``hfax.masks``), and positions are passed explicitly. A
sliding layer keeps the full length: exact for any prompt and generation length, at the cost of the
memory a ring buffer would save.

Writing without copies. Inside the compiled decode loop a buffer is updated in place only if XLA can
see that every read of its old contents happens before the write. Two things defeat that: attention
reading the updated buffer (XLA:CPU then fuses the update into each reader and copies the buffer for
each), and reads of the old buffer that the write does not depend on (XLA then copies the buffer to keep
the old contents). Either way every buffer is copied several times per step: at long prompts as many
bytes as the weights. So ``update`` returns the updated buffers (correct for any attention) tagged with
what it wrote (:class:`Written`); hfax's attention (:func:`attend`) reads the buffers as they were plus
the new keys and values beside them, and the buffers the next step gets (``SlotCache.buffers``) are
written after the step's logits exist (:func:`ordered_after`). Keys are stored transposed, ``[batch,
kv_heads, head_dim, length]``, the layout in which ``q @ k^T`` reads them without a copy; values
``[batch, kv_heads, length, head_dim]``. The model sees both as ``[batch, kv_heads, length, head_dim]``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import torch
from hfax.backends.jax.runtime import torchax
from transformers.cache_utils import Cache, CacheLayerMixin

_WRITTEN = "_hfax_written"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Written:
    """What one ``SlotLayer.update`` did to one buffer: its contents before (``None`` when it was new) and
    the ``[batch, kv_heads, n, head_dim]`` states written from ``slot``."""

    before: Any
    states: Any
    slot: Any


def written(tensor: Any) -> Written | None:
    """The write behind a key or value tensor a ``SlotLayer`` returned, if ``tensor`` is one, unchanged."""
    return getattr(tensor, _WRITTEN, None)


def _tagged(tensor: torch.Tensor, write: Written) -> torch.Tensor:
    setattr(tensor, _WRITTEN, write)
    return tensor


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, written at ``cache.write_slot`` (a 0-d integer tensor)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: SlotCache, keys: Any = None, values: Any = None) -> None:
        super().__init__()
        self.cache = cache
        self.keys, self.values = keys, values  # as they were before this step's write
        self.is_initialized = keys is not None
        self.fresh = False
        self.states: tuple[Any, Any] | None = None  # this step's keys and values, written by `written`

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, length = *key_states.shape[:2], self.cache.length
        options = dict(dtype=self.cache.dtype or key_states.dtype, device=key_states.device)
        keys_shape = (length, key_states.shape[-1])[:: -1 if self.cache.in_place else 1]
        self.keys = torch.zeros((batch, heads, *keys_shape), **options)
        self.values = torch.zeros((batch, heads, length, value_states.shape[-1]), **options)
        self.is_initialized = self.fresh = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.states = (key_states, value_states)
        slot = self.cache.write_slot
        keys, values = self.written(slot)
        if not self.cache.in_place:
            self.keys, self.values, self.states = keys, values, None
            return keys, values
        return (
            _tagged(keys.transpose(2, 3), Written(None if self.fresh else self.keys, key_states, slot)),
            _tagged(values, Written(None if self.fresh else self.values, value_states, slot)),
        )

    def written(self, slot: torch.Tensor) -> tuple[Any, Any]:
        """The ``(keys, values)`` buffers with this step's states written from ``slot``."""
        if self.states is None:
            return self.keys, self.values
        key_states, value_states = self.states
        if self.cache.in_place:
            keys = _write(self.keys, key_states.transpose(2, 3), slot, axis=3)
        else:
            keys = _write(self.keys, key_states, slot, axis=2)
        return keys, _write(self.values, value_states, slot, axis=2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.length, 0

    def get_seq_length(self) -> Any:
        return self.cache.write_slot

    def get_max_length(self) -> int:
        return self.cache.length


def _write(buffer: torch.Tensor, states: torch.Tensor, slot: torch.Tensor, axis: int) -> torch.Tensor:
    """``states`` written into ``buffer`` from ``slot`` along ``axis``, as one in-place-able XLA update (no scatter)."""
    return torchax.interop.call_jax(
        lambda b, s, i: jax.lax.dynamic_update_slice_in_dim(b, s.astype(b.dtype), i, axis=axis), buffer, states, slot
    )


class SlotCache(Cache):
    """The cache hfax's compiled prefill and decode steps hand to a transformers model.

    ``in_place`` arranges the reads and writes for in-place updates and stores keys transposed (see the
    module's docstring). It is for one device: on a mesh, ordering the writes after the logits, regrouping
    heads and the transposed layout cost collectives; there keys are ``[batch, kv_heads, length,
    head_dim]`` and attention reads the updated buffers. ``dtype`` is the new buffers' type (``None``: the
    keys' and values' own; see :func:`buffer_dtype`).
    """

    def __init__(
        self,
        length: int,
        write_slot: torch.Tensor,
        buffers: list[tuple[Any, Any]] | None = None,
        in_place: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.length = length
        self.write_slot = write_slot
        self.in_place = in_place
        self.dtype = dtype
        if buffers is None:
            super().__init__(layer_class_to_replicate=lambda: SlotLayer(self))
        else:
            super().__init__(layers=[SlotLayer(self, keys, values) for keys, values in buffers])

    def buffers(self, after: torch.Tensor) -> list[tuple[Any, Any]]:
        """Every layer's ``(keys, values)`` buffers with this step's write, in layer order; when ``in_place``,
        written once ``after`` (the step's logits) is computed."""
        if not self.in_place:
            return [(layer.keys, layer.values) for layer in self.layers]
        slot = torchax.interop.call_jax(ordered_after, self.write_slot, after)
        return [layer.written(slot) for layer in self.layers]

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        return self.write_slot


def buffer_dtype(model_dtype: Any, platform: str) -> torch.dtype | None:
    """The type to keep keys and values in: float32 for a 16-bit model on CPU, else the model's (``None``).

    XLA:CPU multiplies 16-bit floats by converting both operands to float32; for attention that is the
    whole cache, every step: reading 2 bytes, writing 4 and reading them again per element, where a
    float32 cache is read once at 4. The values stored are the model's 16-bit ones, exactly.
    """
    if platform == "cpu" and jnp.issubdtype(model_dtype, jnp.floating) and jnp.finfo(model_dtype).bits < 32:
        return torch.float32
    return None


def ordered_after(index: jax.Array, value: jax.Array) -> jax.Array:
    """``index``, made to depend on every element of ``value``.

    XLA orders an in-place update after other reads of the buffer only when the update data-depends on
    them; ``min(i, i + isnan(any))`` is always ``i`` but cannot be computed before ``value``.
    """
    return jnp.minimum(index, index + jnp.isnan(value).any().astype(index.dtype))


def attention(query: torch.Tensor, key: Any, value: Any, mask: Any, scale: float) -> torch.Tensor | None:
    """:func:`attend` for torchax tensors, when ``key`` and ``value`` are what a ``SlotLayer`` returned and a mask
    is given; ``None`` otherwise (the caller attends over ``key`` and ``value`` as they are)."""
    keys, values = written(key), written(value)
    if keys is None or values is None or mask is None:
        return None
    return torchax.interop.call_jax(functools.partial(attend, scale=scale), query, keys, values, mask)


def attend(query: jax.Array, keys: Written, values: Written, mask: jax.Array, scale: float) -> jax.Array:
    """Attention of ``query`` over a slot cache write, reading no buffer the write produced.

    ``query`` is ``[batch, heads, q, head_dim]`` (a multiple of the key/value heads, grouped as transformers'
    ``repeat_kv`` groups them); ``keys``/``values`` hold JAX arrays; ``mask`` is additive and broadcasts to
    ``[batch, heads, q, length]``. The slots being written are read from the new states, the others from
    the buffers as they were. Returns ``[batch, heads, q, head_dim]``.
    """
    batch, heads, length_q, dim = query.shape
    new_keys, new_values, slot = keys.states, values.states, keys.slot
    kv_heads, written = new_keys.shape[1], new_keys.shape[2]
    groups = heads // kv_heads
    # Grouped heads share their key/value head: attend with [batch, kv_heads, groups * q] queries, no repeat.
    q = query.reshape(batch, kv_heads, groups * length_q, dim)
    if mask.dtype == jnp.bool_:
        mask = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
    mask = jnp.broadcast_to(mask, (batch, heads, length_q, mask.shape[-1])).reshape(batch, kv_heads, groups * length_q, -1)
    scores = [jnp.einsum("bkqd,bknd->bkqn", q, new_keys, preferred_element_type=jnp.float32) * scale
              + jax.lax.dynamic_slice_in_dim(mask, slot, written, axis=-1)]  # fmt: skip
    if keys.before is not None:
        slots = jnp.arange(mask.shape[-1])
        stale = (slots >= slot) & (slots < slot + written)  # what the buffers held there is being replaced
        old = jnp.einsum("bkqd,bkdl->bkql", q, keys.before, preferred_element_type=jnp.float32) * scale
        scores.insert(0, jnp.where(stale, jnp.finfo(jnp.float32).min, old + mask))
    weights = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(new_values.dtype)
    output = jnp.einsum("bkqn,bknd->bkqd", weights[..., -written:], new_values, preferred_element_type=jnp.float32)
    if values.before is not None:
        output += jnp.einsum("bkql,bkld->bkqd", weights[..., :-written], values.before, preferred_element_type=jnp.float32)
    return output.astype(query.dtype).reshape(batch, heads, length_q, dim)
