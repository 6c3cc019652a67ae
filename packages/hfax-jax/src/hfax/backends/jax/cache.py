"""A cache driven entirely by tensors, so one compiled decode step serves every position.

transformers' ``StaticCache`` keeps Python ints beside its tensors (``StaticSlidingWindowLayer``'s
``cumulative_length_int``) and derives masks and positions from them: traced, they either recompile the
step at every token or, frozen, give wrong tokens. Here every attention layer is a ``[batch, kv_heads,
length, head_dim]`` buffer written at a traced slot with ``dynamic_update_slice``; which slots a query may
see (causal, padding, sliding window, chunk) is decided by the attention mask of ``hfax.masks``, and
positions are passed explicitly. A model given the 2-D mask (``hfax.masks.form``) builds its masks itself:
the cache reports the write slot as the query offset and its whole length as the key length, which is what
transformers' mask functions need under ``jit``. A sliding layer keeps the full length: exact for any
prompt and generation length, at the cost of the memory a ring buffer would save.

The layers follow the model's config the way transformers' caches do (``get_layer_types_and_kwargs``):
attention layers get slot buffers, linear-attention layers (Mamba, convolutions, gated delta nets) their
fixed-size conv and recurrent states, hybrid layers both, and layers that read another layer's cache
nothing. Every layer's arrays travel between compiled steps as ``state()`` dicts.

Writing without copies (decoder-only models whose layers are all attention, on one device). Inside the compiled decode loop a buffer is updated in place only if XLA can
see that every read of its old contents happens before the write. Two things defeat that: attention
reading the updated buffer (XLA:CPU then fuses the update into each reader and copies the buffer for
each), and reads of the old buffer that the write does not depend on (XLA then copies the buffer to keep
the old contents). Either way every buffer is copied several times per step: at long prompts as many
bytes as the weights. So ``update`` returns the updated buffers (correct for any attention) tagged with
what it wrote (:class:`Written`); hfax's attention (:func:`hfax.backends.jax.attention.attend`) reads the buffers as they were plus
the new keys and values beside them, and the buffers the next step gets (``SlotCache.buffers``) are
written after the step's logits exist (:func:`ordered_after`). Keys are stored transposed, ``[batch,
kv_heads, head_dim, length]``, the layout in which ``q @ k^T`` reads them without a copy; values
``[batch, kv_heads, length, head_dim]``. The model sees both as ``[batch, kv_heads, length, head_dim]``.
"""

from __future__ import annotations

import dataclasses
import operator
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch
from transformers import cache_utils
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, LinearAttentionLayer

from hfax.backends.jax.runtime import env, torchax

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


_ONE_SLOT = "_hfax_one_slot"


def one_slot(tensor: Any) -> Any:
    """The slot a ``SlotLayer`` wrote one key or value into, where ``tensor`` is a buffer it returned with
    that write done (not in place; ``None`` otherwise): where a decode step's one query sits."""
    return getattr(tensor, _ONE_SLOT, None)


def _comparison(op: Callable[[int, int], bool], traced: Any) -> Any:
    def compare(self: CacheLength, other: Any) -> Any:
        return self._compared(other, op, traced)

    return compare


