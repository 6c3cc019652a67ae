"""The same cases against every installed backend: forward logits and greedy tokens against PyTorch on CPU,
generate's semantics and errors. Each backend's nox session runs this module with its own venv (the JAX and
PyTorch/XLA backends need different torch versions, so no venv holds both); cases are parametrized over the
backends installed here."""

from __future__ import annotations

import numpy as np
import pytest

from hfax.plugins import backends
from hfax.testing import (
    as_numpy,
    assert_same_continuation,
    left_padded,
    reference_forward,
    reference_generate,
    save_tiny,
    tiny_config,
    tiny_models,
)

BACKENDS = [name for name in ("jax", "torch_xla") if name in backends()]
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no hfax backend is installed")

IDS = np.array([[1, 5, 9, 23, 7, 3, 44, 101], [1, 17, 2, 8, 90, 64, 33, 12]])
PROMPTS = [[1, 5, 9, 23, 7, 3], [1, 4, 8], [1, 6, 100, 12, 7]]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def tiny(backend, tmp_path_factory):
    """``tiny(name, auto_class)`` -> (checkpoint dir, PyTorch reference, hfax model on the parametrized backend)."""
    return tiny_models(tmp_path_factory.mktemp, backend=backend)


@pytest.mark.parametrize("name", ["llama", "gemma", "gpt2"])
def test_causal_lm_logits_match_pytorch(tiny, name):
    _, ref, model = tiny(name)
    np.testing.assert_allclose(
        as_numpy(model(input_ids=IDS).logits),
        reference_forward(ref, input_ids=IDS).logits.numpy(),
        atol=1e-4,
        rtol=0,
    )


def test_encoder_hidden_states_match_pytorch(tiny):
    _, ref, model = tiny("bert", "AutoModel")
    mask = np.ones_like(IDS)
    mask[1, :3] = 0
    out = model(input_ids=IDS, attention_mask=mask)
    want = reference_forward(ref, input_ids=IDS, attention_mask=mask).last_hidden_state.numpy()
    np.testing.assert_allclose(as_numpy(out.last_hidden_state), want, atol=1e-4, rtol=0)


def test_from_model_takes_a_loaded_module(tiny, backend):
    import transformers

    import hfax

    directory, ref, _ = tiny("gpt2")
    module = transformers.AutoModelForCausalLM.from_pretrained(directory)
    loaded = hfax.AutoModelForTPU.from_model(module, backend=backend)
    want = reference_forward(ref, input_ids=IDS).logits.numpy()
    np.testing.assert_allclose(as_numpy(loaded(input_ids=IDS).logits), want, atol=1e-4, rtol=0)


def test_sequence_classification_matches_pytorch(tiny):
    _, ref, model = tiny("bert", "AutoModelForSequenceClassification")
    np.testing.assert_allclose(
        as_numpy(model(input_ids=IDS).logits),
        reference_forward(ref, input_ids=IDS).logits.numpy(),
        atol=1e-4,
        rtol=0,
    )


@pytest.mark.parametrize("name", ["llama", "gemma", "gpt2"])
def test_greedy_matches_transformers_batch_1(tiny, name):
    _, ref, model = tiny(name)
    ids = np.array([PROMPTS[0]])
    out = model.generate(ids, max_new_tokens=24)
    assert tuple(out.shape) == (1, ids.shape[1] + 24)
    assert_same_continuation(reference_generate(ref, ids, max_new_tokens=24), out, pad_token_id=0)


