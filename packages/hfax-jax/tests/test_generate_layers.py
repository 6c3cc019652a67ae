"""Greedy generate matches transformers for the kinds of layers a slot cache must hold and the masks they need.

Tiny models with spread random weights (a broken cache changes their tokens), a batch with a left-padded
row, the tokens of transformers' own ``generate`` on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import transformers

import hfax
from hfax.testing import (
    assert_same_continuation,
    eager_experts_batch,
    left_padded,
    looping_config,
    mask_config,
    prophetnet_config,
    reference_generate,
    save_tiny,
    tiny_config,
)

PROMPTS = [[5, 17, 33, 9, 41, 8, 22, 60], [12, 50, 7, 31, 19]]
NEW_TOKENS = 10
PAD = 1


def assert_generates_like_transformers(config: Any, directory, **options: Any) -> None:
    """Both generate with the generation config's settings and ``options``."""
    reference = save_tiny(config, directory, spread=True)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD, **options}
    expected = reference_generate(reference, ids, mask, **options)
    model = hfax.AutoModelForTPU.from_pretrained(str(directory), backend="jax")
    actual = np.asarray(model.generate(ids, attention_mask=mask, **options))
    assert actual.shape == (len(PROMPTS), ids.shape[1] + NEW_TOKENS)
    assert_same_continuation(expected, actual, pad_token_id=PAD)


def test_model_reading_the_2d_mask_itself(tmp_path):
    # BLOOM builds ALiBi biases from the 2-D mask: it must get one as long as its keys, not a 4-D mask.
    config = mask_config("bloom")
    assert_generates_like_transformers(config, tmp_path)


@pytest.mark.parametrize("window", [3, None])
def test_sliding_and_full_layers(tmp_path, window):
    config = transformers.Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=window or 4096,
        layer_types=["sliding_attention", "full_attention"],
    )
    assert_generates_like_transformers(config, tmp_path)


def test_chunked_and_full_layers(tmp_path):
    # Llama 4: chunked layers see only their chunk of 4 positions (counted from each row's first real token,
    # so a left-padded row keeps its chunks); the full layer sees everything.
    config = mask_config("llama4")
    assert_generates_like_transformers(config, tmp_path)


def test_recurrent_layers(tmp_path):
    # Mamba: conv and SSM states instead of keys and values, taken as `cache_params`, and no attention at all.
    config = transformers.MambaConfig(
        vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4
    )
    assert_generates_like_transformers(config, tmp_path)


def test_hybrid_attention_and_recurrent_layers(tmp_path):
    # Jamba: a Mamba layer (its padding mask the prompt's part of the 2-D mask) and an attention layer.
    config = transformers.JambaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        num_experts=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_dt_rank=8,
        use_mamba_kernels=False,
    )
    assert_generates_like_transformers(config, tmp_path)


def test_model_counting_positions_from_the_cache(tmp_path):
    # BART's decoder ignores position_ids and counts positions from the cache length, which padding the
    # prompt into a length bucket would shift.
    config = transformers.BartConfig(
        vocab_size=64,
        d_model=32,
        decoder_layers=2,
        encoder_layers=2,
        decoder_attention_heads=4,
        encoder_attention_heads=4,
        decoder_ffn_dim=64,
        encoder_ffn_dim=64,
        max_position_embeddings=64,
        forced_eos_token_id=None,
    )
    assert_generates_like_transformers(config, tmp_path)


COUNTING_FROM_THE_CACHE_LENGTH = {
    # torch.arange(past, past + n) over the cache's length, with no position_ids to take instead
    "mvp": lambda: transformers.MvpConfig(
        vocab_size=64, d_model=32, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
        encoder_attention_heads=4, decoder_ffn_dim=64, encoder_ffn_dim=64, max_position_embeddings=64,
    ),
    "trocr": lambda: transformers.TrOCRConfig(
        vocab_size=64, d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
        max_position_embeddings=64,
    ),
    "roformer": lambda: transformers.RoFormerConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, is_decoder=True,
    ),
    # an index clipped with it: max(0, 1 - (n + past)) slices the ALiBi biases
    "mpt": lambda: transformers.MptConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64,
    ),
    # a check of the count against its sinusoid table's size (grown in Python when it is too small)
    "xglm": lambda: transformers.XGLMConfig(
        vocab_size=64, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=64,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(COUNTING_FROM_THE_CACHE_LENGTH))
def test_model_computing_with_the_cache_length(tmp_path, name):
    """The decode step's cache length is traced; these models build ranges from it or compare it with a
    number in Python (they failed to trace: TracerBoolConversionError, ConcretizationTypeError)."""
    assert_generates_like_transformers(COUNTING_FROM_THE_CACHE_LENGTH[name](), tmp_path)


def test_model_positioned_by_the_cache_length_and_masking_no_key(tmp_path):
    # ProphetNet's decoder takes a decode step's position from the cache length with int() (which fails to
    # trace), its relative-position buckets from the keys' indices, and masks no key; its first n-gram
    # stream gives the logits. hfax.patches.longtail.prophetnet gives it transformers' positions, buckets and masks.
    assert_generates_like_transformers(prophetnet_config(), tmp_path)


