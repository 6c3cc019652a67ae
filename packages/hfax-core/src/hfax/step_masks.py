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

#: The attribute of a decoder's self-attention modules that holds, during one decoder forward, the
#: decoder's mask over the cache's slots (2-D or 4-D). An attribute rather than a context variable:
#: torch_xla's dynamo bridge traces attribute writes and not ``ContextVar.set``.
_SLOTS = "_hfax_step_mask"


def decoder_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``LEDDecoder.forward``, its ``attention_mask`` visible to its self-attention layers."""
    layers = [layer.self_attn for layer in self.layers]
    for attention in layers:
        object.__setattr__(attention, _SLOTS, kwargs.get("attention_mask"))
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        for attention in layers:
            object.__setattr__(attention, _SLOTS, None)


def self_attention_forward(self: Any, hidden_states: Any, key_value_states: Any = None,
                           past_key_values: Any = None, attention_mask: Any = None,
                           **kwargs: Any) -> Any:  # fmt: skip
    """``LEDDecoderAttention.forward``: on a one-token self-attention step with no mask, the decoder's
    mask over the slots, as an additive ``[batch, 1, 1, slots]`` mask."""
    slots = getattr(self, _SLOTS, None)
    if (
        attention_mask is None
        and key_value_states is None
        and past_key_values is not None
        and slots is not None
        and slots.dim() in (2, 4)
        and hidden_states.shape[1] == 1
    ):
        import torch

        if slots.dim() == 2:  # one flag per slot
            slots = slots[:, None, None, :].bool()
        if not slots.is_floating_point():  # True where a query may look
            lowest = torch.finfo(hidden_states.dtype).min
            slots = torch.where(slots.bool(), 0.0, lowest)
        attention_mask = slots.to(hidden_states.dtype)
    return type(self).forward(
        self, hidden_states, key_value_states, past_key_values, attention_mask, **kwargs
    )


#: transformers' classes whose one-token steps are given the mask: class name -> (method, replacement).
STEPS = {
    "LEDDecoder": ("forward", decoder_forward),
    "LEDDecoderAttention": ("forward", self_attention_forward),
}
