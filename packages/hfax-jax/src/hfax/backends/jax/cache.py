"""A cache driven entirely by tensors, so one compiled decode step serves every position.

transformers' ``StaticCache`` keeps Python ints beside its tensors (``StaticSlidingWindowLayer``'s
``cumulative_length_int``) and derives masks and positions from them: traced, they either recompile the
step at every token or, frozen, give wrong tokens. Here every attention layer is a ``[batch, kv_heads,
length, head_dim]`` buffer written at a traced slot with ``dynamic_update_slice``; which slots a query may
see (causal, padding, sliding window, chunk) is decided by the attention mask of ``hfax.masks``, and
positions are passed explicitly. A model given the 2-D mask (``hfax.masks.plan``) builds its masks itself:
the cache reports the write slot as the query offset and its whole length as the key length, which is what
transformers' mask functions need under ``jit``. A sliding layer keeps the full length: exact for any
prompt and generation length, at the cost of the memory a ring buffer would save.

The layers follow the model's config the way transformers' caches do (``get_layer_types_and_kwargs``):
attention layers get slot buffers, linear-attention layers (Mamba, convolutions, gated delta nets) their
fixed-size conv and recurrent states, hybrid layers both, and layers that read another layer's cache
nothing. Every layer's arrays travel between compiled steps as ``state()`` dicts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch
from hfax.backends.jax.runtime import torchax
from transformers import cache_utils
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, LinearAttentionLayer


class SlotLayer(CacheLayerMixin):
    """One attention layer's keys and values, written at ``cache.write_slot``."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: SlotCache, keys: Any = None, values: Any = None, is_sliding: bool = False) -> None:
        super().__init__()
        self.cache = cache
        self.is_sliding = is_sliding
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

    def state(self) -> dict[str, Any]:
        return {"keys": self.keys, "values": self.values} if self.is_initialized else {}


class SlotIndexedLayer(SlotLayer):
    """An attention layer of a sparse-attention model (DeepSeek V3.2, GLM DSA): it also keeps its indexer's
    keys, ``[batch, length, index_head_dim]``, written at the same slot."""

    def __init__(self, cache: SlotCache, keys: Any = None, values: Any = None, indexer_keys: Any = None) -> None:
        super().__init__(cache, keys, values)
        self.indexer_keys = indexer_keys

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        if self.indexer_keys is None:
            shape = (indexer_key_states.shape[0], self.cache.length, indexer_key_states.shape[-1])
            self.indexer_keys = torch.zeros(shape, dtype=indexer_key_states.dtype, device=indexer_key_states.device)
        self.indexer_keys = _write(self.indexer_keys, indexer_key_states, self.cache.write_slot, axis=1)
        return self.indexer_keys

    def state(self) -> dict[str, Any]:
        state = super().state()
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

    def lazy_initialization(self, conv_states: Any = None, recurrent_states: Any = None, state_idx: int = 0,
                            conv_kernel_size: int | None = None) -> None:  # fmt: skip
        # transformers' version marks static addresses for CUDA graphs, which torchax tensors do not have.
        if conv_states is not None:
            self.conv_kernel_size[state_idx] = conv_states.shape[-1] if conv_kernel_size is None else conv_kernel_size
            shape = (*conv_states.shape[:-1], self.conv_kernel_size[state_idx])
            self.conv_states[state_idx] = torch.zeros(shape, dtype=conv_states.dtype, device=conv_states.device)
            self.is_conv_states_initialized[state_idx] = True
        if recurrent_states is not None:
            self.recurrent_states[state_idx] = torch.zeros_like(recurrent_states)
            self.is_recurrent_states_initialized[state_idx] = True

    def update_conv_state(self, conv_states: Any, state_idx: int = 0, conv_kernel_size: int | None = None, **kwargs: Any) -> Any:
        if not self.is_conv_states_initialized[state_idx]:
            self.lazy_initialization(conv_states=conv_states, state_idx=state_idx, conv_kernel_size=conv_kernel_size)
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

    def update_recurrent_state(self, recurrent_states: Any, state_idx: int = 0, **kwargs: Any) -> Any:
        if not self.is_recurrent_states_initialized[state_idx]:
            self.lazy_initialization(recurrent_states=recurrent_states, state_idx=state_idx)
        self.recurrent_states[state_idx] = recurrent_states
        return recurrent_states

    def state(self) -> dict[str, Any]:
        return {
            kind: {i: s for i, s in getattr(self, f"{kind}_states").items() if getattr(self, f"is_{kind}_states_initialized")[i]}
            for kind in ("conv", "recurrent")
        }


