"""Decode loops on CPU read each allowed gated MLP's gate and up weights from one stacked copy, and still choose
transformers' tokens."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import hfax
from hfax.backends.jax import fusion, generation
from hfax.generation import resolve
from hfax.testing import left_padded, reference_generate, save_tiny

PROMPTS = [[1, 17, 300, 42, 9, 77, 5], [1, 250, 3, 88]]
NEW = generation.TRANSPOSE_FROM_STEPS
INTERMEDIATE, LAYERS = 96, 2
MLPS = tuple(f"model.layers.{i}.mlp" for i in range(LAYERS))


def llama_config(**overrides):
    import transformers

    options = dict(
        vocab_size=512, hidden_size=64, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    return transformers.LlamaConfig(**{**options, **overrides})


def load(directory, allowed: bool):
    """hfax's model of the checkpoint in ``directory``, its MLPs allowed to stack (as the Llama family's patch
    does) or with every patch undone (as without a family plugin)."""
    model = hfax.AutoModelForCausalLM.from_pretrained(str(directory), backend="jax")
    hfax.unpatch(model.module)
    if allowed:
        fusion.allow(model.module, hfax.Patcher(model.module))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    os.environ.setdefault("HFAX_CACHE", str(tmp_path_factory.mktemp("hfax-cache")))  # not the user's cache
    directory = tmp_path_factory.mktemp("llama")
    return directory, save_tiny(llama_config(), directory, spread=True)


@pytest.fixture(scope="module")
def allowed(checkpoint):
    directory, reference = checkpoint
    return reference, load(directory, allowed=True)


def static_for(model, new):
    ids, mask = left_padded(PROMPTS)
    ids, mask, settings = resolve(model, ids, mask, {"max_new_tokens": new}, generation.OPTIONAL)
    return generation._arguments(model, ids, mask, settings)[1]


def test_which_loops_stack_which_mlps(allowed, checkpoint):
    _, model = allowed
    assert generation._stacked_mlps(model, static_for(model, NEW)) == MLPS
    assert generation._stacked_mlps(model, static_for(model, NEW // 2)) == ()  # the copy would not pay
    plain = load(checkpoint[0], allowed=False)  # no family vouched for its MLPs
    assert generation._stacked_mlps(plain, static_for(plain, NEW)) == ()


def test_only_bias_free_gated_mlps_are_allowed():
    from transformers.models.llama.modeling_llama import LlamaMLP

    assert fusion.gated(LlamaMLP(llama_config()))
    assert not fusion.gated(LlamaMLP(llama_config(mlp_bias=True)))  # its biases would need stacking too
    assert not fusion.gated(torch.nn.Linear(4, 4))


def gate_up_products(model, prompts, width):
    """How many products in ``generate``'s program give ``width`` outputs for each decode step's rows."""
    hlo = generation.lower(model, *left_padded(prompts), max_new_tokens=NEW).compile().as_text()
    return len(re.findall(rf"= f32\[{len(prompts)},{width}\]\{{1,0\}} dot\(", hlo))


@pytest.mark.parametrize("rows", [1, 2])  # one row reads the weights as they are, two from a transposed copy
def test_decode_loop_multiplies_by_the_stacked_copy(allowed, checkpoint, rows):
    _, model = allowed
    prompts = PROMPTS[:rows]
    assert gate_up_products(model, prompts, 2 * INTERMEDIATE) == LAYERS
    assert gate_up_products(model, prompts, INTERMEDIATE) == 0
    plain = load(checkpoint[0], allowed=False)
    assert gate_up_products(plain, prompts, INTERMEDIATE) == 2 * LAYERS  # what the loop runs unstacked
    assert gate_up_products(plain, prompts, 2 * INTERMEDIATE) == 0


@pytest.mark.parametrize("rows", [1, 2])
def test_tokens_are_transformers_tokens(allowed, rows):
    reference, model = allowed
    ids, mask = left_padded(PROMPTS[:rows])
    options = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    expected = reference_generate(reference, ids, mask, **options)
    np.testing.assert_array_equal(np.asarray(model.generate(ids, mask, **options)), expected)


def test_forward_and_unpatch_use_the_weights_the_model_holds(allowed, checkpoint):
    # Outside a decode loop an allowed MLP has no stacked weight and runs transformers' forward.
    reference, model = allowed
    ids, mask = left_padded(PROMPTS)
    with torch.no_grad():
        expected = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits.numpy()
    actual = np.asarray(model(input_ids=ids, attention_mask=mask).logits)
    real = mask.astype(bool)
    np.testing.assert_allclose(actual[real], expected[real], atol=1e-4, rtol=0)
    patched = load(checkpoint[0], allowed=True).module
    mlp = patched.model.layers[0].mlp
    assert mlp.forward.__func__ is fusion._forward and getattr(mlp, fusion.ALLOWED)
    hfax.unpatch(patched)
    assert "forward" not in vars(mlp) and not hasattr(mlp, fusion.ALLOWED)
