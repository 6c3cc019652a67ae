"""One process of test_sharding's two-process runs: ``python multihost_worker.py PORT CHECKPOINT MESH RANK
[streamer]``.

Each process sees its own half of the mesh's CPU devices; ``jax.distributed`` joins them into one mesh
over loopback, with gloo for the collectives. Prints the generated tokens (plain and streamed) as JSON
lines (with a streamer too if asked), and the bytes this process read while loading the checkpoint a
second time, once the first load has imported every module (``rchar`` of ``/proc/self/io``).
"""

from __future__ import annotations

import os
import sys

port, checkpoint, mesh, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with_streamer = sys.argv[5:] == ["streamer"]
sizes = {axis: int(size) for axis, size in (part.split("=") for part in mesh.split(","))}
devices = 1
for size in sizes.values():
    devices *= size
# Before jax creates its CPU client: each of the two processes holds half the devices.
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices // 2}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank
)

import numpy as np  # noqa: E402

import hfax  # noqa: E402
from hfax.testing import left_padded  # noqa: E402


def bytes_read() -> int:
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar")).split()[1])


assert jax.device_count() == devices and jax.local_device_count() == devices // 2
device_mesh = hfax.make_mesh(**sizes)
hfax.AutoModelForTPU.from_pretrained(checkpoint, backend="jax", mesh=device_mesh)
before = bytes_read()
model = hfax.AutoModelForTPU.from_pretrained(checkpoint, backend="jax", mesh=device_mesh)
print("READ", bytes_read() - before, flush=True)
ids, mask = left_padded([[1, 5, 9, 23, 7, 3], [4, 8, 15, 16]])
options = {"max_new_tokens": 8, "min_new_tokens": 8}
print("TOKENS", np.asarray(model.generate(ids, mask, **options)).tolist(), flush=True)


if with_streamer:

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
