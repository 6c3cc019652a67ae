"""Encoder-decoder generate (T5, BART, LED, FSMT, T5Gemma): the encoder runs once, the decoder's loop is compiled with the rest,
and the tokens are transformers' own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import transformers

import hfax
from hfax.testing import (
    assert_same_continuation,
    bert2bert_config,
    fsmt_config,
    led_config,
    reference_generate,
    right_padded,
    save_tiny,
    switch_config,
)

SOURCES = [[5, 17, 33, 9, 41, 8, 22], [12, 50, 7, 31]]
NEW_TOKENS = 9
PAD = 0

T5GEMMA_MODULE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"],
)


CONFIGS = {
    "t5": lambda: transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=PAD,
        pad_token_id=PAD,
        eos_token_id=1,
    ),
    "bart": lambda: transformers.BartConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_bos_token_id=1,
    ),
    # Longformer's windowed attention in the encoder, a window shorter than the sources (hfax.patches.longtail.longformer).
    "led": lambda: led_config(PAD),
    # FSMT applies no decoder mask over a cache, and drops its padding mask when there is no padding
    # (hfax.patches.longtail.fsmt).
    "fsmt": lambda: fsmt_config(PAD),
    # BERT as the decoder of an EncoderDecoderModel slices its position ids at the cache's count
    # (`position_ids[:, past : past + n]`: hfax.patches.longtail.cache_positions).
    "bert2bert": lambda: bert2bert_config(PAD),
    # Switch Transformers loops over the experts its tokens hit (hfax.patches.longtail.switch_transformers); each expert takes at most
    # 3 tokens of a sequence.
    "switch_transformers": lambda: switch_config(PAD),
    # The encoder runs alone (not with use_cache) and its own output type reaches the decoder.
    "t5gemma": lambda: transformers.T5GemmaConfig(
        encoder=T5GEMMA_MODULE,
        decoder=T5GEMMA_MODULE,
        vocab_size=64,
        pad_token_id=PAD,
        bos_token_id=2,
        eos_token_id=1,
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_tiny(CONFIGS[request.param](), directory, "AutoModelForSeq2SeqLM", spread=True)
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend="jax")


def test_greedy_matches_transformers(models):
    reference, model = models
    ids, mask = right_padded(SOURCES, PAD)
    expected = reference_generate(reference, ids, mask, max_new_tokens=NEW_TOKENS)
    actual = np.asarray(model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS))
    assert actual.shape == (
        len(SOURCES),
        1 + NEW_TOKENS,
    )  # the decoder's start token, then the new tokens
    assert_same_continuation(expected, actual, pad_token_id=PAD)


def test_each_source_alone_gives_its_row_of_the_batch(models):
    _, model = models
    ids, mask = right_padded(SOURCES, PAD)
    batch = np.asarray(model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS))
    for row, source in enumerate(SOURCES):
        alone = np.asarray(model.generate(np.array([source]), max_new_tokens=NEW_TOKENS))
        np.testing.assert_array_equal(batch[row], alone[0])
