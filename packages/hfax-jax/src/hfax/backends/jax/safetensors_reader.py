"""Reading index ranges of safetensors tensors: the bytes of one device's piece and no more.

``safetensors``' own ``get_slice`` reads the whole tensor when the file is not memory-mapped, and a
memory-mapped file keeps every page it touched resident until it is closed (a second copy of the model
in the process's resident memory). Here each piece is read straight into the array that holds it, one
read per contiguous run of its bytes, nothing read twice; a piece converted to another dtype is
converted from the file's mapping a block at a time (:class:`hfax.checkpoints.CheckpointFile`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

from hfax import checkpoints

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

#: numpy dtypes torch cannot take from numpy (ml_dtypes' floats): (same-sized integer dtype to pass the
#: bytes through, the torch dtype to view them as).
TORCH_VIEWS = {
    np.dtype(jnp.bfloat16): (np.int16, torch.bfloat16),
    np.dtype(jnp.float8_e4m3fn): (np.uint8, torch.float8_e4m3fn),
    np.dtype(jnp.float8_e5m2): (np.uint8, torch.float8_e5m2),
}

#: The alignment XLA's CPU client needs to use a host buffer in place.
ALIGNMENT = 64


class SafetensorsFile(checkpoints.CheckpointFile):
    """One open safetensors file: its header, and ``read(key, index)`` for any box of any tensor."""

    def read(self, key: str, index: tuple[slice, ...] = (), dtype: Any = None) -> np.ndarray:
        """Tensor ``key``'s box ``index`` (unit-step slices, one per leading dimension) as a new array,
        converted to ``dtype`` (default: as stored) a block of rows at a time, so that the stored bytes
        mapped in stay under ``CONVERT_BLOCK_BYTES`` besides the result."""
        entry = self.header[key]
        stored = np.dtype(DTYPES[entry["dtype"]])
        shape = tuple(entry["shape"])
        bounds = [_bounds(part, size) for part, size in zip(index, shape)]
        bounds += [(0, size) for size in shape[len(bounds) :]]
        out = empty([stop - start for start, stop in bounds], stored if dtype is None else dtype)
        if out.dtype == stored:
            self._read_box(key, bounds, out)
            return out
        if not shape:
            block = np.empty((), stored)
            self._read_box(key, bounds, block)
            _convert(out, block)
            return out
        rows = max(1, checkpoints.CONVERT_BLOCK_BYTES // max(1, out[:1].size * stored.itemsize))
        start, stop = bounds[0]
        begin = self.data_start + entry["data_offsets"][0]
        for first in range(start, stop, rows):
            part = [(first, min(first + rows, stop)), *bounds[1:]]
            block = out[first - start : part[0][1] - start]
            for position, run in _runs(shape, part, stored.itemsize, begin, block):
                with self.mapped_run(position, run.size * stored.itemsize, key) as raw:
                    _convert(run, raw.view(stored))
        return out

    def _read_box(self, key: str, bounds: list[tuple[int, int]], out: np.ndarray) -> None:
        entry = self.header[key]
        if out.size == 0:
            return
        begin = self.data_start + entry["data_offsets"][0]
        for position, run in _runs(tuple(entry["shape"]), bounds, out.itemsize, begin, out):
            self.read_into(key, memoryview(run.view(np.uint8)), position)


def _convert(out: np.ndarray, block: np.ndarray) -> None:
    """``out[...] = block`` in ``out``'s dtype, rounding as PyTorch does (what transformers' ``dtype=``
    loads). Through torch where both dtypes are torch's: its conversions are vectorized (float32 to
    bfloat16 faster than numpy's through ml_dtypes) and release the GIL, so the reading threads of
    ``weights.load_weights`` convert at once."""
    target, source = _as_torch(out), _as_torch(block)
    if target is None or source is None:
        np.copyto(out, block, casting="unsafe")
    else:
        target.copy_(source)


def _as_torch(array: np.ndarray) -> torch.Tensor | None:
    """A torch view of ``array``'s memory in its own dtype, or None where torch has no such dtype."""
    view = TORCH_VIEWS.get(array.dtype)
    if view is not None:
        return torch.from_numpy(array.view(view[0])).view(view[1])
    try:
        return torch.from_numpy(array)
    except TypeError:
        return None


def empty(shape: list[int] | tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new array whose data starts on a 64-byte boundary: JAX's CPU client then keeps it as the device
    buffer instead of copying it (numpy's own allocations are 16-byte aligned: a copy, twice the bytes).
    A large one has its pages allocated before the read fills them (:func:`hfax.checkpoints.populated`)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    region = checkpoints.populated(nbytes)
    if region is not None:
        return np.frombuffer(region, dtype).reshape(shape)  # page-aligned
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


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
