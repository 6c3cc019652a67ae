"""FSMT's decoder masks and positions, on every backend: a padding mask without a branch on the data, a mask
over the static cache on cached steps, and positions counted from a tensor count.

- transformers' FSMT makes its decoder's padding mask from the decoder's ids and drops it when no id is
  padding (``if not padding_mask.any()``): a branch on values, which ``jax.jit`` cannot trace and torch_xla's
  dynamo bridge breaks its graph at. An all-False padding mask masks nothing, so the output is the same with
  it. transformers takes that path itself when it is given a ``decoder_attention_mask``; here the forward is
  given the one transformers would make.
- Over a cache, transformers' FSMT applies no decoder mask at all: its dynamic cache holds exactly the tokens
  so far. hfax's static cache also holds slots not yet written (:mod:`hfax.patches.longtail.step_masks`), so
  the mask hfax passes over them reaches the decoder's layers as the causal mask they add to their scores.
- FSMT's sinusoidal positions count from the cache's length
  (:mod:`hfax.patches.longtail.cache_positions`), and its table grows itself when ``past + n`` positions
  outrun it, a branch on the count. The table holds ``max_position_embeddings`` positions past the padding
  index, and hfax's generate refuses a run that needs more before compiling (``hfax.generation.settings``),
  so with a tensor count the table is used as it is.
"""

from __future__ import annotations

from typing import Any

from hfax.patches.longtail import step_masks
from hfax.patches.longtail.cache_positions import count_of
from hfax.signatures import cache_keyword


def model_forward(
    self: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    decoder_input_ids: Any = None,
    decoder_attention_mask: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``FSMTModel.forward``, with the decoder's attention mask made from its ids when none is given, and
    the mask over the cache's slots handed to its decoder."""
    if decoder_attention_mask is None and input_ids is not None:
        import sys

        pad = self.config.pad_token_id
        if decoder_input_ids is None:  # as transformers makes it: the source shifted right
            decoder_input_ids = sys.modules[type(self).__module__].shift_tokens_right(
                input_ids, pad
            )
        decoder_attention_mask = decoder_input_ids.ne(pad)
    cache = kwargs.get(cache_keyword(kwargs))
    over_slots = None if cache is None else (decoder_attention_mask, step_masks.written(cache))
    object.__setattr__(self.decoder, step_masks.SLOTS, over_slots)
    try:
        return type(self).forward(
            self,
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            *args,
            **kwargs,
        )
    finally:
        object.__setattr__(self.decoder, step_masks.SLOTS, None)


def decoder_forward(
    self: Any,
    input_ids: Any,
    encoder_hidden_states: Any,
    encoder_padding_mask: Any,
    decoder_padding_mask: Any,
    decoder_causal_mask: Any,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``FSMTDecoder.forward``: on a cached step without a causal mask, the mask over the cache's slots."""
    over_slots = getattr(self, step_masks.SLOTS, None)
    if decoder_causal_mask is None and over_slots is not None:
        queries = (input_ids if input_ids is not None else kwargs["inputs_embeds"]).shape[1]
        dtype = self.embed_tokens.weight.dtype
        decoder_causal_mask = step_masks.additive(over_slots, queries, dtype)
    return type(self).forward(
        self,
        input_ids,
        encoder_hidden_states,
        encoder_padding_mask,
        decoder_padding_mask,
        decoder_causal_mask,
        *args,
        **kwargs,
    )


def fsmt_positions(self: Any, input: Any, **named: Any) -> Any:
    """FSMT's ``SinusoidalPositionalEmbedding.forward``: each real token's position among the row's real
    tokens, after the cache's count of tokens (its one keyword argument); with a tensor count, without
    growing the table."""
    import torch

    count = count_of((), named)
    if not isinstance(count, torch.Tensor):
        return type(self).forward(self, input, **named)
    positions = self.make_positions(input, self.padding_idx) + count
    return torch.nn.Embedding.forward(self, positions)


#: FSMT's model, decoder and positions (FSMT's ``SinusoidalPositionalEmbedding``, the only class of that
#: name in transformers): class name -> (method, its replacement).
PATCHES = {
    "FSMTModel": ("forward", model_forward),
    "FSMTDecoder": ("forward", decoder_forward),
    "SinusoidalPositionalEmbedding": ("forward", fsmt_positions),
}