class CacheLength(torchax.tensor.Tensor):
    """How many tokens a slot cache held before this decode step (``get_seq_length()``): a traced count
    whose offsets stay static.

    Some models count positions from it instead of taking ``position_ids`` (MVP, TrOCR, RoFormer:
    ``torch.arange(past, past + n)``), check it against a table's size (XGLM, M2M-100) or clip an index
    with it (MPT: ``max(0, n - past)``): on a plain traced count the range has no static length and the
    check no value, so tracing fails. Here the value is ``sign * slot + offset`` with ``sign`` and
    ``offset`` static: adding or subtracting a Python int, or negating, keeps that form; ``torch.arange``
    between two counts of one step has the static length of their offsets' difference; a comparison with a
    number that holds (or fails) for every value the count can take is a concrete value. ``bounds`` are
    those values: the cache holds at least one token (a traced count only comes after a prefill) and
    fewer than its slots. Anything else computes on the count as the tensor it is.
    """

    def __new__(
        cls, slot: jax.Array, offset: int, bounds: tuple[int, int], sign: int = 1
    ) -> CacheLength:
        value = slot if sign == 1 else -slot
        value = value + offset if offset else value
        length = torchax.tensor.Tensor.__new__(cls, value, env())
        length._elem, length._env = value, env()
        length.slot, length.offset, length.bounds, length.sign = slot, offset, bounds, sign
        return length

    def __init__(self, *args: Any) -> None:  # everything is set in __new__
        pass

    __hash__ = torchax.tensor.Tensor.__hash__

    def _shifted(self, n: int) -> CacheLength:
        least, most = self.bounds
        return CacheLength(self.slot, self.offset + n, (least + n, most + n), self.sign)

    def __neg__(self) -> CacheLength:
        least, most = self.bounds
        return CacheLength(self.slot, -self.offset, (-most, -least), -self.sign)

    def __add__(self, other: Any) -> Any:
        return self._shifted(other) if _is_int(other) else super().__add__(other)

    def __radd__(self, other: Any) -> Any:
        return self._shifted(other) if _is_int(other) else super().__radd__(other)

    def __sub__(self, other: Any) -> Any:
        return self._shifted(-other) if _is_int(other) else super().__sub__(other)

    def __rsub__(self, other: Any) -> Any:
        return (-self)._shifted(other) if _is_int(other) else super().__rsub__(other)

    def range_to(self, end: Any, step: Any = None, *, dtype: Any = None, **_: Any) -> Any:
        """``torch.arange(self, end)`` when ``end`` is this count plus a number; ``None`` otherwise."""
        if (
            not isinstance(end, CacheLength)
            or end.slot is not self.slot
            or end.sign != self.sign
            or step not in (None, 1)
        ):
            return None
        values = self._elem + jnp.arange(max(end.offset - self.offset, 0), dtype=self._elem.dtype)
        result = env().j2t_iso(values)
        return result.to(dtype) if dtype is not None else result

    def _compared(self, other: Any, op: Callable[[int, int], bool], traced: Any) -> Any:
        """``op(self, other)``: a concrete value when it is the same for every value the count can take
        (comparisons are monotone but for equality, so the bounds and ``other`` itself decide it)."""
        if _is_int(other):
            least, most = self.bounds
            results = {op(value, other) for value in (least, most, min(max(other, least), most))}
            if len(results) == 1:
                with jax.ensure_compile_time_eval():  # a concrete value, also inside `jit`
                    return env().j2t_iso(jnp.asarray(results.pop()))
        return traced(self, other)

    __gt__ = _comparison(operator.gt, torchax.tensor.Tensor.__gt__)
    __ge__ = _comparison(operator.ge, torchax.tensor.Tensor.__ge__)
    __lt__ = _comparison(operator.lt, torchax.tensor.Tensor.__lt__)
    __le__ = _comparison(operator.le, torchax.tensor.Tensor.__le__)
    __eq__ = _comparison(operator.eq, torchax.tensor.Tensor.__eq__)  # type: ignore[assignment]
    __ne__ = _comparison(operator.ne, torchax.tensor.Tensor.__ne__)  # type: ignore[assignment]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def seq_length(slot: Any, length: int) -> Any:
    """What ``get_seq_length()`` returns for a cache of ``length`` slots written from ``slot``: the prefill's
    Python int as it is, a decode step's traced slot as a :class:`CacheLength`."""
    if isinstance(slot, int):
        return slot
    return CacheLength(env().t2j_iso(slot), 0, (1, length - 1))


