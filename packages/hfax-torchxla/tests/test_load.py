"""Weights read from safetensors shards straight onto the XLA device (``hfax_load_weights`` of the
torch_xla backend): the same tensors, bit for bit, as transformers' ``from_pretrained`` gives, tied
weights once, and transformers' logits and tokens.

Only models of a family plugin stream (``hfax.auto._stream``): the test extra installs Llama's and
Gemma's."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax import checkpoints
from hfax.testing import (
    as_numpy,
    assert_same_greedy,
    mapped_resident_bytes,
    spread_weights,
    tiny_config,
)

PROMPT = np.array([[1, 5, 9, 23, 7, 3, 11]])


def save(name: str, directory: Path, dtype: torch.dtype) -> Path:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(name))
    spread_weights(model)
    model.to(dtype).save_pretrained(directory, max_shard_size="40KB")
    return directory


def streamed(path: Path, **kwargs: Any) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "from_pretrained", _refuse)
        return hfax.AutoModelForCausalLM.from_pretrained(str(path), backend="torch_xla", **kwargs)


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the streamed path called transformers' from_pretrained")


@pytest.mark.parametrize("name", ["llama", "gemma"])
@pytest.mark.parametrize("stored, dtype", [(torch.float32, None), (torch.float32, "bfloat16")])
def test_streamed_weights_equal_transformers_loaded_ones(tmp_path, name, stored, dtype):
    path = save(name, tmp_path, stored)
    assert len(list(path.glob("*.safetensors"))) > 3
    kwargs = {} if dtype is None else {"dtype": dtype}
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    model = streamed(path, **kwargs)
    expected = dict(reference.named_parameters(remove_duplicate=False))
    expected.update(reference.named_buffers(remove_duplicate=False))
    assert set(model.params) <= set(expected)
    assert any(n.endswith("inv_freq") for n in model.params)  # computed buffers are placed too
    for key, tensor in model.params.items():
        assert tensor.device.type == "xla", key
        assert tensor.dtype == expected[key].dtype, key
        torch.testing.assert_close(tensor.cpu(), expected[key], rtol=0, atol=0, msg=key)
    with torch.no_grad():
        want = reference(input_ids=torch.as_tensor(PROMPT)).logits.float().numpy()
    tolerance = 1e-4 if model.dtype == torch.float32 else 5e-2
    got = model(input_ids=PROMPT).logits.float().cpu().numpy()
    np.testing.assert_allclose(got, want, atol=tolerance, rtol=tolerance)
    if dtype is None:
        assert_same_greedy(model, reference, PROMPT[0].tolist(), max_new_tokens=6)


def test_tied_embeddings_stay_one_tensor(tmp_path):
    model = streamed(save("gemma", tmp_path, torch.float32))
    assert "lm_head.weight" not in model.params
    assert model.module.lm_head.weight is model.module.model.embed_tokens.weight


def test_a_model_without_a_family_loads_through_transformers(tmp_path, caplog):
    path = save("gpt2", tmp_path, torch.float32)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with caplog.at_level(logging.INFO, logger="hfax"):
        model = hfax.AutoModelForCausalLM.from_pretrained(str(path), backend="torch_xla")
    assert "weights load through transformers" in caplog.text
    with torch.no_grad():
        want = reference(input_ids=torch.as_tensor(PROMPT)).logits.numpy()
    np.testing.assert_allclose(as_numpy(model(input_ids=PROMPT).logits), want, atol=1e-4)


def test_reader_converts_from_the_mapped_file_and_drops_each_block(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from hfax.backends.torchxla import safetensors_reader

    monkeypatch.setattr(checkpoints, "CONVERT_BLOCK_BYTES", 1 << 20)
    tensor = torch.randn(64, 1 << 16)  # 16 MiB of float32
    path = tmp_path / "x.safetensors"
    save_file({"t": tensor}, path)
    file = safetensors_reader.SafetensorsFile(str(path))
    converted = file.read("t", torch.bfloat16)
    resident = mapped_resident_bytes(path)
    file.close()
    assert torch.equal(converted, tensor.to(torch.bfloat16))
    # Without the drops the whole 16 MiB would stay; what is left is at most one block's edges.
    assert resident <= 2 * checkpoints.CheckpointFile.FAULT_AROUND_BYTES, resident
