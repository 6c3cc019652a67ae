"""ProphetNet's decoder over a static cache (``ProphetNetForCausalLM`` and the decoder of
``ProphetNetForConditionalGeneration``), on every backend.

transformers' ProphetNet decoder counts on a cache that holds exactly the tokens so far. It numbers
positions by index from the first column of the batch (padding included), and decoding it takes the new
token's position from the cache's length (cast with ``int()``: no traced count passes), builds its main
stream's relative-position buckets from each key's index in the cache, and applies no attention mask: a
decode step sees every column since the batch's first, padding included. A static cache holds the batch
behind its bucket's extra left padding, and slots not yet written. Here the decoder's 2-D padding mask
(one flag per cache slot) says where transformers' batch starts (the first real token of its widest row),
and the cache's length which slot the fed token fills; from those come the positions, the buckets and the
masks transformers computes, so tokens equal transformers' for a padded batch too.

The logits come from the first of the n-gram predicting streams, which attend to the main stream's keys:
their mask over the slots matters as much as the main stream's.

torch_xla's cache is full length from the prefill on, where transformers' prefill builds its masks for the
fed tokens and attends to the keys its cache returns: the prefill gets the fed tokens' columns of the mask
and of the cache (they fill the first slots). Under dynamo (torch_xla's decode step), which traces neither
``ContextVar.set`` nor a branch on a tensor, the values wait in a plain list, and transformers' decoder is
told a count of 1 for its ``count != 0`` branch (the layers read the true count).
"""

from __future__ import annotations

import contextvars
from typing import Any

from hfax.patches.longtail.fixed_count import fixed_count
from hfax.signatures import cache_keyword

#: During one decoder forward: its 2-D padding mask (``[batch, slots]``), its positions' padding index and
#: how many tokens its cache held before (the slot the fed token fills), for the layers below it.
_SLOTS: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hfax_prophetnet_slots", default=(None, 0, 0)
)


#: The same values while dynamo traces the decoder (torch_xla), innermost last: dynamo cannot trace
#: ``ContextVar.set``, but it traces a global list's appends, and it traces one frame at a time.
_TRACED: list[Any] = [(None, 0, 0)]


def _current() -> Any:
    import torch

    return _TRACED[-1] if torch.compiler.is_compiling() else _SLOTS.get()


def decoder_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``ProphetNetDecoder.forward``, with its padding mask and cache length visible to its position
    embedding and layers (read before its layers write the fed token)."""
    import torch

    name = cache_keyword(kwargs)  # the release's name for the cache, if one was passed
    cache = kwargs.get(name)
    if cache is not None and hasattr(cache, "self_attention_cache"):  # an encoder-decoder's
        cache = cache.self_attention_cache
    written = cache.get_seq_length() if cache is not None else 0
    padding_idx = self.position_embeddings.padding_idx
    slots = kwargs.get("attention_mask")
    fed = next(
        (
            kwargs[name].shape[1]
            for name in ("input_ids", "inputs_embeds")
            if kwargs.get(name) is not None
        ),
        None,
    )
    if _empty(written) and fed is not None and slots is not None:
        # A prefill into an empty full-length cache (torch_xla's): transformers builds its masks for the
        # fed tokens alone, which fill the first slots.
        kwargs["attention_mask"] = slots[:, :fed]
    if torch.compiler.is_compiling():
        outer = kwargs.get(name)
        if outer is not None and not isinstance(written, int):
            # A decode step's count is a tensor, and transformers branches on `count != 0`, which dynamo
            # cannot trace: the decoder gets the cache behind an object whose count is a nonzero int
            # (the layers below read the true count, taken above).
            kwargs[name] = fixed_count(outer, 1)
        _TRACED.append((slots, padding_idx, written))
        try:
            return type(self).forward(self, *args, **kwargs)
        finally:
            _TRACED.pop()
    token = _SLOTS.set((slots, padding_idx, written))
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _SLOTS.reset(token)


def _empty(written: Any) -> bool:
    # The cache held nothing before this forward: a prefill (a decode step's count is a tensor on a
    # compiled backend, a positive number in PyTorch).
    return isinstance(written, int) and written == 0


def _decoding(slots: Any, written: Any, queries: int) -> bool:
    # As transformers tells a decode step: one token fed to a cache already holding some (a traced count
    # on a compiled backend, a number in PyTorch).
    return slots is not None and queries == 1 and not _empty(written)


def _columns(slots: Any, written: Any) -> tuple[Any, Any, Any]:
    """``(slot numbers, the slot of transformers' first column, the fed token's slot)``: transformers'
    batch starts at the widest row's first real token (the mask marks every slot after the prompt)."""
    import torch

    valid = slots.bool()
    index = torch.arange(valid.shape[1], device=valid.device)
    first = torch.where(valid, index, valid.shape[1]).min()
    return index, first, written


