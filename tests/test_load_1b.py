"""A 1B-parameter Llama loads under an address-space limit that transformers' path exceeds.

The checkpoint has Llama 3.2 1B's shapes (1.24B parameters, tied embeddings) with random weights in
bfloat16 (2.5 GB), written one shard at a time (:func:`write_checkpoint`) so the test never holds the
model. Each load runs in a fresh process that sets ``RLIMIT_AS`` to its address space after the imports
plus ``HEADROOM`` times the weights' bytes: the streamed path (``pread`` into the device arrays) fits;
transformers' ``from_pretrained`` then ``from_model`` maps the files and copies every weight into JAX
(the weights twice in its address space, and in its resident memory once it has read them), and runs out
of memory while loading. The streamed model's greedy tokens equal transformers' (in a process
without the limit).

Minutes of CPU and 2.5 GB of disk: run by ``nox -s load1b``, skipped elsewhere (``HFAX_LOAD_1B=1``).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("HFAX_LOAD_1B") != "1", reason="a 2.5 GB checkpoint: nox -s load1b runs it"
)

PROMPT = [[1, 5, 9, 23, 7, 3, 11]]
NEW_TOKENS = 4
#: The address space loading and generating may add, over the weights' bytes: the weights once, and the
#: float32 copy of the bfloat16 output layer (0.43x) that XLA's CPU compiler makes for its matmul.
HEADROOM = 1.8
SHARD_BYTES = 600 << 20


def config() -> Any:
    """Llama 3.2 1B's shapes."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=2048,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        dtype="bfloat16",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def write_checkpoint(directory: Path) -> int:
    """Random weights in safetensors shards of ``SHARD_BYTES``, drawn and written a shard at a time (unit-
    scale activations as ``hfax.testing.spread_weights`` draws them); returns the weights' bytes."""
    import torch
    import transformers

    cfg = config()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied: listed once
    generator = torch.Generator().manual_seed(0)
    shards: list[dict[str, Any]] = [{}]
    weight_map, total, in_shard = {}, 0, 0
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        value = noise / math.sqrt(shape[-1]) if len(shape) >= 2 else 1 + 0.1 * noise
        tensor = value.to(torch.bfloat16)
        if in_shard and in_shard + tensor.nbytes > SHARD_BYTES:
            flush(shards, directory)
            in_shard = 0
        shards[-1][name] = tensor
        weight_map[name] = f"model-{len(shards):05d}.safetensors"
        in_shard += tensor.nbytes
        total += tensor.nbytes
    flush(shards, directory)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg.save_pretrained(directory)
    return total


def flush(shards: list[dict[str, Any]], directory: Path) -> None:
    from safetensors.torch import save_file

    save_file(shards[-1], directory / f"model-{len(shards):05d}.safetensors", {"format": "pt"})
    shards[-1].clear()
    shards.append({})


def child(engine: str, path: str, headroom: int) -> None:
    """Load ``path`` with ``engine`` (under the limit unless ``headroom`` is 0), print its greedy tokens."""
    import numpy as np
    import torch
    import transformers

    if engine == "transformers":
        model = transformers.AutoModelForCausalLM.from_pretrained(path)
        ids = model.generate(torch.tensor(PROMPT), max_new_tokens=NEW_TOKENS, do_sample=False)
        print(json.dumps(ids.tolist()))
        return
    import jax

    import hfax
    import hfax.backends.jax.backend  # noqa: F401

    jax.devices()
    limit = address_space() + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if engine == "streamed":
        loaded = hfax.AutoModelForCausalLM.from_pretrained(path, backend="jax")
    else:
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(path)
        loaded = hfax.AutoModelForCausalLM.from_model(torch_model, backend="jax")
        del torch_model
    ids = loaded.generate(np.array(PROMPT), max_new_tokens=NEW_TOKENS, do_sample=False)
    print(json.dumps(np.asarray(ids).tolist()))


def address_space() -> int:
    """This process's virtual memory size in bytes (``VmSize``: what ``RLIMIT_AS`` bounds)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmSize: RLIMIT_AS cannot be set relative to it")


def run(engine: str, path: Path, headroom: int) -> subprocess.CompletedProcess:
    command = [sys.executable, __file__, engine, str(path), str(headroom)]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)


def tokens(done: subprocess.CompletedProcess) -> list[list[int]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_1b_model_streams_under_a_limit_transformers_path_exceeds(tmp_path):
    weights = write_checkpoint(tmp_path)
    assert weights > 2e9
    headroom = int(HEADROOM * weights)
    streamed = run("streamed", tmp_path, headroom)
    old = run("via-transformers", tmp_path, headroom)
    assert old.returncode != 0, "transformers' path fits the limit: the limit tests nothing"
    assert "MemoryError" in old.stderr or "memory" in old.stderr.lower(), old.stderr[-3000:]
    expected = tokens(run("transformers", tmp_path, 0))
    assert tokens(streamed) == expected


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