class SlotHybridLayer(SlotLinearLayer, SlotLayer):
    """A layer with both attention (slot buffers) and linear-attention states."""

    def __init__(self, cache: SlotCache, number_of_states: int = 1, state: dict[str, Any] | None = None,
                 is_sliding: bool = False) -> None:  # fmt: skip
        state = dict(state or {})
        SlotLayer.__init__(self, cache, state.pop("keys", None), state.pop("values", None), is_sliding)
        SlotLinearLayer.__init__(self, number_of_states, state)

    def lazy_initialization(self, *args: Any, **kwargs: Any) -> None:
        if len(args) == 2:  # the attention path calls it with (keys, values)
            SlotLayer.lazy_initialization(self, *args)
        else:
            SlotLinearLayer.lazy_initialization(self, *args, **kwargs)

    def state(self) -> dict[str, Any]:
        return {**SlotLayer.state(self), **SlotLinearLayer.state(self)}


def _write(buffer: torch.Tensor, states: torch.Tensor, slot: Any, axis: int = 2) -> torch.Tensor:
    """``buffer[:, :, slot:slot + n] = states`` (along ``axis``) as one in-place-able XLA update (no scatter)."""
    return torchax.interop.call_jax(
        lambda b, s, i: jax.lax.dynamic_update_slice_in_dim(b, s.astype(b.dtype), i, axis=axis), buffer, states, slot
    )


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
    return tuple((kind, options.get("number_of_states", 1)) for kind, options in zip(types, kwargs)) or None


class SlotCache(Cache):
    """The cache hfax's compiled prefill and decode steps hand to a transformers model.

    ``write_slot`` is where this step's tokens go (a Python int for the prefill, which starts at 0, so
    models that branch on an empty cache can; a traced 0-d tensor when decoding). ``types`` come from
    :func:`layer_types`; ``states`` are the layers' ``state()`` from the previous step.
    """

    def __init__(self, length: int, write_slot: Any, types: tuple[tuple[str, int], ...] | None = None,
                 states: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.length = length
        self.write_slot = write_slot
        if types is None:
            if states is None:
                super().__init__(layer_class_to_replicate=lambda: SlotLayer(self))
            else:
                super().__init__(layers=[SlotLayer(self, s.get("keys"), s.get("values")) for s in states])
            return
        states = states if states is not None else [{}] * len(types)
        layers = [self._layer(kind, state, count) for (kind, count), state in zip(types, states)]
        super().__init__(layers=layers)

    def _layer(self, kind: str, state: dict[str, Any], number_of_states: int) -> Any:
        if kind in ATTENTION_TYPES:
            return SlotLayer(self, state.get("keys"), state.get("values"), is_sliding=ATTENTION_TYPES[kind])
        if kind in INDEXED_TYPES:
            return SlotIndexedLayer(self, state.get("keys"), state.get("values"), state.get("indexer_keys"))
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

    def states(self) -> list[dict[str, Any]]:
        """Every layer's arrays, in layer order (``{}`` for a layer that holds none)."""
        return [layer.state() if hasattr(layer, "state") else {} for layer in self.layers]

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        return self.write_slot

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.length, 0


#: Per-slot arrays of a layer state and their slot axis; other states (conv, recurrent) have no slots.
SLOT_AXES = {"keys": 2, "values": 2, "indexer_keys": 1}


def grow(states: list[dict[str, Any]], extra: int) -> list[dict[str, Any]]:
    """Layer states (JAX arrays) with ``extra`` empty slots appended to every per-slot array."""

    def pad(name: str, value: Any) -> Any:
        if name not in SLOT_AXES:
            return value
        widths = [(0, 0)] * value.ndim
        widths[SLOT_AXES[name]] = (0, extra)
        return jnp.pad(value, widths)

    return [{name: pad(name, value) for name, value in state.items()} for state in states]
