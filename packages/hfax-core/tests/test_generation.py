"""hfax.generation: what every backend's generate shares, checked without torch or jax."""

from __future__ import annotations

import types

import numpy as np
import pytest
import transformers

from hfax import generation, masks


def fake_model(config=None, **generation_settings):
    """What resolve reads of a model: its configs and its input embeddings' size."""
    config = config or transformers.LlamaConfig(vocab_size=64, max_position_embeddings=64)
    embeddings = types.SimpleNamespace(num_embeddings=config.vocab_size)
    module = types.SimpleNamespace(get_input_embeddings=lambda: embeddings)
    return types.SimpleNamespace(
        config=config,
        module=module,
        generation_config=transformers.GenerationConfig(**generation_settings),
    )


def test_optional_settings_are_filled_only_for_a_backend_that_implements_them():
    model = fake_model(forced_eos_token_id=2, eos_token_id=2)
    _, _, s = generation.resolve(
        model,
        [[5, 6]],
        None,
        {"max_new_tokens": 4},
        optional=("forced_eos_token_id", "begin_suppress_tokens"),
    )
    assert s["forced_eos_token_id"] == 2 and s["begin_suppress_tokens"] == []
    with pytest.raises(TypeError, match="unexpected keyword argument 'begin_suppress_tokens'"):
        generation.resolve(model, [[5, 6]], None, {"begin_suppress_tokens": [3]}, optional=())
    with pytest.raises(ValueError, match="optional settings are"):
        generation.resolve(model, [[5, 6]], None, {}, optional=("no_such_setting",))


def test_a_backend_warns_about_generation_settings_it_ignores():
    with pytest.warns(UserWarning, match="forced_eos_token_id=2"):
        generation.resolve(fake_model(forced_eos_token_id=2), [[5, 6]], None, {"max_new_tokens": 1})
    with pytest.warns(UserWarning, match="repetition_penalty=1.3"):
        generation.resolve(
            fake_model(repetition_penalty=1.3),
            [[5, 6]],
            None,
            {"max_new_tokens": 1},
            optional=tuple(generation.OPTIONAL),
        )


def test_unbounded_positions_and_encoder_decoder_lengths():
    # XLNet's max_position_embeddings of -1 means unbounded; an encoder-decoder's decoder holds 1 + new tokens.
    config = transformers.LlamaConfig(vocab_size=64, max_position_embeddings=-1)
    generation.resolve(fake_model(config), [[5] * 40], None, {"max_new_tokens": 100})
    seq2seq = transformers.BartConfig(vocab_size=64, max_position_embeddings=16)
    generation.resolve(fake_model(seq2seq), [[5] * 10], None, {"max_new_tokens": 15})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generation.resolve(fake_model(seq2seq), [[5] * 10], None, {"max_new_tokens": 16})


def test_decoder_start_follows_transformers_order():
    model = fake_model(
        transformers.BartConfig(vocab_size=64, decoder_start_token_id=7), bos_token_id=1
    )
    ids = np.zeros((2, 3), np.int64)
    assert generation.decoder_start(model, ids, {"decoder_start_token_id": 9}).tolist() == [
        [9],
        [9],
    ]
    assert generation.decoder_start(model, ids, {}).tolist() == [[7], [7]]
    no_start = fake_model(
        transformers.BartConfig(vocab_size=64, decoder_start_token_id=None, bos_token_id=None)
    )
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        generation.decoder_start(no_start, ids, {})


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
