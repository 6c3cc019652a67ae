"""hfax.generation.shapes and hfax.masks: what every backend's generate shares, checked without torch or jax."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from hfax import masks
from hfax.generation import shapes as generation


def test_pad_prompts_left_right_and_to_a_length():
    ids, mask = np.array([[3, 4, 5]]), np.ones((1, 3), bool)
    left, left_mask = generation.pad_prompts(ids, mask, 0, row_multiple=2)
    assert (
        left.shape == (2, generation.MIN_LENGTH_BUCKET)
        and left[0, -3:].tolist() == [3, 4, 5]
        and left_mask[0, :-3].sum() == 0
    )
    right, _ = generation.pad_prompts(ids, mask, 0, left=False)
    assert right[0, :3].tolist() == [3, 4, 5]
    exact, _ = generation.pad_prompts(ids, mask, 0, length=3)
    assert exact.tolist() == [[3, 4, 5]]
    with pytest.raises(ValueError, match="cannot pad 3 tokens into 2"):
        generation.pad_prompts(ids, mask, 0, length=2)


def test_layer_spans_by_layer_type():
    gemma2 = transformers.Gemma2Config(num_hidden_layers=2, sliding_window=5)
    assert masks.layer_spans(gemma2) == {
        "sliding_attention": masks.Span(window=5),
        "full_attention": masks.Span(),
    }
    llama4 = transformers.Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=8)
    spans = masks.layer_spans(llama4)
    assert (
        spans["chunked_attention"] == masks.Span(chunk=8)
        and spans["full_attention"] == masks.Span()
    )
    assert masks.layer_windows(transformers.MistralConfig(sliding_window=7)) == {
        "full_attention": 7
    }
