"""The Llama family on the JAX backend: detection, its patch, and parity with PyTorch for every model type."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

import hfax
from hfax.patches.llama import plugin
from hfax.testing import assert_same_greedy, assert_same_logits, save_tiny

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # inside the tiny vocabulary
WINDOW = 8
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON),
    "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=WINDOW),
    # Layer 0 full, layer 1 sliding: a hybrid cache.
    "qwen2": lambda: transformers.Qwen2Config(
        **COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16),
    "ministral": lambda: transformers.MinistralConfig(**COMMON, head_dim=16, sliding_window=WINDOW),
    # Every other layer without rotary positions (NoPE).
    "smollm3": lambda: transformers.SmolLM3Config(**COMMON, **SPECIAL, no_rope_layer_interval=2),
    # Granite's multipliers reach attention as its scaling.
    "granite": lambda: transformers.GraniteConfig(
        **COMMON,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=4.0,
    ),
}
PROMPT = [5, 17, 33, 2, 99, 64, 7, 8, 12, 100, 3, 45]
NEW_TOKENS = 24  # prompt plus generation (36) is well past the sliding window (8)
PADDED_BATCH = [PROMPT[:5], PROMPT]


def test_every_claimed_model_type_is_tested():
    assert set(CONFIGS) == set(plugin.MODEL_TYPES)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """(directory, transformers' model on PyTorch/CPU) of a tiny random model of one model type, float32."""
    path = tmp_path_factory.mktemp(request.param)
    return path, save_tiny(CONFIGS[request.param](), path)


@pytest.fixture(scope="module")
def pair(checkpoint):
    """(transformers on PyTorch/CPU, hfax on JAX) for one model type."""
    path, reference = checkpoint
    return reference, hfax.AutoModelForCausalLM.from_pretrained(path, backend="jax")


def test_claims_its_model_types_and_nothing_else(checkpoint):
    path, _ = checkpoint
    assert hfax.detect_family(transformers.AutoConfig.from_pretrained(path)) == "llama"
    assert plugin.hfax_detect_model(config=transformers.GPT2Config()) is None


def test_greedy_tokens_equal_pytorch(pair):
    reference, model = pair
    assert model.family == "llama" and model.config._attn_implementation == "hfax_jax"
    assert_same_greedy(model, reference, PROMPT, NEW_TOKENS)


def test_padded_batch_logits_equal_pytorch(pair):
    reference, model = pair
    assert_same_logits(model, reference, PADDED_BATCH)


def test_decode_compiles_once_per_bucket(pair):
    _, model = pair
    model.generate(
        np.asarray([PROMPT]), max_new_tokens=NEW_TOKENS
    )  # compiled by now, whatever ran first
    model.generate(np.asarray([PROMPT[:9]]), max_new_tokens=NEW_TOKENS - 3)  # same buckets
    assert model.last_generate_stats.compiles == 0


def test_patch_is_idempotent_undoable_and_keeps_a_chosen_attention(checkpoint):
    path, _ = checkpoint
    hook = hfax.get_plugin_manager().hook
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    for _ in range(2):
        hook.hfax_patch_model(
            model=model, family="llama", backend="jax", patcher=hfax.Patcher(model)
        )
    assert model.config._attn_implementation == "hfax_jax" and len(hfax.Patcher(model).patched) == 1
    hfax.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    eager = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    hook.hfax_patch_model(model=eager, family="llama", backend="jax", patcher=hfax.Patcher(eager))
    assert eager.config._attn_implementation == "eager"
    hook.hfax_patch_model(
        model=model, family="llama", backend="torch_xla", patcher=hfax.Patcher(model)
    )
    assert model.config._attn_implementation == "sdpa"
