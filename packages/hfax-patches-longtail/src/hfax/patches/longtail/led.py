"""LED (Longformer's encoder in an encoder-decoder), with static shapes on every backend.

- Its encoder copies Longformer's attention: :mod:`hfax.patches.longtail.longformer` runs its layers.
- Its decoder's learned positions count from the cache's length: :mod:`hfax.patches.longtail.cache_positions`.
- Its decoder builds its causal mask only when it is fed more than one token: a decode step attends to
  every key the cache returns, and hfax's static cache returns its unwritten slots too. Here a one-token
  step's self-attention gets the mask over the slots (:mod:`hfax.patches.longtail.step_masks`) as the
  additive mask the layers take for longer steps.
"""

from __future__ import annotations

from typing import Any

from hfax.patches.longtail import step_masks
from hfax.patches.longtail.cache_positions import counted_positions
from hfax.patches.longtail.longformer import run_layers, self_attention
from hfax.signatures import cache_keyword


def led_encoder_forward(
    self: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    global_attention_mask: Any = None,
    inputs_embeds: Any = None,
    output_attentions: Any = None,
    output_hidden_states: Any = None,
    return_dict: Any = None,
    **kwargs: Any,
) -> Any:
    """``LEDEncoder.forward``: transformers' embedding, mask and window padding, its layers run by
    :func:`hfax.patches.longtail.longformer.run_layers`."""
    config = self.config
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    if output_attentions or self.training or (input_ids is None) == (inputs_embeds is None):
        # Attention maps, layer drop, or arguments transformers refuses: its own code.
        return type(self).forward(
            self,
            input_ids,
            attention_mask,
            global_attention_mask,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict,
            **kwargs,
        )
    import sys

    import torch

    module = sys.modules[type(self).__module__]
    if inputs_embeds is None:
        inputs_embeds = self.embed_tokens(input_ids)
    if attention_mask is None:
        attention_mask = torch.ones(
            inputs_embeds.shape[:-1], device=inputs_embeds.device, dtype=torch.long
        )
    if global_attention_mask is not None:
        attention_mask = self._merge_to_attention_mask(attention_mask, global_attention_mask)
    padding_len, input_ids, attention_mask, inputs_embeds = self._pad_to_window_size(
        input_ids=input_ids,
        attention_mask=attention_mask,
        inputs_embeds=inputs_embeds,
        pad_token_id=config.pad_token_id,
    )
    # 1 -> 0, 0 -> the dtype's lowest, 2 (global) -> a large positive value, as transformers has it.
    mask = module._prepare_4d_attention_mask_inverted(attention_mask, inputs_embeds.dtype)[
        :, 0, 0, :
    ]
    hidden_states = inputs_embeds + self.embed_positions(inputs_embeds.shape[:-1])
    states = run_layers(self.layers, self.layernorm_embedding(hidden_states), mask, padding_len)
    output_hidden_states = (
        config.output_hidden_states if output_hidden_states is None else output_hidden_states
    )
    all_states = states if output_hidden_states else None
    if not (config.return_dict if return_dict is None else return_dict):
        return tuple(value for value in (states[-1], all_states) if value is not None)
    return module.LEDEncoderBaseModelOutput(last_hidden_state=states[-1], hidden_states=all_states)


def decoder_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``LEDDecoder.forward``, its ``attention_mask`` visible to its self-attention layers."""
    layers = [layer.self_attn for layer in self.layers]
    over_slots = (
        kwargs.get("attention_mask"),
        step_masks.written(kwargs.get(cache_keyword(kwargs))),
    )
    for attention in layers:
        object.__setattr__(attention, step_masks.SLOTS, over_slots)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        for attention in layers:
            object.__setattr__(attention, step_masks.SLOTS, None)


def self_attention_forward(
    self: Any,
    hidden_states: Any,
    key_value_states: Any = None,
    attention_mask: Any = None,
    **kwargs: Any,
) -> Any:
    """``LEDDecoderAttention.forward``: on a one-token self-attention step with no mask, the decoder's
    mask over the slots, as an additive ``[batch, 1, 1, slots]`` mask. (LED's layers pass the cache by
    keyword, under the release's name for it.)"""
    slots = getattr(self, step_masks.SLOTS, None)
    if attention_mask is None and key_value_states is None and cache_keyword(kwargs) is not None:
        attention_mask = step_masks.additive(slots, hidden_states.shape[1], hidden_states.dtype)
    return type(self).forward(
        self,
        hidden_states,
        key_value_states=key_value_states,
        attention_mask=attention_mask,
        **kwargs,
    )


#: LED's encoder, positions and decoder: class name -> (method, its replacement).
PATCHES = {
    "LEDEncoderSelfAttention": ("forward", self_attention),
    "LEDEncoder": ("forward", led_encoder_forward),
    "LEDLearnedPositionalEmbedding": ("forward", counted_positions),
    "LEDDecoder": ("forward", decoder_forward),
    "LEDDecoderAttention": ("forward", self_attention_forward),
}
