"""Tiny configs of any transformers architecture, shrunk generically from the config class's defaults.

A config's defaults describe a real checkpoint (billions of parameters). ``shrunk_config`` turns them into a
model of ~100k parameters: every size is looked up by its key name in ``SIZES`` (hidden 64, 2 layers, 4
heads, 2 kv heads, ...), per-layer lists are cut to the kept layers (choosing layers of different types
where the model mixes them), token ids are moved into the small vocabulary, and sub-configs (text, vision,
audio) are shrunk the same way. The config class then rebuilds the config, so derived attributes and
validation run as for a real checkpoint. ``OVERRIDES`` holds the few per-architecture values a config
needs on top of that.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import transformers

LAYERS = 2
HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
VOCAB = 256
POSITIONS = 256
WINDOW = 8  # small enough that the test prompts and generations cross it

# Sizes by key name. A key listed here is set wherever it appears with an integer value.
SIZES: dict[str, int] = {
    **dict.fromkeys(
        (
            "hidden_size",
            "n_embd",
            "d_model",
            "embed_dim",
            "n_embed",
            "word_embed_proj_dim",
            "model_dim",
            "dim",
            "hidden_dim",
            "embedding_size",
            "input_embedding_size",
            "output_embedding_size",
            "lru_width",
            "d_embed",
            "emb_dim",
            "embedding_dim",
            "hidden_size_global",
            "backbone_hidden_size",
            "text_hidden_size",
            "out_hidden_size",
            "projector_input_dim",
            "projector_output_dim",
            "vision_output_dim",
            "n_embd_global",
        ),
        HIDDEN,
    ),
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "n_layers",
            "num_decoder_layers",
            "num_encoder_layers",
            "decoder_layers",
            "encoder_layers",
            "speech_encoder_layers",  # SeamlessM4T: 24 conformer layers amplify float32 rounding past 1e-4
            "depth",
            "num_blocks",
            "num_layers_per_stack",
        ),
        LAYERS,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "num_heads",
            "n_heads",
            "decoder_attention_heads",
            "encoder_attention_heads",
            "num_encoder_attention_heads",
            "num_decoder_attention_heads",
            "attention_heads",
            "swa_num_attention_heads",
            "linear_num_value_heads",
            "mamba_n_heads",
            "mamba_num_heads",
            "index_n_heads",
            "linear_num_heads",
        ),
        HEADS,
    ),
    **dict.fromkeys(
        (
            "num_key_value_heads",
            "n_kv_heads",
            "num_kv_heads",
            "multi_query_group_num",
            "num_query_groups",
            "swa_num_key_value_heads",
            "linear_num_key_heads",
        ),
        2,
    ),
    **dict.fromkeys(
        (
            "head_dim",
            "attention_head_size",
            "kv_channels",
            "d_head",
            "d_kv",
            "swa_head_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_head_dim",
            "mamba_head_dim",
            "mamba_headdim",
            "mamba_d_head",
            "qk_head_dim",
            "v_head_dim",
            "index_head_dim",
            "attention_head_dim",
            "global_head_dim",
        ),
        HEAD_DIM,
    ),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "n_inner",
            "d_ff",
            "decoder_ffn_dim",
            "encoder_ffn_dim",
            "ffn_hidden_size",
            "d_inner",
            "feed_forward_size",
            "intermediate_size_mlp",
            "dense_intermediate_size",
            "mlp_dim",
            "inner_hidden_size",
        ),
        2 * HIDDEN,
    ),
    **dict.fromkeys(
        (
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "expert_ffn_hidden_size",
            "router_hidden_size",
            "moe_shared_expert_intermediate_size",
            "shared_experts_intermediate_size",
            "shared_intermediate_size",
        ),
        32,
    ),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(
        ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "top_k_experts"), 2
    ),
    **dict.fromkeys(
        (
            "n_shared_experts",
            "num_shared_experts",
            "n_groups",
            "n_group",
            "num_group",
            "topk_group",
            "num_expert_group",
        ),
        1,
    ),
    **dict.fromkeys(
        (
            "max_position_embeddings",
            "n_positions",
            "n_ctx",
            "max_seq_len",
            "max_target_positions",
            "max_source_positions",
            "context_length",
            "num_position_embeddings",
            "original_max_position_embeddings",
            "model_max_length",
            "seq_length",
        ),
        POSITIONS,
    ),
    **dict.fromkeys(
        (
            "sliding_window",
            "sliding_window_size",
            "attention_window_size",
            "window_size",
            "attention_chunk_size",
        ),
        WINDOW,
    ),
    **dict.fromkeys(("kv_lora_rank",), 32),
    **dict.fromkeys(("q_lora_rank",), 48),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM // 2),
    **dict.fromkeys(
        ("mamba_d_state", "state_size", "ssm_state_size", "mamba_dt_rank", "time_step_rank"), 16
    ),
    **dict.fromkeys(("mamba_chunk_size", "chunk_size"), 16),
    **dict.fromkeys(("index_topk", "index_topk_blocks"), 4),
    **dict.fromkeys(
        ("laurel_rank", "hidden_size_per_layer_input", "ple_embed_dim", "adapter_rank"), 16
    ),
    **dict.fromkeys(("rotary_dim",), HEAD_DIM // 2),
    **dict.fromkeys(("image_size",), 32),
    **dict.fromkeys(("patch_size",), 8),
}

# Values for keys a config leaves unset (``None``) but its model needs.
UNSET: dict[str, int] = {
    "head_dim": HEAD_DIM,
    "num_key_value_heads": 2,
    "num_experts_per_tok": 2,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
}

# Keys that count layers: per-layer lists of a config are cut to LAYERS from this many entries.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
VOCAB_SUFFIXES = ("vocab_size", "vocab_size_per_layer_input")

# Per-architecture values a generically shrunk config still needs (keys as in the config's to_dict()).
OVERRIDES: dict[str, dict[str, Any]] = {
    # hybrids whose attention layers are placed by period/offset or a short pattern: keep one of each kind
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # zamba ties the shared transformer block across hybrid layers: it needs two of them
    "zamba": {
        "num_hidden_layers": 3,
        "attn_layer_period": 1,
        "attn_layer_offset": 1,
        "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
    },
    "zamba2": {
        "attention_hidden_size": 2 * HIDDEN
    },  # attention runs on [hidden, original embeddings]
    "reformer": {
        "is_decoder": True,
        "axial_pos_embds_dim": [HIDDEN // 2, HIDDEN // 2],
        "axial_pos_shape": [16, 16],
    },
    "cohere_compass_text": {
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # kolibri1_1 validates its layer plan: an indexer must be the first indexed layer, each layer its own
    # K/V; budgets small enough that the sweep's short prompts choose keys
    "kolibri1_1": {
        "layer_types": ["sliding_attention", "indexed_attention"],
        "index_layers": [1],
        "kv_source_layers": [0, 1],
        "index_topk": 2,
        "index_pool_size": 4,
        "index_compression": 2,
        "index_num_heads": 2,
        "index_num_local_tokens": 1,
        "index_num_sink_tokens": 1,
        "mlp_only_layers": [],
    },
    "qwen4_exp_text": {
        "indexer_n_heads": HEADS,
        "indexer_kv_heads": 1,
        "indexer_head_dim": HEAD_DIM,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
    },
    "qwen4_exp": {
        "text_config.indexer_n_heads": HEADS,
        "text_config.indexer_kv_heads": 1,
        "text_config.indexer_head_dim": HEAD_DIM,
        "text_config.indexer_budget": 8,
        "text_config.indexer_compress_ratio": 4,
    },
    # Gemma 3 pools an image's 4 x 4 patches into this many tokens (the kernel is patches / sqrt of it)
    "gemma3": {"mm_tokens_per_image": 4},
    "xmod": {"default_language": "en_XX"},
    "xlstm": {"qk_dim_factor": 1.0},
    "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    # gemma3n shares the last layers' KV caches with earlier layers of the same type: keep two of each
    "gemma3n_text": {
        "num_hidden_layers": 4,
        "num_kv_shared_layers": 2,
        "intermediate_size": [2 * HIDDEN] * 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
    },
    "dots3_note_text": {
        "head_dim": HEAD_DIM
    },  # its sliding layers use full heads beside latent attention
    "dots3_note": {"text_config.head_dim": HEAD_DIM, "vision_config.adapter_in_dim": HIDDEN},
    "gemma4_assistant": {
        "text_config.hidden_size_per_layer_input": 0,
        "text_config.vocab_size_per_layer_input": 0,
        "text_config.num_kv_shared_layers": LAYERS,
    },
}


def shrunk_config(
    model_type: str, config_class: type | None = None, **extra: Any
) -> transformers.PretrainedConfig:
    """A tiny config of ``model_type`` (a key of ``transformers.CONFIG_MAPPING``).

    ``config_class`` replaces the mapped class where a model takes a part of it (``MusicgenForCausalLM``
    takes the decoder's config); ``extra`` are final overrides (dotted keys reach into sub-configs).
    """
    cls = config_class or transformers.CONFIG_MAPPING[model_type]
    values = _defaults(cls)
    values = shrink(values)
    _merge(values, OVERRIDES.get(model_type, {}))
    _merge(values, extra)
    values.pop("transformers_version", None)
    values.pop("architectures", None)
    for key in (
        "out_features",
        "out_indices",
        "stage_names",
    ):  # a backbone's stages, as before the shrink
        values.pop(key, None)
    config = cls.from_dict(values)
    return config


def _defaults(cls: type) -> dict[str, Any]:
    """The class's default config as a dict, with the sizes it derives from others unset so they follow the shrink."""
    try:
        values = cls().to_dict()
    except Exception:
        # Some configs' own defaults fail their validation; start from the declared fields instead.
        values = {
            f.name: f.default
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING
        }
    _unset_derived(cls, values)
    return values


def _unset_derived(cls: type, values: dict[str, Any]) -> None:
    """Reset scalars the class declares as ``None`` (derived in ``__post_init__``), here and in sub-configs."""
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            value = values.get(field.name)
            if (
                field.default is None
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
            ):
                if not field.name.endswith(("_id", "_index")) and field.name not in UNSET:
                    values[field.name] = None
    for name, sub_class in (getattr(cls, "sub_configs", None) or {}).items():
        if isinstance(values.get(name), dict) and dataclasses.is_dataclass(sub_class):
            _unset_derived(sub_class, values[name])


def _merge(values: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if "." in key:
            head, rest = key.split(".", 1)
            if not isinstance(values.get(head), dict):
                values[head] = {}
            _merge(values[head], {rest: value})
        else:
            values[key] = copy.deepcopy(value)


def shrink(values: dict[str, Any]) -> dict[str, Any]:
    """Shrink one config's ``to_dict()`` (and its sub-configs) in place; returns it."""
    layers = next(
        (values[k] for k in LAYER_KEYS if isinstance(values.get(k), int) and values[k] > 0), None
    )
    keep = _kept_layers(values, layers) if layers and layers > LAYERS else None
    for key, value in list(values.items()):
        if key == "per_layer_config" and isinstance(value, dict) and keep is not None:
            by_layer = {int(index): layer for index, layer in value.items()}
            values[key] = {
                f"{new:02d}": shrink(dict(by_layer[old]))
                for new, old in enumerate(keep)
                if old in by_layer
            }
        elif isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            shrink(value)
        elif value is None and key in UNSET:
            values[key] = UNSET[key]
        elif value is not None and not isinstance(value, bool):
            if keep is not None and _per_layer(key, value, layers):
                value = (
                    [value[i] for i in keep]
                    if isinstance(value, list)
                    else "".join(value[i] for i in keep)
                )
            elif keep is not None and _layer_indices(key, value, layers):
                value = [keep.index(v) for v in value if v in keep]
            values[key] = _resized(key, value)
    _fit_token_ids(values)
    _keep_relations(values)
    return values


def _keep_relations(values: dict[str, Any]) -> None:
    """Re-derive sizes that configs define in terms of others."""
    if isinstance(values.get("qk_rope_head_dim"), int) and "head_dim" in values:
        values["head_dim"] = values[
            "qk_rope_head_dim"
        ]  # multi-head latent attention: RoPE runs on this part
    if isinstance(values.get("kv_lora_rank"), int) and isinstance(
        values.get("num_attention_heads"), int
    ):
        values["num_key_value_heads"] = values[
            "num_attention_heads"
        ]  # latent attention expands k/v per head
    hidden = next(
        (values[k] for k in ("hidden_size", "d_model") if isinstance(values.get(k), int)), None
    )
    for expand, heads, head_dim in (
        ("mamba_expand", "mamba_n_heads", "mamba_d_head"),
        ("mamba_expand", "n_mamba_heads", "mamba_headdim"),
        ("expand", "num_heads", "head_dim"),
    ):
        if hidden and all(isinstance(values.get(k), int) for k in (expand, heads, head_dim)):
            values[head_dim] = (
                values[expand] * hidden // values[heads]
            )  # Mamba-2 heads tile the expanded width
            if isinstance(values.get("mamba_d_ssm"), int):
                values["mamba_d_ssm"] = values[expand] * hidden


def _resized(key: str, value: Any) -> Any:
    """``value`` of ``key`` no larger than its tiny size (elementwise for per-layer lists of sizes)."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return [_resized(key, v) for v in value]
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    if key in SIZES:
        return (
            SIZES[key]
            if value > SIZES[key] or key in ("num_key_value_heads", "head_dim")
            else value
        )
    if key.endswith(VOCAB_SUFFIXES):
        return min(value, VOCAB)
    return value


def _per_layer(key: str, value: Any, layers: int) -> bool:
    """Whether ``value`` holds one entry per layer (a list, or a pattern string like ``"M-M*"``)."""
    return (isinstance(value, list) or isinstance(value, str) and "pattern" in key) and len(
        value
    ) == layers


def _layer_indices(key: str, value: Any, layers: int) -> bool:
    """Whether ``value`` lists layer indices (``moe_layers``, ``full_attn_idxs``, ...)."""
    if not ("layer" in key or "idx" in key) or not isinstance(value, list) or not value:
        return False
    return (
        all(isinstance(v, int) and not isinstance(v, bool) for v in value) and max(value) < layers
    )


def _kept_layers(values: dict[str, Any], layers: int) -> list[int]:
    """Which of ``layers`` layers to keep: the first, and the one differing from it in the most per-layer lists."""
    lists = [v for k, v in values.items() if _per_layer(k, v, layers)]
    if not lists:
        return list(range(LAYERS))
    best = max(range(1, layers), key=lambda j: (sum(lst[j] != lst[0] for lst in lists), -j))
    return [0, best]


def _fit_token_ids(values: dict[str, Any]) -> None:
    """Move special token ids that fall outside the shrunk vocabulary to its top end (same id, same new id)."""
    text = values.get("text_config") if isinstance(values.get("text_config"), dict) else {}
    vocab = values.get("vocab_size", text.get("vocab_size"))
    if not isinstance(vocab, int):
        return
    moved: dict[int, int] = {}

    def fit(token: Any) -> Any:
        if isinstance(token, bool) or not isinstance(token, int) or 0 <= token < vocab:
            return token
        if token not in moved:
            moved[token] = vocab - 1 - len(moved)
        return moved[token]

    for key, value in list(values.items()):
        if key.endswith(("_token_id", "_token_index", "_token_ids", "_id")) and key != "vocab_size":
            values[key] = [fit(v) for v in value] if isinstance(value, list) else fit(value)
