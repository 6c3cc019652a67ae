"""Generate on PyTorch/XLA against transformers for the masks a model needs (the 2-D mask of BLOOM, chunked
attention), beam search, and what the backend refuses.

Tiny models with spread random weights (a broken cache or mask changes their tokens), a batch with a
left-padded row, the tokens of transformers' own ``generate`` on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import transformers

import hfax
from hfax.testing import (
    as_numpy,
    assert_same_continuation,
    left_padded,
    reference_generate,
    save_tiny,
    tiny_config,
)

PROMPTS = [[5, 17, 33, 9, 41, 8, 22, 60], [12, 50, 7, 31, 19]]
NEW_TOKENS = 10
PAD = 1


def load(config: Any, directory) -> tuple[Any, Any]:
    reference = save_tiny(config, directory, spread=True)
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")


def assert_generates_like_transformers(config: Any, directory, **options: Any) -> None:
    reference, model = load(config, directory)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD, **options}
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    assert actual.shape == (len(PROMPTS), ids.shape[1] + NEW_TOKENS)
    assert_same_continuation(expected, actual, pad_token_id=PAD)


def test_model_reading_the_2d_mask_itself(tmp_path):
    # BLOOM builds ALiBi biases from the 2-D mask: it must get one as long as its keys, not a 4-D mask.
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
    assert_generates_like_transformers(config, tmp_path)


def test_chunked_and_full_layers(tmp_path):
    # Llama 4: chunked layers see only their chunk of 4 positions (counted from each row's first real token,
    # so a left-padded row keeps its chunks); the full layer sees everything.
    config = transformers.Llama4TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        attention_chunk_size=4,
        num_local_experts=2,
        layer_types=["chunked_attention", "full_attention"],
        no_rope_layers=[1, 0],
        moe_layers=[],
    )
    assert_generates_like_transformers(config, tmp_path)


def test_beam_search_matches_transformers(tmp_path):
    # The cache's rows follow the beams they extend: a wrong reorder changes the tokens of these weights.
    reference, model = load(tiny_config("llama"), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=PAD, num_beams=3, num_return_sequences=2)
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    np.testing.assert_array_equal(actual, expected)