def positional_forward(self: Any, inputs_shape: Any, device: Any, **kwargs: Any) -> Any:
    """``ProphetNetPositionalEmbeddings.forward``: transformers' positions (``padding_idx`` + 1 at its
    batch's first column), counted from the slots. (transformers passes the mask, the cache and the
    positions by keyword.)"""
    slots, _, written = _current()
    if slots is None or kwargs.get("position_ids") is not None:
        return type(self).forward(self, inputs_shape, device, **kwargs)
    index, first, last = _columns(slots, written)
    if _decoding(slots, written, inputs_shape[1]):
        positions = (last - first + 1 + self.padding_idx).reshape(1, 1)
    else:
        fed = index[: inputs_shape[1]]  # a prefill writes from the first slot
        positions = (fed - first + 1).clamp(min=0) + self.padding_idx
        positions = positions[None].expand(inputs_shape[0], -1)
    positions = positions.clamp(0, self.max_length - 1)
    return self._forward(positions), positions


class _Prefilled:
    """The self-attention cache as a prefill into an empty full-length cache hands it to
    ``ProphetNetNgramSelfAttention``: ``update`` writes the fed keys and values to the first slots, and
    returns those slots alone, as transformers' cache of the fed tokens would."""

    def __init__(self, cache: Any, fed: int) -> None:
        self.cache, self.fed = cache, fed

    def update(self, *args: Any, **kwargs: Any) -> Any:
        keys, values = self.cache.update(*args, **kwargs)
        return keys[:, :, : self.fed], values[:, :, : self.fed]


def ngram_attention_forward(
    self: Any,
    hidden_states: Any,
    attention_mask: Any = None,
    extended_predict_attention_mask: Any = None,
    main_relative_position_buckets: Any = None,
    predict_relative_position_buckets: Any = None,
    position_ids: Any = None,
    **kwargs: Any,
) -> Any:
    """``ProphetNetNgramSelfAttention.forward``: a decode step gets the buckets and the masks transformers'
    cache would give it, from the slots. (transformers' layer passes the cache by keyword, under the
    release's name for it.)"""
    slots, padding_idx, written = _current()
    name = cache_keyword(kwargs)
    batch, queries = hidden_states.shape[0], hidden_states.shape[1] // (1 + self.ngram)
    if (
        attention_mask is None
        and main_relative_position_buckets is None
        and _decoding(slots, written, queries)
    ):
        import torch
        from transformers.models.prophetnet.modeling_prophetnet import compute_relative_buckets

        index, first, last = _columns(slots, written)
        query = last - first + 1 + padding_idx  # transformers' position of the fed token
        keys = index - first + 1  # transformers' key numbers (its arange from 1)
        main = (keys - query).expand(batch, 1, -1)
        # The stream's keys: the main stream's, numbered from 0, then its own.
        predict = torch.cat([keys - 1, (last - first + 1).reshape(1)]) - query
        main_relative_position_buckets = compute_relative_buckets(
            self.num_buckets, self.relative_max_distance, main, False
        )
        predict_relative_position_buckets = compute_relative_buckets(
            self.num_buckets, self.relative_max_distance, predict.expand(batch, 1, -1), False
        )
        # Both streams see transformers' cache (padding and all), not the slots after it; the predicting
        # streams (whose first gives the logits) see their own key too.
        seen = (index >= first) & (index <= last)
        blocked = torch.finfo(hidden_states.dtype).min
        attention_mask = torch.where(seen, 0.0, blocked).to(hidden_states.dtype)[None, None, None]
        own = torch.zeros((1, 1, 1, 1), dtype=attention_mask.dtype, device=attention_mask.device)
        extended_predict_attention_mask = torch.cat([attention_mask, own], dim=-1)[None]
    elif name is not None and _empty(written) and slots is not None:
        cache = getattr(kwargs[name], "self_attention_cache", kwargs[name])
        kwargs[name] = _Prefilled(cache, queries)
    return type(self).forward(
        self,
        hidden_states,
        attention_mask=attention_mask,
        extended_predict_attention_mask=extended_predict_attention_mask,
        main_relative_position_buckets=main_relative_position_buckets,
        predict_relative_position_buckets=predict_relative_position_buckets,
        position_ids=position_ids,
        **kwargs,
    )


#: class name -> (method, its replacement)
PATCHES = {
    "ProphetNetDecoder": ("forward", decoder_forward),
    "ProphetNetPositionalEmbeddings": ("forward", positional_forward),
    "ProphetNetNgramSelfAttention": ("forward", ngram_attention_forward),
}
