"""Tiny transformers configs by name, hand-set where a test needs a particular shape (a window shorter than
its prompts, layers of two kinds, two ``<eos>`` per row).

Every config here is built from its transformers config class (2 layers, hidden size 32 or 64, a
vocabulary of 64 or 128), so the class's own validation and derived attributes run. A config of any
architecture, shrunk generically from the class's defaults, is :func:`hfax.testing.shrink.shrunk_config`.
"""

from __future__ import annotations

from typing import Any

#: Special token ids of the tiny configs: padding 0, BOS 1, EOS 2.
TINY_SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


#: The sizes the tiny Llama-style decoders of :func:`tiny_config` share.
_DECODER_SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=128,
    max_position_embeddings=256,
)


def tiny_config(name: str) -> Any:
    """A tiny transformers config (2 layers, hidden size 64, vocabulary 128) every backend is tested on:
    ``"llama"`` (grouped-query attention), ``"gemma"`` (one key/value head), ``"mistral"`` (a sliding window of 5),
    ``"gemma2"`` (sliding and full layers), ``"gemma3"`` (a sliding layer of window 4, then a full one; tied
    embeddings, query/key norms), ``"gpt2"``, ``"gpt_neo"`` (a local layer of window 40), ``"moshi"`` (a cache window of 16 its masks ignore), ``"mamba"`` (recurrent layers, no attention), ``"bert"``."""
    import transformers

    if name == "llama":
        return transformers.LlamaConfig(
            **_DECODER_SIZES,
            num_key_value_heads=2,
            **TINY_SPECIAL,
        )
    if name == "gemma":
        return transformers.GemmaConfig(
            **_DECODER_SIZES,
            num_key_value_heads=1,
            head_dim=16,
            **TINY_SPECIAL,
        )
    if name == "mistral":  # a sliding window shorter than the prompts the tests use
        return transformers.MistralConfig(
            **_DECODER_SIZES,
            num_key_value_heads=2,
            sliding_window=5,
            **TINY_SPECIAL,
        )
    if name == "gemma2":  # hybrid: sliding and full attention layers alternate
        return transformers.Gemma2Config(
            **_DECODER_SIZES,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=5,
            **TINY_SPECIAL,
        )
    if name == "gemma3":
        return transformers.Gemma3TextConfig(
            **_DECODER_SIZES,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            **TINY_SPECIAL,
        )
    if name == "gpt2":
        return transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, **TINY_SPECIAL
        )
    if name == "gpt_neo":  # a global layer, then a local one whose window is its own table
        return transformers.GPTNeoConfig(
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=40,
            vocab_size=128,
            max_position_embeddings=256,
            **TINY_SPECIAL,
        )
    if (
        name == "moshi"
    ):  # Moshi's text decoder: its config's window reaches transformers' cache only
        return transformers.MoshiConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            ffn_dim=128,
            sliding_window=16,
            audio_vocab_size=64,
            num_codebooks=2,
            vocab_size=128,
            max_position_embeddings=256,
            **TINY_SPECIAL,
        )
    if name == "mamba":
        return transformers.MambaConfig(
            hidden_size=64,
            state_size=8,
            num_hidden_layers=2,
            vocab_size=128,
            conv_kernel=4,
            **TINY_SPECIAL,
        )
    if name == "bert":
        return transformers.BertConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=128,
            max_position_embeddings=128,
            num_labels=3,
        )
    raise ValueError(
        f"no tiny config called {name!r}; there are llama, gemma, mistral, gemma2, gemma3, gpt2, "
        "gpt_neo, moshi, mamba and bert"
    )


#: The multimodal models every backend's generate is tested on, by name: their transformers auto class.
MULTIMODAL = {
    "llava": "AutoModelForImageTextToText",
    "qwen2_vl": "AutoModelForImageTextToText",
    "gemma3": "AutoModelForImageTextToText",
    "whisper": "AutoModelForSpeechSeq2Seq",
}


