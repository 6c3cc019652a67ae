"""The JAX backend's checkpoint reading alone: the safetensors reader reads exactly the bytes asked for,
arguments only transformers understands keep its path, and a model no family plugin vouches for loads
through transformers. Streaming into device arrays is tested with the family plugins installed, in
tests/test_streamed_loading.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax import checkpoints
from hfax.testing import mapped_resident_bytes, save_tiny, tiny_config

PROMPT = np.array([[1, 5, 9, 23, 7, 3, 11]])


@pytest.mark.parametrize(
    ("family", "config"),
    [
        ("generic", lambda: tiny_config("gpt2")),
        # claimed by a long-tail family plugin, which does not declare streamed loading
        ("mpt", lambda: transformers.MptConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2)),
    ],
)
def test_a_family_without_streamed_loading_loads_through_transformers(
    tmp_path, caplog, family, config
):
    """GPT-2 has no family plugin and MPT's family does not vouch for its loading: transformers reads their
    weights (and initializes what it must)."""
    reference = save_tiny(config(), tmp_path / family)
    with caplog.at_level(logging.INFO, logger="hfax"):
        model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path / family), backend="jax")
    assert model.family == family
    assert f"family {family!r} does not declare streamed loading" in caplog.text
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(PROMPT)).logits.numpy()
    np.testing.assert_allclose(
        np.asarray(model(input_ids=PROMPT).logits), expected, atol=1e-4, rtol=1e-4
    )


def test_gguf_and_other_arguments_load_through_transformers(tmp_path):
    path = tmp_path / "llama"
    save_tiny(tiny_config("llama"), path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(tiny_config("llama"))
    for kwargs in ({"gguf_file": "model.gguf"}, {"device_map": "cpu"}, {"dtype": {"": "float32"}}):
        with pytest.raises(checkpoints.NotStreamable):
            checkpoints.find_checkpoint(str(path), model, kwargs)


def rchar() -> int:
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar")).split()[1])


@pytest.mark.parametrize(
    "index",
    [(), (slice(1, 3),), (slice(None), slice(1, 4)), (slice(2, 4), slice(0, 5), slice(1, 2))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reader_reads_exactly_the_box(tmp_path, index, dtype):
    from safetensors.torch import save_file

    from hfax.backends.jax.safetensors_reader import SafetensorsFile
    from hfax.backends.jax.weights import host_array

    tensor = torch.randn(6, 5, 4).to(dtype)
    save_file({"other": torch.zeros(3), "t": tensor}, tmp_path / "x.safetensors")
    file = SafetensorsFile(str(tmp_path / "x.safetensors"))
    before = rchar()
    piece = file.read("t", index)
    read = rchar() - before
    file.close()
    expected = host_array(tensor)[index]
    assert piece.dtype == expected.dtype
    np.testing.assert_array_equal(piece, expected)
    assert piece.nbytes <= read < piece.nbytes + 1024  # its bytes, and /proc/self/io's own read


@pytest.mark.parametrize(
    "stored, target", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]
)
def test_reader_converts_a_block_of_rows_at_a_time(tmp_path, monkeypatch, stored, target):
    from safetensors.torch import save_file

    from hfax.backends.jax import safetensors_reader
    from hfax.backends.jax.weights import host_array

    monkeypatch.setattr(checkpoints, "CONVERT_BLOCK_BYTES", 3 * 5 * 4)  # 3 rows of float32
    tensor = torch.randn(10, 5, 7).to(stored)
    save_file({"t": tensor}, tmp_path / "x.safetensors")
    file = safetensors_reader.SafetensorsFile(str(tmp_path / "x.safetensors"))
    index = (slice(1, 9), slice(0, 5), slice(2, 6))
    piece = file.read("t", index, host_array(torch.empty(0, dtype=target)).dtype)
    file.close()
    expected = host_array(tensor[1:9, :, 2:6].to(target))
    assert piece.dtype == expected.dtype and piece.ctypes.data % safetensors_reader.ALIGNMENT == 0
    np.testing.assert_array_equal(piece, expected)


def test_reader_converts_from_the_mapped_file_and_drops_each_block(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from hfax.backends.jax import safetensors_reader
    from hfax.backends.jax.weights import host_array

    block = 1 << 20
    monkeypatch.setattr(checkpoints, "CONVERT_BLOCK_BYTES", block)
    tensor = torch.randn(64, 1 << 16)  # 16 MiB of float32
    path = tmp_path / "x.safetensors"
    save_file({"t": tensor}, path)
    file = safetensors_reader.SafetensorsFile(str(path))
    piece = file.read("t", (), host_array(torch.empty(0, dtype=torch.bfloat16)).dtype)
    resident = mapped_resident_bytes(path)
    file.close()
    np.testing.assert_array_equal(piece, host_array(tensor.to(torch.bfloat16)))
    # Without the drops the whole 16 MiB would stay; what is left is at most one block's edges.
    assert resident <= 2 * checkpoints.CheckpointFile.FAULT_AROUND_BYTES, resident


def test_reader_prefaulted_piece_becomes_the_device_buffer(tmp_path, monkeypatch):
    import jax
    from safetensors.torch import save_file

    from hfax.backends.jax import safetensors_reader
    from hfax.backends.jax.weights import host_array

    monkeypatch.setattr(checkpoints, "PREFAULT_MIN_BYTES", 1)  # every piece on its own mapping
    tensor = torch.randn(8, 5)
    save_file({"t": tensor}, tmp_path / "x.safetensors")
    file = safetensors_reader.SafetensorsFile(str(tmp_path / "x.safetensors"))
    piece = file.read("t", (slice(2, 6),))
    file.close()
    np.testing.assert_array_equal(piece, host_array(tensor)[2:6])
    array = jax.device_put(piece, jax.devices("cpu")[0])
    assert array.unsafe_buffer_pointer() == piece.ctypes.data  # kept in place, not copied
    del piece
    np.testing.assert_array_equal(np.asarray(array), host_array(tensor)[2:6])  # the array keeps it


@pytest.mark.parametrize("layout", ["one device", "split over 8", "replicated over 8"])
def test_read_ahead_places_every_piece_and_stays_within_its_bytes(tmp_path, monkeypatch, layout):
    """Tensors are read on threads ahead of the one being placed, never more than ``READ_AHEAD_BYTES``
    beyond it, and each array equals the stored tensor converted to the target dtype."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
    from safetensors.torch import save_file

    from hfax.backends.jax import weights
    from hfax.backends.jax.safetensors_reader import SafetensorsFile

    tensors = {f"t{i}": torch.randn(16, 8 * (i + 1)) for i in range(6)}
    save_file(tensors, tmp_path / "x.safetensors")
    file = SafetensorsFile(str(tmp_path / "x.safetensors"))
    mesh = jax.make_mesh((8,), ("model",))
    sharding = {
        "one device": SingleDeviceSharding(jax.devices()[0]),
        "split over 8": NamedSharding(mesh, PartitionSpec("model")),
        "replicated over 8": NamedSharding(mesh, PartitionSpec()),
    }[layout]
    limit = 2 * 16 * 8 * 2  # bfloat16 bytes of t0 and t1 together
    monkeypatch.setattr(weights, "READ_AHEAD_BYTES", limit)
    read, ahead_at_placing = [], []
    original = file.read
    monkeypatch.setattr(file, "read", lambda key, *a: read.append(key) or original(key, *a))
    with weights.ThreadPoolExecutor(weights.READ_THREADS) as pool:
        ahead = weights.ReadAhead(pool)
        for name, tensor in tensors.items():
            ahead.add(name, file, name, tensor.to(torch.bfloat16), sharding)
        for name, tensor in tensors.items():
            array = ahead.array(name)
            ahead_at_placing.append(list(ahead.reading))  # submitted, not yet placed
            assert array.sharding == sharding
            np.testing.assert_array_equal(
                np.asarray(array), weights.host_array(tensor.to(torch.bfloat16))
            )
    file.close()
    pieces = 1 if layout != "split over 8" else 8
    assert sorted(read) == sorted(name for name in tensors for _ in range(pieces))
    assert ahead_at_placing[0], "nothing was read ahead"
    for (
        names
    ) in ahead_at_placing:  # bytes read ahead: under the limit, plus the one that crossed it
        sizes = [tensors[name].numel() * 2 for name in names]
        assert sum(sizes[:-1]) < limit