@pytest.mark.parametrize("name", ["llama", "gemma", "gpt2"])
def test_left_padded_batch_matches_each_prompt_alone(tiny, name):
    _, ref, model = tiny(name)
    ids, mask = left_padded(PROMPTS)
    out = as_numpy(model.generate(ids, attention_mask=mask, max_new_tokens=20))
    assert_same_continuation(
        reference_generate(ref, ids, mask, max_new_tokens=20), out, pad_token_id=0
    )
    for row, prompt in enumerate(PROMPTS):
        alone = as_numpy(model.generate(np.array([prompt]), max_new_tokens=20))
        np.testing.assert_array_equal(out[row, ids.shape[1] :], alone[0, len(prompt) :])


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_sliding_windows_shorter_than_the_prompt_decode_like_transformers(tiny, name):
    _, ref, model = tiny(name)
    ids, mask = left_padded([[1, 5, 9, 23, 7, 3, 44, 101, 17], PROMPTS[1]])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20)
    assert_same_continuation(
        reference_generate(ref, ids, mask, max_new_tokens=20), out, pad_token_id=0
    )


def test_gpt_neo_local_attention_within_its_window_and_without_a_cache_beyond(tiny):
    # GPT-Neo's local layers mask by their own table, sliced as if the cache held exactly the tokens so far:
    # right while the static cache fits in the window, wrong tokens beyond it (they differed from new
    # token 12), so beyond it the call decodes without a cache, re-reading the sequence every step.
    _, ref, model = tiny("gpt_neo")
    ids = np.array([[1, 5, 9, 23, 7, 3, 44, 101, 17]])
    out = model.generate(
        ids, max_new_tokens=12
    )  # 16 prompt slots + 16 new: within the window of 40
    assert_same_continuation(reference_generate(ref, ids, max_new_tokens=12), out, pad_token_id=0)
    with pytest.warns(UserWarning, match="decodes without a cache: its local attention"):
        longer = model.generate(ids, max_new_tokens=30)  # 16 + 32 slots
    assert_same_continuation(
        reference_generate(ref, ids, max_new_tokens=30), longer, pad_token_id=0
    )
    np.testing.assert_array_equal(as_numpy(model.generate(ids, max_new_tokens=12)), as_numpy(out))