#: The image placeholder token of :func:`tiny_multimodal_config`'s models, and how many each image takes.
IMAGE_TOKEN = 3
IMAGE_TOKENS = {"llava": 16, "qwen2_vl": 4, "gemma3": 4}


#: The sizes of the tiny vision encoders (ViT-style: 16 x 16 images in 4 x 4 patches) the tests build.
ENCODER_SIZES = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
)


def tiny_multimodal_config(name: str) -> Any:
    """A tiny config of one of :data:`MULTIMODAL` (2 layers, hidden size 32, 16 x 16 images in 4 x 4
    patches; Whisper: 8 mel bins, 32 frames); :func:`multimodal_inputs` is what its processor returns."""
    import transformers

    text = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    encoder = dict(**ENCODER_SIZES, image_size=16, patch_size=4)
    if name == "llava":
        return transformers.LlavaConfig(
            vision_config=transformers.CLIPVisionConfig(**encoder, projection_dim=32),
            text_config=transformers.LlamaConfig(**text), image_token_id=IMAGE_TOKEN,
            projector_hidden_act="gelu", vision_feature_layer=-1,
        )  # fmt: skip
    if name == "qwen2_vl":
        rope = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}
        vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, in_chans=3)  # fmt: skip
        return transformers.Qwen2VLConfig(
            text_config=dict(**text, rope_parameters=rope), vision_config=vision,
            image_token_id=IMAGE_TOKEN, video_token_id=4, vision_start_token_id=5,
            vision_end_token_id=6,
        )  # fmt: skip
    if name == "gemma3":
        return transformers.Gemma3Config(
            vision_config=transformers.SiglipVisionConfig(**encoder),
            text_config=transformers.Gemma3TextConfig(
                **{**text, "num_key_value_heads": 1}, head_dim=8, sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
            ),
            mm_tokens_per_image=4, image_token_index=IMAGE_TOKEN, boi_token_index=4,
            eoi_token_index=5,
        )  # fmt: skip
    if name == "whisper":
        return transformers.WhisperConfig(
            vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, max_target_positions=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
            suppress_tokens=[], begin_suppress_tokens=[],
        )  # fmt: skip
    raise ValueError(f"no tiny multimodal config called {name!r}; there are {sorted(MULTIMODAL)}")


def bert2bert_config(pad_token_id: int) -> Any:
    """A tiny ``EncoderDecoderConfig`` of two BERTs (the decoder with cross-attention), start token 2 and
    end token 3."""
    import transformers

    bert = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=pad_token_id,
    )  # fmt: skip
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.BertConfig(**bert),
        transformers.BertConfig(**bert, is_decoder=True, add_cross_attention=True),
    )
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 2, pad_token_id, 3
    return config


def fsmt_config(pad_token_id: int) -> Any:
    """A tiny ``FSMTConfig`` (English to German), start token 2, end token 2."""
    import transformers

    return transformers.FSMTConfig(
        langs=["en", "de"], src_vocab_size=64, tgt_vocab_size=64, d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=pad_token_id, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=2, num_beams=1,
    )  # fmt: skip


def prophetnet_config() -> Any:
    """A tiny ``ProphetNetConfig``: two predicting n-gram streams, 8 relative-position buckets."""
    import transformers

    return transformers.ProphetNetConfig(
        vocab_size=64, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2,
        num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4, ngram=2,
        num_buckets=8, relative_max_distance=16, max_position_embeddings=64,
    )  # fmt: skip


def reformer_config() -> Any:
    """A tiny ``ReformerConfig`` of two local-attention layers (chunks of 4 tokens) whose 8 x 8 grid of axial
    positions is longer than the prompts the tests give it."""
    import transformers

    return transformers.ReformerConfig(
        hidden_size=64, num_attention_heads=4, attention_head_size=16, feed_forward_size=128,
        vocab_size=128, attn_layers=["local", "local"], local_attn_chunk_length=4,
        axial_pos_embds_dim=[32, 32], axial_pos_shape=[8, 8], max_position_embeddings=64,
        is_decoder=True, pad_token_id=0,
    )  # fmt: skip


