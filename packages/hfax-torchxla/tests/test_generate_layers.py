"""Generate on PyTorch/XLA against transformers for the masks a model needs (the 2-D mask of BLOOM, chunked
attention), mixture-of-experts layers, beam search, and what the backend refuses.

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
    bert2bert_config,
    eager_experts_batch,
    fsmt_config,
    led_config,
    left_padded,
    mask_config,
    prophetnet_config,
    reference_generate,
    save_tiny,
    switch_config,
    tiny_config,
)

PROMPTS = [[5, 17, 33, 9, 41, 8, 22, 60], [12, 50, 7, 31, 19]]
NEW_TOKENS = 10
PAD = 1


def load(config: Any, directory) -> tuple[Any, Any]:
    reference = save_tiny(config, directory, spread=True)
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")


def assert_translates_like_transformers(config: Any, directory) -> None:
    """An encoder-decoder's greedy tokens for the left-padded prompts as sources equal transformers'."""
    reference = save_tiny(config, directory, auto_class="AutoModelForSeq2SeqLM", spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = {"max_new_tokens": NEW_TOKENS, "pad_token_id": PAD}
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    np.testing.assert_array_equal(actual, expected)


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
    config = mask_config("bloom")
    assert_generates_like_transformers(config, tmp_path)


def test_chunked_and_full_layers(tmp_path):
    # Llama 4: chunked layers see only their chunk of 4 positions (counted from each row's first real token,
    # so a left-padded row keeps its chunks); the full layer sees everything.
    config = mask_config("llama4")
    assert_generates_like_transformers(config, tmp_path)


def test_beam_search_matches_transformers(tmp_path):
    # The cache's rows follow the beams they extend: a wrong reorder changes the tokens of these weights.
    reference, model = load(tiny_config("llama"), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=PAD, num_beams=3, num_return_sequences=2)
    expected = reference_generate(reference, ids, mask, **options)
    actual = as_numpy(model.generate(ids, attention_mask=mask, **options))
    np.testing.assert_array_equal(actual, expected)


MIXTURE_OF_EXPERTS = {
    # transformers' default expert layout: [experts, out, in] weights, gate and up concatenated
    "mixtral": lambda: transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    # [experts, in, out] weights with biases, gate and up interleaved, a gate of its own
    "gpt_oss": lambda: transformers.GptOssConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        head_dim=8,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
    ),
    # experts and a mixture of attention heads, whose tokens hfax.patches.longtail.jetmoe's gating sorts by expert
    "jetmoe": lambda: transformers.JetMoeConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_key_value_heads=2,
        kv_channels=8,
        intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    ),
}


@pytest.mark.parametrize("name", sorted(MIXTURE_OF_EXPERTS))
def test_mixture_of_experts(name, tmp_path):
    # transformers' grouped experts count tokens with an integer histc torch_xla cannot run, and JetMoE
    # splits its tokens by a Python list of counts; hfax runs every expert on every token and weights them
    # by the router: the forward and the tokens stay transformers'.
    reference, model = load(MIXTURE_OF_EXPERTS[name](), tmp_path)
    ids, mask = left_padded(PROMPTS, pad_token_id=PAD)
    expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    actual = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    real = mask.astype(bool)
    np.testing.assert_allclose(
        as_numpy(actual)[real], expected.detach().numpy()[real], atol=1e-4, rtol=1e-4
    )
    assert_generates_like_transformers(MIXTURE_OF_EXPERTS[name](), tmp_path / "again")


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


RECURRENT = {
    # recurrent layers alone, their cache passed as cache_params
    "mamba": lambda: transformers.MambaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2
    ),
    # mamba layers (conv and SSM states in transformers' LinearAttentionLayer) beside attention layers
    "bamba": lambda: transformers.BambaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_chunk_size=8,
    ),
    # "hybrid" cache layers: attention and mamba in every layer (LinearAttentionAndStaticFullAttentionLayer)
    "falcon_h1": lambda: transformers.FalconH1Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_chunk_size=8,
    ),
    # a layer that keeps nothing (an MLP) between a mamba layer and the attention layer: transformers finds
    # the attention layer's cache by skipping dummy layers
    "nemotron_h": lambda: transformers.NemotronHConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        layers_block_type=["linear_attention", "mlp", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=8,
        n_groups=1,
        chunk_size=8,
    ),
}


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_layers(name, tmp_path):
    # The prompt's padding must not reach the recurrent states: prefill hands the model the prompt's 2-D
    # mask, whose last columns its mamba layers multiply their input by.
    assert_generates_like_transformers(RECURRENT[name](), tmp_path)


INDEXED = {
    # GLM-5's and DeepSeek V3.2's indexed attention: an indexer keeps keys of its own beside the keys and
    # values and picks each query's top-k slots from all of them.
    "glm_moe_dsa": lambda: transformers.GlmMoeDsaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        index_topk=4,
        index_head_dim=16,
        index_n_heads=4,
        mlp_layer_types=["dense", "sparse"],
    ),
    "deepseek_v32": lambda: transformers.DeepseekV32Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        mlp_layer_types=["dense", "sparse"],
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        index_topk=4,
        index_head_dim=16,
        index_n_heads=4,
    ),
}


@pytest.mark.parametrize("name", sorted(INDEXED))
def test_indexed_attention(name, tmp_path):
    # A top-k of 4 over 8-token prompts: a wrong indexer key (unwritten, or not moved with its beam) picks
    # other slots.
    assert_generates_like_transformers(INDEXED[name](), tmp_path)


def test_indexed_attention_beams(tmp_path):
    # Beams reorder the indexer keys with the keys and values. transformers' own beams on a left-padded row
    # of this model differ from the same prompt alone, so each row is compared with its prompt alone.
    reference, model = load(INDEXED["glm_moe_dsa"](), tmp_path)
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


def test_model_without_a_cache(tmp_path):
    # GPT-1 keeps no cache: every step reads the prompt and the tokens so far, as transformers' generate does.
    config = transformers.OpenAIGPTConfig(
        n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64
    )
    assert_generates_like_transformers(config, tmp_path)
    assert_generates_like_transformers(config, tmp_path / "beams", num_beams=3)


def test_decoder_positions_counted_from_its_ids(tmp_path):
    # M2M-100's decoder numbers its positions from its ids (int32) plus the cache's count of tokens; a 0-d
    # int64 count in that sum made torch_xla's dynamo bridge build an op XLA rejects.
    config = transformers.M2M100Config(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        pad_token_id=PAD,
        decoder_start_token_id=2,
    )
    assert_translates_like_transformers(config, tmp_path)


COUNTED_POSITIONS = {
    # BERT as the decoder of an EncoderDecoderModel slices position_ids[:, past : past + n].
    "bert2bert": lambda: bert2bert_config(PAD),
    "roformer": lambda: transformers.RoFormerConfig(
        vocab_size=64,
        hidden_size=32,
        embedding_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        pad_token_id=PAD,
        is_decoder=True,
    ),
    # LED's encoder is Longformer's windowed attention (a window shorter than the prompts), and its decoder
    # applies no mask to a one-token step (hfax.patches.longtail.step_masks).
    "led": lambda: led_config(PAD),
    # FSMT's sinusoidal table grows itself when the positions outrun it, a branch on the count.
    "fsmt": lambda: fsmt_config(PAD),
    # MPT chooses its ALiBi bias's query rows by the count (a slice at max(0, rows - (n + past))).
    "mpt": lambda: transformers.MptConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, pad_token_id=PAD
    ),
}


@pytest.mark.parametrize("name", sorted(COUNTED_POSITIONS))
def test_positions_counted_from_the_cache_length(name, tmp_path):
    # RoFormer's, LED's and BERT's decoders number a step's positions from the cache's count
    # (torch.arange(past, past + n), a slice), which torch_xla's dynamo bridge refused to size, FSMT
    # grows its table when they outrun it, MPT slices its bias by it: hfax.patches.longtail.cache_positions.
    config = COUNTED_POSITIONS[name]()
    if config.is_encoder_decoder:
        assert_translates_like_transformers(config, tmp_path)
    else:
        assert_generates_like_transformers(config, tmp_path)


def test_prophetnet_decodes_over_the_static_cache(tmp_path):
    # ProphetNet's decoder builds its prefill masks for the fed tokens alone (the full-length cache gave it
    # 26 slots), and branches on the cache's count (a tensor in a decode step) and sets a ContextVar,
    # neither of which dynamo traces: hfax.patches.longtail.prophetnet. Decoder-only, then encoder-decoder.
    assert_generates_like_transformers(prophetnet_config(), tmp_path / "decoder")
    assert_translates_like_transformers(prophetnet_config(), tmp_path / "seq2seq")


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


def test_switch_transformers_routes_in_one_graph(tmp_path):
    # Switch Transformers' router moves its classifier module in its forward (`Module.to`), which dynamo
    # cannot trace, and its experts loop over the ones a batch hits: hfax.patches.longtail.switch_transformers routes and runs them
    # statically; the translations stay transformers'.
    assert_translates_like_transformers(switch_config(PAD), tmp_path)