def test_moshi_reads_its_prompt_whole_and_later_tokens_through_its_cache_window(backend, tmp_path):
    # Moshi masks causally with no window, while transformers' cache keeps only sliding_window tokens: its
    # generate reads the prompt whole and every later token through the window. hfax's mask bounds only the
    # keys cached before a forward by the window (it refused prompts wider than the window before; a window
    # on the prompt too gives other tokens).
    import hfax

    ref = save_tiny(tiny_config("moshi"), tmp_path, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    short = [1, 5, 9, 23, 7, 3, 44, 101, 17]
    ids, mask = left_padded(
        [(short * 3)[:25], short * 2]
    )  # 25 and 18 tokens: wider than the window of 16
    want = reference_generate(ref, ids, mask, max_new_tokens=12)
    assert_same_continuation(want, model.generate(ids, attention_mask=mask, max_new_tokens=12), 0)
    ids = np.array([short])
    want = reference_generate(ref, ids, max_new_tokens=16)  # 9 + 16 positions, past the window
    assert_same_continuation(want, model.generate(ids, max_new_tokens=16), pad_token_id=0)


def test_recurrent_gemma_decodes_without_a_cache(backend, tmp_path):
    # Its recurrent blocks keep their state in module attributes: traced with a cache, the state leaked (an
    # error), and from the persistent program cache the tokens were wrong (17 repeated against
    # transformers' 123s). It decodes without a cache: its forward then resets that state every call.
    import transformers

    import hfax

    config = transformers.RecurrentGemmaConfig(
        num_hidden_layers=3, vocab_size=128, hidden_size=64, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, lru_width=64,
        attention_window_size=16, block_types=["recurrent", "recurrent", "attention"],
    )  # fmt: skip
    ref = save_tiny(config, tmp_path, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    ids, mask = left_padded(PROMPTS)
    options = dict(max_new_tokens=8, min_new_tokens=8)
    with pytest.warns(UserWarning, match="decodes without a cache: its recurrent layers"):
        out = model.generate(ids, attention_mask=mask, **options)
    assert_same_continuation(reference_generate(ref, ids, mask, **options), out, pad_token_id=0)


def test_model_with_a_cache_class_of_its_own_decodes_without_a_cache(backend, tmp_path):
    # MiniMax's forward wants a cache of its own class (transformers makes no static one either; xLSTM's
    # likewise): given hfax's static cache it refused it. Re-reading the sequence every step gives
    # transformers' tokens for each prompt alone (a left-padded row is compared with its prompt alone:
    # transformers' own MiniMax cache lets a padded row's padding into its linear attention while
    # decoding, where its generate(use_cache=False) does not).
    import transformers

    import hfax

    config = transformers.MiniMaxConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1, block_size=4,
        layer_types=["linear_attention", "full_attention"],
    )  # fmt: skip
    ref = save_tiny(config, tmp_path, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    ids, mask = left_padded(PROMPTS)
    options = dict(max_new_tokens=8, min_new_tokens=8)
    with pytest.warns(
        UserWarning, match="decodes without a cache: it needs a cache class of its own"
    ):
        out = as_numpy(model.generate(ids, attention_mask=mask, **options))
    for row, prompt in enumerate(PROMPTS):
        alone = reference_generate(ref, np.array([prompt]), **options)[0, len(prompt) :]
        np.testing.assert_array_equal(out[row, ids.shape[1] :], alone, err_msg=f"row {row}")


def test_xlm_reads_the_tokens_so_far_and_a_mask_token_at_every_step(backend, tmp_path):
    # XLM's generate appends its mask token after the tokens so far at every step and re-reads them all
    # (bidirectional attention, no cache): the mask token's logits choose the next, with its language id
    # on every token. hfax refused it (its forward takes a cache of its own; on torch_xla its `.item()`
    # checks of its lengths broke the one-graph decode step). A left-padded row is compared with its prompt
    # alone: transformers' generate drops the mask for XLM and counts padding from the right. The reference
    # reads no cache: from transformers 5.24 on, its generate hands XLM's forward (whose own dict cache is
    # also called `cache`) a DynamicCache, which changes its tokens; 5.23 gave the use_cache=False tokens.
    import transformers

    import hfax

    config = transformers.XLMConfig(
        vocab_size=128, emb_dim=32, n_layers=2, n_heads=4, n_langs=3, lang_id=1,
        max_position_embeddings=64,
    )  # fmt: skip
    ref = save_tiny(config, tmp_path, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    ids, mask = left_padded(PROMPTS)
    options = dict(max_new_tokens=10, min_new_tokens=10)
    out = as_numpy(model.generate(ids, attention_mask=mask, **options))
    for row, prompt in enumerate(PROMPTS):
        alone = reference_generate(ref, np.array([prompt]), use_cache=False, **options)
        np.testing.assert_array_equal(
            out[row, ids.shape[1] :], alone[0, len(prompt) :], err_msg=f"row {row}"
        )
    assert len(set(out[:, ids.shape[1] :].ravel().tolist())) > 3  # the context decides the tokens


def test_t5gemma2_joins_its_masks_of_one_type(backend, tmp_path):
    # T5Gemma 2's decoder concatenates its self-attention mask (hfax's, ready) with the cross-attention
    # mask it builds itself (booleans under sdpa): an additive float mask beside booleans read them as
    # +1 and 0, so the source's padding was attended and the first row's tokens differed.
    import transformers

    import hfax

    text = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                sliding_window=4, max_position_embeddings=256)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)  # fmt: skip
    config = transformers.T5Gemma2Config(
        encoder=transformers.T5Gemma2EncoderConfig(
            text_config=text, vision_config=vision, mm_tokens_per_image=4
        ),
        decoder=transformers.T5Gemma2DecoderConfig(**text),
    )
    reference = save_tiny(config, tmp_path, "AutoModelForSeq2SeqLM", spread=True)
    model = hfax.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path), backend=backend)
    ids = np.array([[5, 17, 33, 9, 41, 8, 22, 60, 3], [0, 0, 0, 12, 50, 7, 31, 44, 90]])
    mask = (np.arange(9) >= np.array([[0], [3]])).astype(np.int64)
    np.testing.assert_array_equal(
        as_numpy(model.generate(ids, attention_mask=mask, max_new_tokens=6)),
        reference_generate(reference, ids, mask, max_new_tokens=6),
    )


