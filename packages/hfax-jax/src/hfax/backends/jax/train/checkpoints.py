"""Checkpoints out of and into a :class:`~hfax.backends.jax.train.module.TransformersModule`: the merged
model as a transformers checkpoint, and LoRA adapters in PEFT's format (``adapter_config.json`` and
``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained`` loads onto the base model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from hfax.backends.jax.train.lora import LoraConfig, attach, linear_layers, merged_values
from hfax.backends.jax.weights import host_tensor

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT's prefix for the wrapped model's state names (``PeftModel.base_model.model``).
PEFT_PREFIX = "base_model.model."
#: PEFT settings hfax's adapters do not implement, with the value that means "off".
UNSUPPORTED = {
    "use_dora": False,
    "bias": "none",
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
    "layer_replication": None,
    "trainable_token_indices": None,
    "target_parameters": None,
}


def save_pretrained(module: Any, directory: str | Path) -> Path:
    """Write ``module`` with its adapters merged as a transformers checkpoint (config, generation config,
    safetensors) that ``transformers``' ``from_pretrained`` loads."""
    torch_module = module.model.module
    saved = set(torch_module.state_dict())  # persistent tensors only, tied ones by every name
    state = {
        name: host_tensor(value) for name, value in merged_values(module).items() if name in saved
    }
    torch_module.save_pretrained(str(directory), state_dict=state)
    return Path(directory)


def save_adapter(module: Any, directory: str | Path, base_model: str | None = None) -> Path:
    """Write ``module``'s LoRA adapters as PEFT does; ``base_model`` is recorded as
    ``base_model_name_or_path`` (default: the path the model was loaded from)."""
    config: LoraConfig | None = module.lora_config
    if config is None:
        raise ValueError(
            "this module has no LoRA adapters to save; attach them with add_lora first"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, adapter in module.adapters.items():
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = np.asarray(adapter.lora_a[...])
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = np.asarray(adapter.lora_b[...])
    save_file(tensors, directory / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    settings = {
        "peft_type": "LORA",
        "task_type": _task_type(module.model.module),
        "base_model_name_or_path": base_model or module.config._name_or_path or None,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": list(config.targets),
        "use_rslora": config.rslora,
        "fan_in_fan_out": any(adapter.transposed for adapter in module.adapters.values()),
        "inference_mode": True,
        **UNSUPPORTED,
    }
    (directory / ADAPTER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")
    return directory


def load_adapter(module: Any, directory: str | Path, seed: int = 0) -> LoraConfig:
    """Attach the LoRA adapters PEFT saved in ``directory`` to ``module`` (same base model)."""
    directory = Path(directory)
    settings = json.loads((directory / ADAPTER_CONFIG).read_text())
    if settings.get("peft_type") != "LORA":
        raise ValueError(
            f"{directory / ADAPTER_CONFIG} holds a {settings.get('peft_type')} adapter; hfax loads LoRA only"
        )
    for key, off in UNSUPPORTED.items():
        if settings.get(key, off) not in (off, None, {}, False, "none"):
            raise ValueError(
                f"{directory / ADAPTER_CONFIG} sets {key}={settings[key]!r}, which hfax's LoRA does not "
                "implement; merge the adapter with PEFT (merge_and_unload) and load the merged model"
            )
    targets = settings["target_modules"]
    config = LoraConfig(
        int(settings["r"]),
        float(settings["lora_alpha"]),
        float(settings.get("lora_dropout", 0.0)),
        tuple([targets] if isinstance(targets, str) else targets),
        bool(settings.get("use_rslora", False)),
    )
    config.check()
    attach(module, config, _adapter_weights(module, directory / ADAPTER_WEIGHTS), nnx.Rngs(seed))
    return config


def _adapter_weights(module: Any, path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    tensors = load_file(path)
    layers = linear_layers(module.model.module)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        stem, _, kind = key.removeprefix(PEFT_PREFIX).removesuffix(".weight").rpartition(".")
        if kind not in ("lora_A", "lora_B") or stem not in layers:
            raise ValueError(
                f"{path} holds {key!r}, which names no LoRA weight of a linear layer of this model; "
                "was the adapter trained on another base model?"
            )
        pairs.setdefault(stem, {})[kind] = value
    return {name: (pair["lora_A"], pair["lora_B"]) for name, pair in pairs.items()}


def _task_type(torch_module: Any) -> str | None:
    name = type(torch_module).__name__
    for suffix, task in (
        ("ForCausalLM", "CAUSAL_LM"),
        ("ForConditionalGeneration", "SEQ_2_SEQ_LM"),
        ("ForSequenceClassification", "SEQ_CLS"),
    ):
        if name.endswith(suffix):
            return task
    return None
