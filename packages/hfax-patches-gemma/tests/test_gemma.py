"""The Gemma family on the JAX backend: detection, its patch, and parity with PyTorch for every model type."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

import hfax
from hfax.patches.gemma import plugin
from hfax.testing import assert_same_greedy, assert_same_logits, save_tiny

WINDOW = 8
TEXT = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=128,
)
HYBRID = dict(
    sliding_window=WINDOW, layer_types=["sliding_attention", "sliding_attention", "full_attention"]
)
VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,
)
CONFIGS = {
    "gemma": lambda: transformers.GemmaConfig(**TEXT),
    "gemma2": lambda: transformers.Gemma2Config(
        **TEXT, **HYBRID, attn_logit_softcapping=50.0, final_logit_softcapping=30.0
    ),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(**TEXT, **HYBRID),
    # The multimodal checkpoint, used for text: its windows live in text_config.
    "gemma3": lambda: transformers.Gemma3Config(
        text_config={**TEXT, **HYBRID},
        vision_config=VISION,
        mm_tokens_per_image=4,
        boi_token_index=297,
        eoi_token_index=298,
        image_token_index=299,
    ),
}
#: What each model type attends with on JAX once patched.
ATTENTION = {
    "gemma": "hfax_jax",
    "gemma2": "eager",
    "gemma3_text": "hfax_jax",
    "gemma3": "hfax_jax",
}
PROMPT = [2, 5, 17, 33, 2, 99, 64, 7, 8, 12, 100, 3]
NEW_TOKENS = 24  # prompt plus generation (36) is well past the sliding window (8)
PADDED_BATCH = [PROMPT[:5], PROMPT + [45, 46, 47, 48]]


def test_every_claimed_model_type_is_tested():
    assert set(CONFIGS) == set(plugin.MODEL_TYPES) == set(ATTENTION)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """(model type, directory, transformers' model on PyTorch/CPU) of a tiny random model, float32."""
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, save_tiny(CONFIGS[request.param](), path)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    """(model type, transformers on PyTorch/CPU, hfax on JAX)."""
    model_type, path, reference = checkpoint
    return model_type, reference, hfax.AutoModelForCausalLM.from_pretrained(path, backend="jax")


def test_claims_its_model_types_and_nothing_else(checkpoint):
    _, path, _ = checkpoint
    assert hfax.detect_family(transformers.AutoConfig.from_pretrained(path)) == "gemma"
    assert plugin.hfax_detect_model(config=transformers.LlamaConfig()) is None


def test_greedy_tokens_equal_pytorch_past_the_sliding_window(loaded):
    model_type, reference, model = loaded
    assert model.family == "gemma"
    assert model.config.get_text_config()._attn_implementation == ATTENTION[model_type]
    assert_same_greedy(model, reference, PROMPT, NEW_TOKENS)


def test_padded_batch_logits_equal_pytorch(loaded):
    _, reference, model = loaded
    assert_same_logits(model, reference, PADDED_BATCH)


def test_decode_compiles_once_per_bucket(loaded):
    _, _, model = loaded
    model.generate(
        np.asarray([PROMPT]), max_new_tokens=NEW_TOKENS
    )  # compiled by now, whatever ran first
    model.generate(np.asarray([PROMPT[:9]]), max_new_tokens=NEW_TOKENS - 3)  # same buckets
    assert model.last_generate_stats.compiles == 0


def test_the_patch_leaves_the_vision_tower_and_is_undone_by_unpatch(tmp_path):
    model = save_tiny(CONFIGS["gemma3"](), tmp_path)
    hfax.get_plugin_manager().hook.hfax_patch_model(
        model=model, family="gemma", backend="jax", patcher=hfax.Patcher(model)
    )
    assert model.config.text_config._attn_implementation == "hfax_jax"
    assert model.config.vision_config._attn_implementation == "sdpa"
    hfax.unpatch(model)
    assert model.config.text_config._attn_implementation == "sdpa"
