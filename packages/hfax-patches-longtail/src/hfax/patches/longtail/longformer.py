"""Longformer's attention (and LED's encoder, which copies it: :mod:`hfax.patches.longtail.led`) with
static shapes, on every backend.

transformers' Longformer reads whether any token of the batch has global attention with ``.item()``
(no compiled program can branch on a value it computes), lists the global tokens with ``nonzero`` (a
data-dependent shape) and scatters their outputs back by those lists. Under ``jax.jit`` that cannot
trace; through torch_xla's dynamo bridge the graph breaks there, and its logits differ from transformers'
(``test_longformer_with_global_tokens_and_a_window_shorter_than_the_prompt`` of each backend): with this
module the forward is one graph.

Here every query scores every key of the (window-padded) sequence and a boolean mask keeps exactly the
keys transformers' banded computation lets it see: a query that is not global sees the keys within
``attention_window / 2`` positions that are neither padding nor global, plus every global key (once); a
global query uses the ``*_global`` projections and sees every key but padding; a padding query's output
is zero. The result equals transformers' banded one; memory grows with the square of the padded length
rather than with the window, which suits the lengths a compiled forward takes here.

``output_attentions`` keeps transformers' own code (its banded probabilities have another layout), which
runs eagerly but not compiled.
"""

from __future__ import annotations

import math
from typing import Any


def self_attention(
    self: Any,
    hidden_states: Any,
    attention_mask: Any = None,
    is_index_masked: Any = None,
    is_index_global_attn: Any = None,
    is_global_attn: Any = None,
    output_attentions: bool = False,
) -> Any:
    """``LongformerSelfAttention.forward`` (and LED's encoder copy of it): ``(output,)``, ``[batch, length,
    embed_dim]``. ``attention_mask`` holds, per token, a large negative value for padding, 0 for local and
    a large positive value for global attention."""
    if output_attentions:
        return type(self).forward(
            self,
            hidden_states,
            attention_mask,
            is_index_masked,
            is_index_global_attn,
            is_global_attn,
            output_attentions,
        )
    import torch

    batch, length, _ = hidden_states.shape
    heads, dim = self.num_heads, self.head_dim

    def split_heads(states: Any) -> Any:  # [batch, heads, length, dim]
        return states.view(batch, length, heads, dim).transpose(1, 2)

    def attend(query: Any, key: Any, value: Any, visible: Any) -> Any:
        scores = torch.matmul(query / math.sqrt(dim), key.transpose(-1, -2))
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        return torch.matmul(probs, value)

    positions = torch.arange(length, device=hidden_states.device)
    in_window = (positions[:, None] - positions[None, :]).abs() <= self.one_sided_attn_window_size
    local_key = (attention_mask == 0)[:, None, None, :]
    global_key = is_index_global_attn[:, None, None, :]
    output = attend(
        split_heads(self.query(hidden_states)),
        split_heads(self.key(hidden_states)),
        split_heads(self.value(hidden_states)),
        (in_window & local_key) | global_key,
    )
    global_output = attend(
        split_heads(self.query_global(hidden_states)),
        split_heads(self.key_global(hidden_states)),
        split_heads(self.value_global(hidden_states)),
        ~is_index_masked[:, None, None, :],
    )
    output = torch.where(is_index_global_attn[:, None, :, None], global_output, output)
    output = output.masked_fill(is_index_masked[:, None, :, None], 0.0)
    return (output.transpose(1, 2).reshape(batch, length, heads * dim),)


def run_layers(
    layers: Any, hidden_states: Any, attention_mask: Any, padding_len: int
) -> tuple[Any, ...]:
    """The hidden states before the first layer and after each, cut back to the unpadded length.
    transformers' encoders read whether any token is global with ``.item()`` only to choose their
    branches, and :func:`self_attention` has none: the layers are given no such flag."""
    states: tuple[Any, ...] = ()
    for layer in layers:
        states += (hidden_states,)
        hidden_states = layer(
            hidden_states,
            attention_mask=attention_mask,
            is_index_masked=attention_mask < 0,
            is_index_global_attn=attention_mask > 0,
            is_global_attn=None,
            output_attentions=False,
        )[0]
    states += (hidden_states,)
    # The sequence was padded to a multiple of the window; the caller expects its own length back.
    return tuple(state[:, : state.shape[1] - padding_len] for state in states)


def encoder_forward(
    self: Any,
    hidden_states: Any,
    attention_mask: Any = None,
    padding_len: int = 0,
    output_attentions: bool = False,
    output_hidden_states: bool = False,
    return_dict: bool = True,
) -> Any:
    """``LongformerEncoder.forward``, its layers run by :func:`run_layers`."""
    if output_attentions:
        return type(self).forward(
            self,
            hidden_states,
            attention_mask,
            padding_len,
            output_attentions,
            output_hidden_states,
            return_dict,
        )
    import sys

    states = run_layers(self.layer, hidden_states, attention_mask, padding_len)
    all_states = states if output_hidden_states else None
    if not return_dict:
        return tuple(value for value in (states[-1], all_states) if value is not None)
    output_class = sys.modules[type(self).__module__].LongformerBaseModelOutput
    return output_class(last_hidden_state=states[-1], hidden_states=all_states)


#: transformers' Longformer classes whose methods need concrete values, and their static replacements.
PATCHES = {
    "LongformerSelfAttention": ("forward", self_attention),
    "LongformerEncoder": ("forward", encoder_forward),
}
