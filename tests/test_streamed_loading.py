"""Weights streamed from safetensors shards straight into device arrays (``hfax_load_weights`` of the JAX
backend): the same arrays, bit for bit, as transformers' ``from_pretrained`` followed by
``hfax_shard_weights``, and the checkpoints that must take transformers' path still load through it.

Here, not in hfax-jax's own tests: only models of a family plugin stream (``hfax.auto._stream``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax.testing import spread_weights, tiny_config

PROMPT = np.array([[1, 5, 9, 23, 7, 3, 11]])
FALLBACK = "weights load through transformers"


def gemma3_config() -> Any:
    """Gemma 3 text: tied embeddings, a scaled embedding buffer, sliding and full layers."""
    return transformers.Gemma3TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )


CONFIGS = {"llama": lambda: tiny_config("llama"), "gemma3": gemma3_config}


def save(
    config: Any, directory: Path, dtype: torch.dtype, auto_class: str = "AutoModelForCausalLM", **kw
) -> Path:
    torch.manual_seed(0)
    model = getattr(transformers, auto_class).from_config(config)
    spread_weights(model)
    model.to(dtype).save_pretrained(directory, max_shard_size="40KB", **kw)
    return directory


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``saved(family, stored dtype)`` -> a checkpoint dir in several safetensors shards, built once."""
    built: dict[tuple[str, torch.dtype], Path] = {}

    def get(family: str, dtype: torch.dtype) -> Path:
        if (family, dtype) not in built:
            directory = tmp_path_factory.mktemp(f"{family}-{dtype}".replace("torch.", ""))
            built[family, dtype] = save(CONFIGS[family](), directory, dtype)
        return built[family, dtype]

    return get


def through_transformers(path: Path, mesh: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """transformers' model and hfax's from it: the path streaming replaces."""
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor(PROMPT)).logits.float().numpy()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return logits, hfax.AutoModelForCausalLM.from_model(loaded, backend="jax", mesh=mesh)


def streamed(path: Path, mesh: Any = None, **kwargs: Any) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "from_pretrained", _refuse)
        return hfax.AutoModelForCausalLM.from_pretrained(
            str(path), backend="jax", mesh=mesh, **kwargs
        )


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the streamed path called transformers' from_pretrained")


def assert_same_params(model: Any, expected: Any) -> None:
    assert list(model.params) == list(expected.params)
    for name, array in expected.params.items():
        assert model.params[name].dtype == array.dtype, name
        assert model.params[name].sharding == array.sharding, name
        np.testing.assert_array_equal(np.asarray(model.params[name]), np.asarray(array), name)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize(
    "stored, dtype",
    [
        (torch.float32, None),
        (torch.float32, "bfloat16"),
        (torch.bfloat16, "float32"),
        (torch.bfloat16, "auto"),
    ],
)
def test_streamed_weights_equal_transformers_loaded_ones(saved, family, stored, dtype):
    path = saved(family, stored)
    assert len(list(path.glob("*.safetensors"))) > 3
    kwargs = {} if dtype is None else {"dtype": dtype}
    logits, expected = through_transformers(path, **kwargs)
    model = streamed(path, **kwargs)
    assert_same_params(model, expected)
    assert model.module.dtype == expected.module.dtype
    assert any(name.endswith("inv_freq") for name in model.params)  # buffers compared too
    ours = np.asarray(model(input_ids=PROMPT).logits, dtype=np.float32)
    np.testing.assert_array_equal(ours, np.asarray(expected(input_ids=PROMPT).logits, np.float32))
    tolerance = 1e-4 if model.dtype == np.float32 else 5e-2
    np.testing.assert_allclose(ours, logits, atol=tolerance, rtol=tolerance)


def test_tied_embeddings_stay_one_array(saved):
    model = streamed(saved("gemma3", torch.float32))
    assert "lm_head.weight" not in model.params
    assert model.module.lm_head.weight is model.module.model.embed_tokens.weight


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_streamed_on_8_devices_equals_one_device(saved, family):
    path = saved(family, torch.float32)
    mesh = hfax.make_mesh(data=4, model=2)
    one = streamed(path)
    model = streamed(path, mesh=mesh)
    _, expected = through_transformers(path, mesh=mesh)
    assert_same_params(model, expected)
    assert any(
        len(a.sharding.device_set) == 8 and not a.is_fully_replicated for a in model.params.values()
    )
    np.testing.assert_allclose(
        np.asarray(model(input_ids=PROMPT).logits),
        np.asarray(one(input_ids=PROMPT).logits),
        atol=1e-5,
        rtol=1e-5,
    )
    ids = np.asarray(model.generate(PROMPT, max_new_tokens=6, do_sample=False))
    np.testing.assert_array_equal(
        ids, np.asarray(one.generate(PROMPT, max_new_tokens=6, do_sample=False))
    )


def test_base_model_loads_from_a_causal_lm_checkpoint(saved):
    """transformers strips the ``model.`` prefix when a base model reads a task model's checkpoint."""
    path = saved("llama", torch.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "from_pretrained", _refuse)
        model = hfax.AutoModel.from_pretrained(str(path), backend="jax")
    expected = hfax.AutoModel.from_model(
        transformers.AutoModel.from_pretrained(path), backend="jax"
    )
    assert_same_params(model, expected)


def test_base_model_checkpoint_loads_into_a_causal_lm(tmp_path, saved):
    """transformers adds the ``model.`` prefix when a task model reads a base model's checkpoint."""
    from safetensors.torch import load_file, save_file

    path = saved("gemma3", torch.float32)
    for file in path.iterdir():
        if file.suffix == ".safetensors":
            tensors = {k.removeprefix("model."): v for k, v in load_file(file).items()}
            save_file(tensors, tmp_path / file.name, metadata={"format": "pt"})
        elif file.name.endswith(".json"):
            text = file.read_text()
            if file.name.endswith("index.json"):
                text = text.replace('"model.', '"')
            (tmp_path / file.name).write_text(text)
    logits, expected = through_transformers(tmp_path)
    model = streamed(tmp_path)
    assert_same_params(model, expected)
    np.testing.assert_allclose(np.asarray(model(input_ids=PROMPT).logits), logits, atol=1e-4)


def test_bin_checkpoint_loads_through_transformers(tmp_path, caplog):
    """transformers 5 saves safetensors only: the ``.bin`` file is written as older versions wrote it."""
    path = save(tiny_config("llama"), tmp_path / "safetensors", torch.float32)
    tensors = transformers.AutoModelForCausalLM.from_pretrained(path).state_dict()
    for file in path.glob("*.safetensors*"):
        file.unlink()
    torch.save(tensors, path / "pytorch_model.bin")
    logits, expected = through_transformers(path)
    with caplog.at_level(logging.INFO, logger="hfax"):
        model = hfax.AutoModelForCausalLM.from_pretrained(str(path), backend="jax")
    assert FALLBACK in caplog.text and "GGUF or .bin" in caplog.text
    assert_same_params(model, expected)
    np.testing.assert_allclose(np.asarray(model(input_ids=PROMPT).logits), logits, atol=1e-4)


def test_missing_weights_load_through_transformers(tmp_path, saved, caplog):
    """transformers initializes weights a checkpoint lacks; hfax leaves that to it."""
    from safetensors.torch import load_file, save_file

    path = saved("llama", torch.float32)
    tensors = {}
    for file in path.glob("*.safetensors"):
        tensors.update(load_file(file))
    del tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    with caplog.at_level(logging.INFO, logger="hfax"):
        hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    assert "lacks 'model.norm.weight'" in caplog.text