def test_eos_pads_the_rest_and_min_new_tokens_delays_it(tiny):
    _, ref, model = tiny("llama")
    ids = np.array([PROMPTS[0]])
    greedy = as_numpy(model.generate(ids, max_new_tokens=10))
    eos = int(greedy[0, ids.shape[1] + 2])  # make the third new token the end of the sequence
    out = as_numpy(model.generate(ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0))
    first_eos = ids.shape[1] + list(out[0, ids.shape[1] :]).index(eos)
    assert (out[0, first_eos + 1 :] == 0).all()
    expected = reference_generate(ref, ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    assert_same_continuation(expected, out, pad_token_id=0)
    delayed = model.generate(
        ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0, min_new_tokens=6
    )
    expected = reference_generate(
        ref, ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0, min_new_tokens=6
    )
    assert_same_continuation(expected, delayed, pad_token_id=0)


def test_sampling_is_seeded(tiny):
    _, _, model = tiny("llama")
    ids = np.array([PROMPTS[0]])
    first = as_numpy(
        model.generate(ids, max_new_tokens=16, do_sample=True, seed=7, temperature=1.5, top_k=0)
    )
    again = as_numpy(
        model.generate(ids, max_new_tokens=16, do_sample=True, seed=7, temperature=1.5, top_k=0)
    )
    other = as_numpy(
        model.generate(ids, max_new_tokens=16, do_sample=True, seed=8, temperature=1.5, top_k=0)
    )
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


#: What the JAX backend samples from the tiny Llama with spread weights for the left-padded PROMPTS (seed 7,
#: 12 new tokens), plainly and through processors. Every backend runs the same counter-based sampler
#: (:mod:`hfax.generation.search`) on the same logits, so every backend must sample exactly these.
SEED_7_TOKENS = {
    "plain": [
        [54, 98, 109, 85, 119, 79, 52, 8, 65, 47, 89, 126],
        [83, 109, 108, 110, 76, 95, 10, 67, 115, 95, 100, 49],
        [118, 56, 56, 85, 56, 55, 11, 124, 73, 105, 88, 61],
    ],
    "processed": [
        [69, 112, 49, 102, 45, 79, 19, 95, 49, 84, 29, 126],
        [95, 60, 112, 120, 109, 69, 76, 5, 43, 33, 45, 9],
        [119, 56, 56, 88, 9, 65, 105, 124, 73, 126, 80, 43],
    ],
}
PROCESSED = dict(top_k=5, top_p=0.9, temperature=0.7, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def spread_llama(backend, tmp_path_factory):
    import hfax
    from hfax.testing import save_tiny, tiny_config

    directory = tmp_path_factory.mktemp("llama-spread")
    save_tiny(tiny_config("llama"), directory, spread=True)
    return hfax.AutoModelForCausalLM.from_pretrained(str(directory), backend=backend)


@pytest.mark.parametrize("case", ["plain", "processed"])
def test_the_same_seed_samples_the_same_tokens_on_every_backend(spread_llama, case):
    ids, mask = left_padded(PROMPTS)
    settings = PROCESSED if case == "processed" else {}
    out = spread_llama.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=True, seed=7, **settings
    )
    np.testing.assert_array_equal(as_numpy(out)[:, ids.shape[1] :], np.array(SEED_7_TOKENS[case]))


def test_top_k_1_and_a_vanishing_top_p_are_greedy(tiny):
    _, _, model = tiny("gemma")
    ids = np.array([PROMPTS[2]])
    greedy = as_numpy(model.generate(ids, max_new_tokens=12))
    np.testing.assert_array_equal(
        as_numpy(model.generate(ids, max_new_tokens=12, do_sample=True, top_k=1, seed=3)), greedy
    )
    np.testing.assert_array_equal(
        as_numpy(
            model.generate(ids, max_new_tokens=12, do_sample=True, top_k=0, top_p=1e-6, seed=1)
        ),
        greedy,
    )


def test_twenty_prompt_lengths_cost_a_handful_of_compiles(tiny):
    _, _, model = tiny("llama")
    rng = np.random.default_rng(0)
    compiles = 0
    for length in rng.integers(2, 100, size=20):
        model.generate(rng.integers(3, 128, size=(1, int(length))), max_new_tokens=8)
        compiles += model.last_generate_stats.compiles
    # Prompt buckets 16, 32, 64, 128: four buckets of a few programs each, whatever the order.
    assert compiles <= 12


class Collect:
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(as_numpy(value).reshape(-1))

    def end(self):
        self.ended = True


def test_streamer_gets_the_tokens_as_they_come(tiny):
    _, _, model = tiny("llama")
    ids = np.array([PROMPTS[0]])
    streamer = Collect()
    out = as_numpy(model.generate(ids, max_new_tokens=20, streamer=streamer))
    np.testing.assert_array_equal(out, as_numpy(model.generate(ids, max_new_tokens=20)))
    assert streamer.ended and len(streamer.chunks) >= 3  # the prompt, then more than one chunk
    np.testing.assert_array_equal(np.concatenate(streamer.chunks), out[0])


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
        (dict(min_new_tokens=2.5), ValueError, "min_new_tokens"),
        (dict(do_sample=True, temperature=0.0), ValueError, "temperature"),
        (dict(do_sample=True, top_p=-0.5), ValueError, "top_p"),
        (dict(do_sample=True, top_p=1.5), ValueError, "top_p"),
        (dict(do_sample=True, top_k=-2), ValueError, "top_k"),
        (dict(max_new_tokens=300), ValueError, "max_position_embeddings"),
        (dict(streamer=object()), TypeError, "streamer"),
        (dict(no_such_setting=2), TypeError, "unexpected keyword argument 'no_such_setting'"),
        (dict(num_beams=0), ValueError, "num_beams"),
        (dict(num_return_sequences=3), ValueError, "num_return_sequences"),
        (dict(repetition_penalty=-1.0), ValueError, "penalty"),
        (dict(stop_strings=["ab"]), ValueError, "tokenizer"),
        (dict(penalty_alpha=0.6, top_k=4), NotImplementedError, "contrastive"),
        (
            dict(logits_processor=[object()]),
            TypeError,
            "logits_processor must be a transformers LogitsProcessorList",
        ),
    ],
)
def test_bad_settings_are_rejected(tiny, kwargs, error, words):
    _, _, model = tiny("llama")
    with pytest.raises(error, match=words):
        model.generate(np.array([PROMPTS[0]]), **{"max_new_tokens": 4, **kwargs})


@pytest.mark.parametrize(
    "ids, error, words",
    [
        (np.array([[1.0, 2.0]]), TypeError, "integers"),
        (np.array([[1, 128]]), ValueError, "outside the vocabulary"),
        (np.array([[-1, 3]]), ValueError, "outside the vocabulary"),
    ],
)
def test_bad_ids_are_rejected_and_the_model_stays_usable(tiny, ids, error, words):
    _, ref, model = tiny("llama")
    with pytest.raises(error, match=words):
        model.generate(ids, max_new_tokens=4)
    good = np.array([PROMPTS[1]])
    assert_same_continuation(
        reference_generate(ref, good, max_new_tokens=8), model.generate(good, max_new_tokens=8), 0
    )


def test_defaults_come_from_the_generation_config(tiny):
    _, _, model = tiny("llama")
    model.generation_config.max_new_tokens = 5
    try:
        assert tuple(model.generate(np.array([PROMPTS[0]])).shape) == (1, len(PROMPTS[0]) + 5)
    finally:
        model.generation_config.max_new_tokens = None
