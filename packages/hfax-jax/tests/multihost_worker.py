"""One process of test_sharding's two-process run: ``python multihost_worker.py PORT CHECKPOINT MESH RANK``.

Each process sees its own 4 CPU devices; ``jax.distributed`` joins them into one 8-device mesh over
loopback, with gloo for the collectives. Prints the generated tokens (plain and streamed) as JSON lines.
"""

from __future__ import annotations

import os
import sys

port, checkpoint, mesh, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=4"  # before jax creates its CPU client
)

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank
)

import numpy as np  # noqa: E402

import hfax  # noqa: E402
from hfax.testing import left_padded  # noqa: E402

assert jax.device_count() == 8 and jax.local_device_count() == 4
sizes = {axis: int(size) for axis, size in (part.split("=") for part in mesh.split(","))}
model = hfax.AutoModelForTPU.from_pretrained(
    checkpoint, backend="jax", mesh=hfax.make_mesh(**sizes)
)
ids, mask = left_padded([[1, 5, 9, 23, 7, 3], [4, 8, 15, 16]])
options = {"max_new_tokens": 8, "min_new_tokens": 8}
print("TOKENS", np.asarray(model.generate(ids, mask, **options)).tolist(), flush=True)


class Collect:
    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []

    def put(self, value: object) -> None:
        self.chunks.append(np.asarray(value))

    def end(self) -> None:
        pass


streamed = model.generate(ids, mask, streamer=Collect(), **options)
print("STREAMED", np.asarray(streamed).tolist(), flush=True)
jax.distributed.shutdown()
