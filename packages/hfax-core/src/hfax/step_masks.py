"""Decoders that apply no attention mask to a one-token step (LED's), given one over a static cache, on
every backend.

transformers' LED decoder builds its causal mask only when it is fed more than one token: a decode step
then attends to every key the cache returns. transformers' dynamic cache returns exactly the tokens so
far, so that is right there. hfax's static cache returns all its slots, the ones not yet written (and a
padded batch's padding) among them, and attending to those changes the tokens. hfax passes the decoder a
mask over the slots (``[batch, 1, queries, slots]``, or 2-D with one flag per slot); here a one-token
step's self-attention gets it as the additive mask the layers take for longer steps.
"""

from __future__ import annotations

from typing import Any

from hfax.signatures import cache_keyword

#: The attribute of a decoder's self-attention modules that holds, during one decoder forward, the
#: decoder's mask over the cache's slots (2-D or 4-D) and how many slots the cache had written before it
#: (:func:`written`). An attribute rather than a context variable: torch_xla's dynamo bridge traces
#: attribute writes and not ``ContextVar.set``.
SLOTS = "_hfax_step_mask"


def decoder_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``LEDDecoder.forward``, its ``attention_mask`` visible to its self-attention layers."""
    layers = [layer.self_attn for layer in self.layers]
    over_slots = (kwargs.get("attention_mask"), written(kwargs.get(cache_keyword(kwargs))))
    for attention in layers:
        object.__setattr__(attention, SLOTS, over_slots)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        for attention in layers:
            object.__setattr__(attention, SLOTS, None)


def written(cache: Any) -> Any:
    """How many slots of the decoder's self-attention ``cache`` hold tokens before this step (the slot the
    step's token fills): read before the first layer writes, or ``None`` without a cache."""
    if cache is None:
        return None
    cache = getattr(cache, "self_attention_cache", cache)  # an encoder-decoder's
    return cache.get_seq_length()


def additive(over_slots: Any, queries: int, dtype: Any) -> Any:
    """``(mask, written)``, a mask over a static cache's slots and :func:`written`, as an additive
    ``[batch, 1, queries, slots]`` mask of ``dtype``: a 4-D mask as it is (boolean or additive); a 2-D one
    (a flag per slot: not padding, whether written yet or not) for a one-token step, which sees the
    written slots and its own. ``None`` for anything else."""
    import torch

    slots, count = over_slots if over_slots is not None else (None, None)
    if slots is None or slots.dim() not in (2, 4):
        return None
    if slots.dim() == 2:
        if queries != 1 or count is None:
            return None
        filled = torch.arange(slots.shape[1], device=slots.device) <= count
        slots = (slots.bool() & filled)[:, None, None, :]
    if not slots.is_floating_point():  # True where a query may look
        slots = torch.where(slots.bool(), 0.0, torch.finfo(dtype).min)
    return slots.to(dtype)


def self_attention_forward(self: Any, hidden_states: Any, key_value_states: Any = None,
                           attention_mask: Any = None, **kwargs: Any) -> Any:  # fmt: skip
    """``LEDDecoderAttention.forward``: on a one-token self-attention step with no mask, the decoder's
    mask over the slots, as an additive ``[batch, 1, 1, slots]`` mask. (LED's layers pass the cache by
    keyword, under the release's name for it.)"""
    slots = getattr(self, SLOTS, None)
    if attention_mask is None and key_value_states is None and cache_keyword(kwargs) is not None:
        attention_mask = additive(slots, hidden_states.shape[1], hidden_states.dtype)
    return type(self).forward(
        self,
        hidden_states,
        key_value_states=key_value_states,
        attention_mask=attention_mask,
        **kwargs,
    )


#: transformers' classes whose one-token steps are given the mask: class name -> (method, replacement).
STEPS = {
    "LEDDecoder": ("forward", decoder_forward),
    "LEDDecoderAttention": ("forward", self_attention_forward),
}
