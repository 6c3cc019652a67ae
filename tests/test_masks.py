"""hfax.masks, the one mask path of every backend: which models get a 4-D mask, and what it allows."""

from __future__ import annotations

import pytest
import torch
import transformers

from hfax import masks
from hfax.testing import conformance
from hfax.testing.configs import mask_config, tiny_config


@pytest.mark.parametrize(
    "config, two_d",
    [
        (tiny_config("llama"), False),
        (tiny_config("gemma2"), False),
        # ALiBi from the 2-D mask (BLOOM, by its model's build_alibi_tensor)
        (mask_config("bloom"), True),
        # recurrent layers zero padding with the 2-D mask
        (tiny_config("mamba"), True),
        # expands the 2-D mask itself, without transformers' masking_utils
        (conformance.config("openai_gpt"), True),
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
