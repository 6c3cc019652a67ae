"""Encoder-decoder generate on PyTorch/XLA (T5): the encoder runs in the prefill graph, the compiled
decode step reads transformers' EncoderDecoderCache (static self-attention, cross-attention filled once),
and the tokens are transformers' own. BART runs in tests/test_generate_features.py, Whisper in
test_generate_multimodal.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import transformers

import hfax
from hfax.backends.torchxla import runtime
from hfax.testing import assert_same_continuation, reference_generate, right_padded, save_tiny

SOURCES = [[5, 17, 33, 9, 41, 8, 22], [12, 50, 7, 31]]
NEW_TOKENS = 9
PAD = 0


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    # More decoder layers than encoder layers: the cache must have the decoder's depth.
    config = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
        num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=PAD,
        pad_token_id=PAD, eos_token_id=1,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("t5")
    reference = save_tiny(config, directory, "AutoModelForSeq2SeqLM", spread=True)
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")


def growing_cache() -> transformers.EncoderDecoderCache:
    """A cache for the reference that grows to the decoder's depth: transformers' generate sizes the one
    it makes by the encoder's (num_layers), and a deeper T5 decoder then fails there with an IndexError."""
    return transformers.EncoderDecoderCache(
        transformers.DynamicCache(), transformers.DynamicCache()
    )


def test_greedy_matches_transformers_then_a_new_source_compiles_nothing(t5):
    reference, model = t5
    ids, mask = right_padded(SOURCES, PAD)
    expected = reference_generate(
        reference, ids, mask, max_new_tokens=NEW_TOKENS, past_key_values=growing_cache()
    )
    actual = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert_same_continuation(expected, actual, pad_token_id=PAD)
    other, other_mask = right_padded([[9, 3, 60, 2, 44, 18, 7], [30, 31, 32, 33, 34]], PAD)
    before = runtime.counters()
    actual = model.generate(other, attention_mask=other_mask, max_new_tokens=NEW_TOKENS)
    assert (runtime.counters() - before).compiles == 0
    expected = reference_generate(
        reference, other, other_mask, max_new_tokens=NEW_TOKENS, past_key_values=growing_cache()
    )
    assert_same_continuation(expected, actual, pad_token_id=PAD)


def test_beam_search_matches_transformers(t5):
    # Beams reorder the self-attention cache; the cross-attention cache is the same for a prompt's beams.
    reference, model = t5
    ids, mask = right_padded(SOURCES, PAD)
    options = dict(max_new_tokens=NEW_TOKENS, num_beams=3, num_return_sequences=2)
    expected = reference_generate(reference, ids, mask, **options, past_key_values=growing_cache())
    np.testing.assert_array_equal(
        np.asarray(model.generate(ids, attention_mask=mask, **options)), expected
    )
