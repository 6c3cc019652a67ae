"""Reading index ranges of safetensors tensors with ``pread``: the bytes of one device's piece and no more.

``safetensors``' own ``get_slice`` reads the whole tensor when the file is not memory-mapped, and a
memory-mapped file keeps every page it touched resident until it is closed (a second copy of the model
in the process's resident memory). Here each piece is read by ``os.preadv`` straight into the array
that holds it: one read per contiguous run of its bytes, nothing mapped, nothing read twice.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Any

import jax.numpy as jnp
import numpy as np

#: safetensors dtype names as numpy dtypes (bfloat16 and float8 as JAX has them).
DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": jnp.bfloat16,
    "F8_E4M3": jnp.float8_e4m3fn,
    "F8_E5M2": jnp.float8_e5m2,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsFile:
    """One open safetensors file: its header, and ``read(key, index)`` for any box of any tensor."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        (length,) = struct.unpack("<Q", os.pread(self.fd, 8, 0))
        header = json.loads(os.pread(self.fd, length, 8))
        header.pop("__metadata__", None)
        self.data_start = 8 + length
        self.header = header

    def close(self) -> None:
        os.close(self.fd)

    def read(self, key: str, index: tuple[slice, ...] = ()) -> np.ndarray:
        """Tensor ``key``'s box ``index`` (unit-step slices, one per leading dimension) as a new array."""
        entry = self.header[key]
        dtype = np.dtype(DTYPES[entry["dtype"]])
        shape = tuple(entry["shape"])
        begin = self.data_start + entry["data_offsets"][0]
        bounds = [_bounds(part, size) for part, size in zip(index, shape)]
        bounds += [(0, size) for size in shape[len(bounds) :]]
        out = np.empty([stop - start for start, stop in bounds], dtype)
        if out.size == 0:
            return out
        for position, run in _runs(shape, bounds, dtype.itemsize, begin, out):
            view = memoryview(run.view(np.uint8))
            if os.preadv(self.fd, [view], position) != view.nbytes:
                raise OSError(f"{self.path} ends inside tensor {key!r}: the file is truncated")
        return out


def _bounds(part: slice, size: int) -> tuple[int, int]:
    start, stop, step = part.indices(size)
    if step != 1:
        raise ValueError(f"a device piece is a box of unit-step slices, not {part}")
    return start, stop


def _runs(
    shape: tuple[int, ...], bounds: list[tuple[int, int]], itemsize: int, begin: int, out: Any
) -> list[tuple[int, np.ndarray]]:
    """The contiguous byte runs of the box ``bounds``: (file position, the part of ``out`` it fills)."""
    whole = len(shape)  # the dimensions from ``whole`` on are taken entire
    while whole > 0 and bounds[whole - 1] == (0, shape[whole - 1]):
        whole -= 1
    if whole == 0:
        return [(begin, out.reshape(-1))]
    strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) * itemsize for i in range(len(shape))]
    run_dim = whole - 1  # the last partial dimension: one run spans its range and everything after
    first = begin + bounds[run_dim][0] * strides[run_dim]
    outer = [
        np.arange(start, stop) * strides[i] for i, (start, stop) in enumerate(bounds[:run_dim])
    ]
    offsets = (
        functools.reduce(np.add, np.ix_(*outer)).reshape(-1) if outer else np.zeros(1, np.int64)
    )
    rows = out.reshape(len(offsets), -1)
    return [(int(first + offset), row) for offset, row in zip(offsets, rows)]
