"""Generate and forward on PyTorch/XLA against transformers for what the conformance suite
(test_conformance.py, :mod:`hfax.testing.conformance`) does not hold: beam search over the caches it
reorders, experts' forwards in one graph, a cache layer refused, a cache count read before its update,
GIT's branch on the count.

Tiny models with spread random weights (a broken cache or mask changes their tokens), a batch with a
left-padded row, the tokens of transformers' own ``generate`` on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax.backends.torchxla import runtime
from hfax.testing import (
    as_numpy,
    assert_same_continuation,
    conformance,
    eager_experts_batch,
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


def test_beam_search_matches_transformers(tmp_path):
    # The cache's rows follow the beams they extend: a wrong reorder changes the tokens of these weights.
    reference, model = load(tiny_config("llama"), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=PAD, num_beams=3, num_return_sequences=2)
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("name", ["gpt_oss", "jetmoe", "mixtral"])
def test_mixture_of_experts_forward(name, tmp_path):
    # transformers' grouped experts count tokens with an integer histc torch_xla cannot run, and JetMoE
    # splits its tokens by a Python list of counts; hfax runs every expert on every token and weights them
    # by the router: the forward and the tokens stay transformers'.
    reference, model = load(conformance.config(name), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    actual = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    real = mask.astype(bool)
    np.testing.assert_allclose(
        as_numpy(actual)[real], expected.detach().numpy()[real], atol=1e-4, rtol=1e-4
    )


def test_experts_of_a_class_that_defaults_to_its_eager_loop(tmp_path):
    # OpenAI Privacy Filter picks transformers' eager expert loop when nobody asks; it reads `nonzero` of
    # the experts a batch hits, where dynamo breaks the graph. hfax runs every expert on every token
    # instead: one graph, and transformers' logits.
    from torch._dynamo.utils import counters

    expected, inputs, real = eager_experts_batch(tmp_path)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="torch_xla")
    counters.clear()
    actual = model(**{name: torch.tensor(value) for name, value in inputs.items()}).logits
    np.testing.assert_allclose(as_numpy(actual)[real], expected[real], atol=1e-4, rtol=0)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_indexed_attention_beams(tmp_path):
    # Beams reorder the indexer keys with the keys and values. transformers' own beams on a left-padded row
    # of this model differ from the same prompt alone, so each row is compared with its prompt alone.
    reference, model = load(conformance.config("glm_moe_dsa"), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD, "num_beams": 3}
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    for row, prompt in enumerate(PROMPTS):
        alone = np.array([prompt])
        expected = reference_generate(reference, alone, np.ones_like(alone), **options)
        np.testing.assert_array_equal(actual[row, ids.shape[1] :], expected[0, len(prompt) :])


def test_cache_layer_it_cannot_hold_is_refused_before_compiling(tmp_path):
    # DeepSeek V4's compressed attention layers keep pooled keys no layer of this engine holds.
    config = transformers.DeepseekV4Config(
        vocab_size=64,
        hidden_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        q_lora_rank=24,
        num_experts_per_tok=2,
        n_routed_experts=4,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe"],
        sliding_window=8,
        index_n_heads=2,
        index_head_dim=8,
        index_topk=4,
        partial_rotary_factor=1.0,
        qk_rope_head_dim=8,
    )
    reference, model = load(config, tmp_path)
    compiled = runtime.counters().compiles
    with pytest.raises(NotImplementedError, match="'compressed_sparse_attention'.*backend='jax'"):
        model.generate(np.array([PROMPTS[0]]), max_new_tokens=4)
    assert runtime.counters().compiles == compiled
    ids = np.array([PROMPTS[0]])
    np.testing.assert_allclose(
        as_numpy(model(input_ids=torch.tensor(ids)).logits),
        reference(input_ids=torch.tensor(ids)).logits.detach().numpy(),
        atol=1e-4,
        rtol=1e-4,
    )


def test_cache_length_read_before_the_update(tmp_path):
    # Inkling counts its queries' relative positions from the cache length read before the cache's update;
    # transformers' StaticLayer adds to that count in place, so the positions were one token ahead and the
    # decode steps' logits a few 1e-6 off (prefill exact). Scores equal transformers' within float32 noise.
    config = transformers.InklingTextConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        swa_num_attention_heads=4,
        swa_num_key_value_heads=2,
        swa_head_dim=16,
        sliding_window_size=8,
        layer_types=["hybrid_sliding", "hybrid"],
        mlp_layer_types=["dense", "dense"],
    )
    reference, model = load(config, tmp_path)
    ids = np.array([[5, 17, 33, 9, 41, 8, 22, 60, 3, 4, 50, 40, 11, 12]])
    options = {"max_new_tokens": 4, "output_scores": True, "return_dict_in_generate": True}
    expected = reference.generate(torch.tensor(ids), do_sample=False, **options)
    actual = model.generate(ids, **options)
    for step, (want, got) in enumerate(zip(expected.scores, actual.scores)):
        np.testing.assert_allclose(
            as_numpy(got), want.numpy(), atol=1e-7, rtol=0, err_msg=f"step {step}"
        )


def test_model_without_a_cache_in_beams(tmp_path):
    # GPT-1 keeps no cache: every beam step reads the prompt and the tokens so far, as transformers' does.
    reference, model = load(conformance.config("openai_gpt"), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD, "num_beams": 3}
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    assert_same_continuation(expected, actual, pad_token_id=PAD)


def test_git_branching_on_the_cache_count(tmp_path):
    # GIT's model compares the cache's count with 0 (to widen a 2-D mask over its cached image tokens),
    # which dynamo cannot trace on a decode step's tensor count: hfax.patches.longtail.git.
    config = transformers.GitConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "image_size": 32, "patch_size": 16},
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
    )  # fmt: skip
    reference, model = load(config, tmp_path)
    options = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "pad_token_id": PAD}
    # transformers' own left-padded GIT rows differ from the same prompts alone (its padding leaks into
    # them), so each row is checked against its prompt generated alone.
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))[:, ids.shape[1] :]
    for row, prompt in enumerate(PROMPTS):
        alone = reference_generate(reference, np.array([prompt]), **options)[0, len(prompt) :]
        np.testing.assert_array_equal(actual[row], alone)
