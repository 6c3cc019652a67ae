"""hfax.masks, the one mask path of every backend: which models get a 4-D mask, and what it allows."""

from __future__ import annotations

import pytest
import torch
import transformers

from hfax import masks

TINY = dict(vocab_size=64, num_hidden_layers=2)


@pytest.mark.parametrize(
    "config, two_d",
    [
        (
            transformers.LlamaConfig(
                hidden_size=32, intermediate_size=64, num_attention_heads=4, **TINY
            ),
            False,
        ),
        (
            transformers.Gemma2Config(
                hidden_size=32, intermediate_size=64, num_attention_heads=4, head_dim=8, **TINY
            ),
            False,
        ),
        # ALiBi from the 2-D mask (BLOOM, by its model's build_alibi_tensor)
        (transformers.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=64), True),
        # recurrent layers zero padding with the 2-D mask
        (transformers.MambaConfig(hidden_size=32, state_size=8, **TINY), True),
        # expands the 2-D mask itself, without transformers' masking_utils
        (transformers.OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=4, vocab_size=64), True),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, bool) else str(value),
)
def test_which_models_get_the_2d_mask(config, two_d):
    module = transformers.AutoModelForCausalLM.from_config(config)
    assert masks.form(config, module).two_d is two_d


def test_2d_form_hands_over_the_padding_mask():
    form = masks.MaskForm((("full_attention", masks.Span()),), two_d=True)
    valid = torch.tensor([[False, True, True]])
    assert masks.attention_mask(form, valid, torch.arange(3), torch.float32).tolist() == [[0, 1, 1]]


def allowed(mask: torch.Tensor) -> list[list[int]]:
    return (mask[0, 0] == 0).int().tolist()


def test_sliding_window_and_padding():
    valid = torch.tensor([[False, True, True, True, True]])
    mask = masks.build(
        {"sliding_attention": masks.Span(window=2)}, valid, torch.arange(5), torch.float32
    )
    assert allowed(mask) == [
        [0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]


def test_chunks_count_positions_not_slots():
    # Two padding slots, then positions 0..3 in chunks of 2: {0, 1} and {2, 3}, wherever the prompt starts.
    valid = torch.tensor([[False, False, True, True, True, True]])
    mask = masks.build(
        {"chunked_attention": masks.Span(chunk=2), "full_attention": None},
        valid,
        torch.arange(2, 6),
        torch.float32,
    )
    assert allowed(mask["chunked_attention"]) == [
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]
    assert allowed(mask["full_attention"])[-1] == [0, 0, 1, 1, 1, 1]