def test_indexer_choosing_keys_per_query_in_a_loop(tmp_path):
    # Qwen4-Exp's indexer lists each query's visible keys with nonzero (no static shape) and its cache keeps
    # the keys' positions, read from their end: hfax.patches.longtail.qwen4_exp chooses the same keys for all queries
    # at once, and the model decodes without a cache (each step re-reads the sequence).
    config = looping_config("qwen4_exp")
    with pytest.warns(UserWarning, match="decodes without a cache: its indexer"):
        assert_generates_like_transformers(config, tmp_path)


def test_a_family_trait_changes_what_generate_does(tmp_path):
    # What a plugin answers through hfax_generation_traits reaches generate: a reason against a static cache
    # makes the model decode without one (transformers' tokens still), a refusal stops the call before
    # anything compiles.
    from hfax.backends.jax import monitor
    from hfax.generation.traits import GenerationTraits

    class Traits:
        traits = GenerationTraits(no_static_cache="a test plugin keeps its state elsewhere")

        @hfax.hookimpl
        def hfax_generation_traits(self, model, config):
            return self.traits if config.model_type == "llama" else None

    hfax.register(Traits(), name="test-traits")
    try:
        with pytest.warns(UserWarning, match="decodes without a cache: a test plugin keeps"):
            assert_generates_like_transformers(tiny_config("llama"), tmp_path)
        Traits.traits = GenerationTraits(refused="this test refuses it; run it elsewhere")
        model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
        compiles = monitor.snapshot().compiles
        with pytest.raises(NotImplementedError, match="this test refuses it"):
            model.generate(np.array([[5, 9, 13]]), max_new_tokens=2)
        assert monitor.snapshot().compiles == compiles
    finally:
        hfax.unregister("test-traits")


def test_forced_eos_and_suppressed_first_tokens(tmp_path):
    # BART-family generation configs force EOS as the last token; Whisper's suppress tokens as the first.
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=2,
    )
    assert_generates_like_transformers(
        config, tmp_path, forced_eos_token_id=2, begin_suppress_tokens=[3, 4, 5]
    )


def test_sparse_attention_indexer_keys(tmp_path):
    # DeepSeek V3.2: each layer's indexer keeps keys of its own, which pick the keys attention may see. Top-k
    # over all of them: torch and JAX break ties (ReLU'd scores are often exactly 0) in different orders.
    config = transformers.DeepseekV32Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        index_topk=64,
        index_head_dim=16,
        index_n_heads=2,
        mlp_layer_types=["dense", "dense"],
    )
    assert_generates_like_transformers(config, tmp_path)


def test_model_without_a_cache(tmp_path):
    # OpenAI GPT takes no cache: like transformers, generate reads the whole sequence at every step.
    config = transformers.OpenAIGPTConfig(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64
    )
    assert_generates_like_transformers(config, tmp_path)


def test_a_cache_of_another_kind_is_refused(tmp_path):
    # RWKV keeps its recurrent state in `state`: re-reading the sequence every step would not give its tokens.
    config = transformers.RwkvConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
    )
    save_tiny(config, tmp_path)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    with pytest.raises(NotImplementedError, match="takes 'state'"):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=2)


@pytest.mark.parametrize("name", ["dbrx", "jetmoe", "longcat_flash", "xmod"])
def test_experts_looping_over_the_batch(tmp_path, name):
    # transformers loops in Python over the experts a batch hits (a data-dependent count, which no traced
    # program has); their family plugins (hfax.patches.longtail) run every expert on every token instead: the same tokens.
    assert_generates_like_transformers(looping_config(name), tmp_path)


def test_language_adapters_chosen_per_row(tmp_path):
    # X-MOD runs each row through its own language's adapter; rows of two languages in one batch give
    # transformers' logits, in the jitted forward too (the boolean gather had no static shape).
    import jax
    import torch

    reference = save_tiny(looping_config("xmod"), tmp_path, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    ids, languages = np.array([[5, 9, 13, 2, 44], [3, 8, 21, 7, 30]]), np.array([2, 0])
    with torch.no_grad():
        expected = reference(
            input_ids=torch.as_tensor(ids), lang_ids=torch.as_tensor(languages)
        ).logits.numpy()
    forward = jax.jit(lambda i, lang: model(input_ids=i, lang_ids=lang).logits)
    np.testing.assert_allclose(np.asarray(forward(ids, languages)), expected, atol=1e-4, rtol=0)


def test_experts_of_a_class_that_defaults_to_its_eager_loop(tmp_path):
    # OpenAI Privacy Filter picks transformers' eager expert loop when nobody asks (`nonzero` of the experts
    # a batch hits, which jit cannot size); hfax runs its experts by the grouped path JAX lowers instead,
    # with transformers' logits for a padded batch.
    import jax

    expected, inputs, real = eager_experts_batch(tmp_path)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    forward = jax.jit(lambda i, m: model(input_ids=i, attention_mask=m).logits)
    got = np.asarray(forward(inputs["input_ids"], inputs["attention_mask"]))
    np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=0)