class SlotLayer(CacheLayerMixin):
    """One attention layer's keys and values, written at ``cache.write_slot``."""

    is_compileable = True
    is_sliding = False

    def __init__(
        self, cache: SlotCache, keys: Any = None, values: Any = None, is_sliding: bool = False
    ) -> None:
        super().__init__()
        self.cache = cache
        self.is_sliding = is_sliding
        self.keys, self.values = keys, values  # as they were before this step's write
        self.is_initialized = keys is not None
        self.fresh = False
        self.states: tuple[Any, Any] | None = (
            None  # this step's keys and values, written by `written`
        )

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, length = *key_states.shape[:2], self.cache.length
        options = dict(dtype=self.cache.dtype or key_states.dtype, device=key_states.device)
        keys_shape = (length, key_states.shape[-1])[:: -1 if self.cache.in_place else 1]
        # HFAX_POISON_EMPTY_SLOTS (an audit, not for use): slots not yet written hold large values instead
        # of zeros, so a model that attends to them (a mask it drops) changes its tokens for certain.
        empty = 1e3 if os.environ.get("HFAX_POISON_EMPTY_SLOTS") else 0.0
        self.keys = torch.full((batch, heads, *keys_shape), empty, **options)
        self.values = torch.full((batch, heads, length, value_states.shape[-1]), empty, **options)
        self.is_initialized = self.fresh = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slot = self.cache.write_slot
        if self.cache.kept is not None:
            keys_axis = 3 if self.cache.in_place else 2
            key_states = _keeping(self.keys, key_states, slot, self.cache.kept, keys_axis)
            value_states = _keeping(self.values, value_states, slot, self.cache.kept, 2)
        self.states = (key_states, value_states)
        keys, values = self.written(slot)
        if not self.cache.in_place:
            self.keys, self.values, self.states = keys, values, None
            if key_states.shape[2] == 1:
                setattr(keys, _ONE_SLOT, slot)
            return keys, values
        return (
            _tagged(
                keys.transpose(2, 3), Written(None if self.fresh else self.keys, key_states, slot)
            ),
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
        return seq_length(self.cache.write_slot, self.cache.length)

    def get_max_length(self) -> int:
        return self.cache.length

    def state(self, slot: Any = None) -> dict[str, Any]:
        """The buffers with this step's write (from ``slot``, default the cache's write slot)."""
        if not self.is_initialized:
            return {}
        keys, values = self.written(self.cache.write_slot if slot is None else slot)
        return {"keys": keys, "values": values}


class SlotIndexedLayer(SlotLayer):
    """An attention layer of a sparse-attention model (DeepSeek V3.2, GLM DSA): it also keeps its indexer's
    keys, ``[batch, length, index_head_dim]``, written at the same slot."""

    def __init__(
        self, cache: SlotCache, keys: Any = None, values: Any = None, indexer_keys: Any = None
    ) -> None:
        super().__init__(cache, keys, values)
        self.indexer_keys = indexer_keys

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        if self.indexer_keys is None:
            shape = (indexer_key_states.shape[0], self.cache.length, indexer_key_states.shape[-1])
            self.indexer_keys = torch.zeros(
                shape, dtype=indexer_key_states.dtype, device=indexer_key_states.device
            )
        self.indexer_keys = _write(
            self.indexer_keys, indexer_key_states, self.cache.write_slot, axis=1
        )
        return self.indexer_keys

    def state(self, slot: Any = None) -> dict[str, Any]:
        state = super().state(slot)
        return state if self.indexer_keys is None else {**state, "indexer_keys": self.indexer_keys}


class SlotLinearLayer(LinearAttentionLayer):
    """A linear-attention layer's conv and recurrent states (fixed size: replaced, not written at a slot).

    transformers' ``LinearAttentionLayer`` with its states passed in and out: a layer rebuilt from the
    state of an earlier step has a previous state, which is what its model branches on.
    """

    def __init__(self, number_of_states: int = 1, state: dict[str, Any] | None = None) -> None:
        super().__init__(number_of_states=number_of_states)
        for kind, states in (state or {}).items():
            for index, value in states.items():
                getattr(self, f"{kind}_states")[index] = value
                getattr(self, f"is_{kind}_states_initialized")[index] = True
                self.has_previous_state[index] = True

    def lazy_initialization(
        self,
        conv_states: Any = None,
        recurrent_states: Any = None,
        state_idx: int = 0,
        conv_kernel_size: int | None = None,
    ) -> None:
        # transformers' version marks static addresses for CUDA graphs, which torchax tensors do not have.
        if conv_states is not None:
            self.conv_kernel_size[state_idx] = (
                conv_states.shape[-1] if conv_kernel_size is None else conv_kernel_size
            )
            shape = (*conv_states.shape[:-1], self.conv_kernel_size[state_idx])
            self.conv_states[state_idx] = torch.zeros(
                shape, dtype=conv_states.dtype, device=conv_states.device
            )
            self.is_conv_states_initialized[state_idx] = True
        if recurrent_states is not None:
            self.recurrent_states[state_idx] = torch.zeros_like(recurrent_states)
            self.is_recurrent_states_initialized[state_idx] = True

    def update_conv_state(
        self,
        conv_states: Any,
        state_idx: int = 0,
        conv_kernel_size: int | None = None,
        **kwargs: Any,
    ) -> Any:
        if not self.is_conv_states_initialized[state_idx]:
            self.lazy_initialization(
                conv_states=conv_states, state_idx=state_idx, conv_kernel_size=conv_kernel_size
            )
        if self.conv_kernel_size[state_idx] is None:
            self.conv_kernel_size[state_idx] = self.conv_states[state_idx].shape[-1]
        if not self.has_previous_state[state_idx]:
            self.has_previous_state[state_idx] = True
            full = conv_states
            missing = self.conv_kernel_size[state_idx] - full.shape[-1]
            if missing > 0:
                full = torch.nn.functional.pad(full, (missing, 0))
        else:
            full = torch.cat([self.conv_states[state_idx], conv_states], dim=-1)
        self.conv_states[state_idx] = full[..., -self.conv_kernel_size[state_idx] :]
        return full

    def update_recurrent_state(
        self, recurrent_states: Any, state_idx: int = 0, **kwargs: Any
    ) -> Any:
        if not self.is_recurrent_states_initialized[state_idx]:
            self.lazy_initialization(recurrent_states=recurrent_states, state_idx=state_idx)
        self.recurrent_states[state_idx] = recurrent_states
        return recurrent_states

    def state(self, slot: Any = None) -> dict[str, Any]:
        return {
            kind: {
                i: s
                for i, s in getattr(self, f"{kind}_states").items()
                if getattr(self, f"is_{kind}_states_initialized")[i]
            }
            for kind in ("conv", "recurrent")
        }


class SlotHybridLayer(SlotLinearLayer, SlotLayer):
    """A layer with both attention (slot buffers) and linear-attention states."""

    def __init__(
        self,
        cache: SlotCache,
        number_of_states: int = 1,
        state: dict[str, Any] | None = None,
        is_sliding: bool = False,
    ) -> None:
        state = dict(state or {})
        SlotLayer.__init__(
            self, cache, state.pop("keys", None), state.pop("values", None), is_sliding
        )
        SlotLinearLayer.__init__(self, number_of_states, state)

    def lazy_initialization(self, *args: Any, **kwargs: Any) -> None:
        if len(args) == 2:  # the attention path calls it with (keys, values)
            SlotLayer.lazy_initialization(self, *args)
        else:
            SlotLinearLayer.lazy_initialization(self, *args, **kwargs)

    def state(self, slot: Any = None) -> dict[str, Any]:
        return {**SlotLayer.state(self, slot), **SlotLinearLayer.state(self)}


def _write(buffer: torch.Tensor, states: torch.Tensor, slot: Any, axis: int = 2) -> torch.Tensor:
    """``buffer[:, :, slot:slot + n] = states`` (along ``axis``) as one in-place-able XLA update (no scatter)."""
    return torchax.interop.call_jax(
        lambda b, s, i: jax.lax.dynamic_update_slice_in_dim(b, s.astype(b.dtype), i, axis=axis),
        buffer,
        states,
        slot,
    )


def _keeping(buffer: torch.Tensor, states: torch.Tensor, slot: int, kept: Any, axis: int) -> Any:
    """``states`` ``[batch, kv_heads, n, head_dim]`` with the ``kept`` (``[n]``, or ``[batch, n]`` per row)
    of its ``n`` slots replaced by what ``buffer`` holds there (its slots along ``axis``: 3 for keys
    stored transposed)."""

    def keep(b: jax.Array, s: jax.Array, k: jax.Array) -> jax.Array:
        held = jax.lax.dynamic_slice_in_dim(b, slot, s.shape[2], axis=axis)
        held = jnp.swapaxes(held, 2, 3) if axis == 3 else held
        k = k[:, None, :, None] if k.ndim == 2 else k[None, None, :, None]
        return jnp.where(k, held.astype(s.dtype), s)

    return torchax.interop.call_jax(keep, buffer, states, kept)


#: transformers' cache layer types (``get_layer_types_and_kwargs``) by the kind of slot layer that holds them.
ATTENTION_TYPES = {"full_attention": False, "sliding_attention": True, "chunked_attention": True}
INDEXED_TYPES = {"indexed_attention"}
LINEAR_TYPES = {"conv", "linear_attention"}
HYBRID_TYPES = {"hybrid": False, "hybrid_sliding": True}


def layer_types(config: Any) -> tuple[tuple[str, int], ...] | None:
    """``(cache layer type, number of linear-attention states)`` for every layer of ``config``'s decoder.

    ``None`` where the config does not say; the cache then makes attention layers as the model uses them.
    """
    try:
        types, kwargs = cache_utils.get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception:  # noqa: BLE001 - configs without per-layer information
        return None
    return (
        tuple((kind, options.get("number_of_states", 1)) for kind, options in zip(types, kwargs))
        or None
    )


class SlotCache(Cache):
    """The cache hfax's compiled prefill and decode steps hand to a transformers model.

    ``write_slot`` is where this step's tokens go (a Python int for the prefill, which starts at 0, so
    models that branch on an empty cache can; a traced 0-d tensor when decoding). ``types`` come from
    :func:`layer_types`; ``states`` are the layers' ``state()`` from the previous step.

    ``in_place`` arranges the reads and writes for in-place updates and stores keys transposed (see the
    module's docstring): for decoder-only models whose layers are all attention, on one device (on a mesh,
    ordering the writes after the logits, regrouping heads and the transposed layout cost collectives).
    Otherwise keys are ``[batch, kv_heads, length, head_dim]`` and attention reads the updated buffers.
    ``dtype`` is the new buffers' type (``None``: the keys' and values' own; see :func:`buffer_dtype`).
    ``kept`` (bool ``[n]`` over the ``n`` slots a forward writes, ``[batch, n]`` per row, or ``None``)
    marks the slots whose keys and values stay what the layers held: attention reads those, the write
    leaves them (a prefill after a caller's loaded cache feeds a length bucket of columns, the cached
    ones among them only to fill it; a serve prefill after a stored prefix, the prefix's tokens that lie
    among its padding columns).
    """

    def __init__(
        self,
        length: int,
        write_slot: Any,
        types: tuple[tuple[str, int], ...] | None = None,
        states: list[dict[str, Any]] | None = None,
        in_place: bool = False,
        dtype: torch.dtype | None = None,
        kept: Any = None,
    ) -> None:
        self.length = length
        self.write_slot = write_slot
        self.kept = kept
        self.in_place = in_place
        self.dtype = dtype
        if types is None:
            if states is None:
                super().__init__(layer_class_to_replicate=lambda: SlotLayer(self))
            else:
                super().__init__(
                    layers=[SlotLayer(self, s.get("keys"), s.get("values")) for s in states]
                )
            return
        states = states if states is not None else [{}] * len(types)
        layers = [self._layer(kind, state, count) for (kind, count), state in zip(types, states)]
        super().__init__(layers=layers)

    def _layer(self, kind: str, state: dict[str, Any], number_of_states: int) -> Any:
        if kind in ATTENTION_TYPES:
            return SlotLayer(
                self, state.get("keys"), state.get("values"), is_sliding=ATTENTION_TYPES[kind]
            )
        if kind in INDEXED_TYPES:
            return SlotIndexedLayer(
                self, state.get("keys"), state.get("values"), state.get("indexer_keys")
            )
        if kind in LINEAR_TYPES:
            return SlotLinearLayer(number_of_states, state)
        if kind in HYBRID_TYPES:
            return SlotHybridLayer(self, number_of_states, state, is_sliding=HYBRID_TYPES[kind])
        if kind == "dummy":
            return DummyLayer()
        raise NotImplementedError(
            f"hfax's slot cache has no layer for transformers' cache layer type {kind!r}; supported: "
            f"{sorted([*ATTENTION_TYPES, *INDEXED_TYPES, *LINEAR_TYPES, *HYBRID_TYPES, 'dummy'])}"
        )

    def states(self, after: Any = None) -> list[dict[str, Any]]:
        """Every layer's arrays with this step's writes, in layer order (``{}`` for a layer that holds none);
        when ``in_place``, written once ``after`` (the step's logits) is computed."""
        slot = self.write_slot
        if self.in_place and after is not None:
            slot = torchax.interop.call_jax(ordered_after, slot, after)
        return [layer.state(slot) if hasattr(layer, "state") else {} for layer in self.layers]

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        return seq_length(self.write_slot, self.length)

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.length, 0


#: Per-slot arrays of a layer state and their slot axis; other states (conv, recurrent) have no slots.
SLOT_AXES = {"keys": 2, "values": 2, "indexer_keys": 1}


def grow(states: list[dict[str, Any]], extra: int, in_place: bool = False) -> list[dict[str, Any]]:
    """Layer states (JAX arrays) with ``extra`` empty slots appended to every per-slot array (``in_place``:
    keys stored transposed, their slots last)."""
    axes = {**SLOT_AXES, "keys": 3} if in_place else SLOT_AXES

    def pad(name: str, value: Any) -> Any:
        if name not in axes:
            return value
        widths = [(0, 0)] * value.ndim
        widths[axes[name]] = (0, extra)
        return jnp.pad(value, widths)

    return [{name: pad(name, value) for name, value in state.items()} for state in states]


def buffer_dtype(model_dtype: Any, platform: str) -> torch.dtype | None:
    """The type to keep keys and values in: float32 for a 16-bit model on CPU, else the model's (``None``).

    XLA:CPU multiplies 16-bit floats by converting both operands to float32; for attention that is the
    whole cache, every step: reading 2 bytes, writing 4 and reading them again per element, where a
    float32 cache is read once at 4. The values stored are the model's 16-bit ones, exactly.
    """
    if (
        platform == "cpu"
        and jnp.issubdtype(model_dtype, jnp.floating)
        and jnp.finfo(model_dtype).bits < 32
    ):
        return torch.float32
    return None


def ordered_after(index: jax.Array, value: jax.Array) -> jax.Array:
    """``index``, made to depend on ``value``.

    XLA orders an in-place update after other reads of the buffer only when the update data-depends on
    them; ``min(i, i + isnan(any))`` is always ``i`` but cannot be computed before ``value``. A value
    computed from every read suffices, however small: the decode step passes one vocabulary column of
    the logits, which needs the whole last hidden state, rather than a pass over every logit.
    """
    index = jnp.asarray(index, jnp.int32)  # a traced slot, or the prefill's 0
    return jnp.minimum(index, index + jnp.isnan(value).any().astype(index.dtype))