def mask_config(name: str) -> Any:
    """A tiny config of a model whose attention mask hfax builds apart from transformers' ``masking_utils``:
    ``"bloom"`` (ALiBi biases from the 2-D mask, which it must get as long as its keys) or ``"llama4"``
    (chunked layers that see only their chunk of 4 positions, then a full layer)."""
    import transformers

    configs = {
        "bloom": lambda: transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4),
        "llama4": lambda: transformers.Llama4TextConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            attention_chunk_size=4, num_local_experts=2,
            layer_types=["chunked_attention", "full_attention"], no_rope_layers=[1, 0], moe_layers=[],
        ),
    }  # fmt: skip
    return configs[name]()


def switch_config(pad_token_id: int) -> Any:
    """A tiny ``SwitchTransformersConfig``: 4 experts in every layer, each taking at most 3 tokens of a
    sequence; start token ``pad_token_id``, end token 1."""
    import transformers

    return transformers.SwitchTransformersConfig(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        num_experts=4, expert_capacity=3, encoder_sparse_step=1, decoder_sparse_step=1,
        relative_attention_num_buckets=8, decoder_start_token_id=pad_token_id,
        pad_token_id=pad_token_id, eos_token_id=1,
    )  # fmt: skip


def led_config(pad_token_id: int) -> Any:
    """A tiny ``LEDConfig`` whose encoder window (4 tokens) is shorter than the sources it is given: start
    and end token 2."""
    import transformers

    return transformers.LEDConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, attention_window=4,
        pad_token_id=pad_token_id, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip


def looping_config(name: str) -> Any:
    """A tiny config of a model whose transformers layers loop in Python over what a batch hits:
    ``"dbrx"`` (``[experts * ffn, hidden]`` weight matrices, a loop over the experts hit),
    ``"longcat_flash"`` (routed experts and identity experts numbered after them), ``"jetmoe"`` (experts
    and a mixture of attention heads, the tokens sorted by expert split by a list of counts), ``"xmod"``
    (language adapters, each row's chosen by its language id and gathered by a boolean mask),
    ``"qwen4_exp"`` (an indexer choosing each query's keys in a loop) or ``"kolibri1_1"`` (an indexer
    choosing each query's keys in a loop over the queries' first visible keys, with budgets small enough
    that a short prompt's queries choose, and a second indexed layer that reads the first's pool)."""
    import transformers

    configs = {
        "dbrx": lambda: transformers.DbrxConfig(
            vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
            ffn_config={"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2},
        ),
        "longcat_flash": lambda: transformers.LongcatFlashConfig(
            vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, num_key_value_heads=4,
            ffn_hidden_size=48, expert_ffn_hidden_size=16, n_routed_experts=4, zero_expert_num=2,
            moe_topk=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
            v_head_dim=8, head_dim=8, max_position_embeddings=64,
        ),
        "jetmoe": lambda: transformers.JetMoeConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8,
            intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        ),
        "xmod": lambda: transformers.XmodConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, is_decoder=True, languages=["en_XX", "de_DE", "fr_XX"],
            default_language="de_DE",
        ),
        "qwen4_exp": lambda: transformers.Qwen4ExpTextConfig(
            vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
            max_position_embeddings=64, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=4, ple_embed_dim=64,
            layer_types=["linear_attention", "indexed_attention"], indexer_n_heads=4,
            indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
        ),
        "kolibri1_1": lambda: transformers.Kolibri1_1Config(
            vocab_size=64, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts_per_tok=2,
            num_experts=4, max_position_embeddings=64, sliding_window=4,
            layer_types=["sliding_attention", "indexed_attention", "indexed_attention"], index_layers=[1],
            kv_source_layers=[0, 1, 1], index_topk=2, index_pool_size=4, index_compression=2,
            index_num_heads=2, index_num_local_tokens=1, index_num_sink_tokens=1, mlp_only_layers=[],
        ),
    }  # fmt: skip
    return configs[name]()
