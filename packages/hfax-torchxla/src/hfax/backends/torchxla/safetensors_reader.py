"""Reading a safetensors file's tensors whole into fresh torch tensors.

Only the tensor in flight is on the host, and on CPU it becomes the device buffer itself
(``sharding.load_weights``): a tensor kept as stored is read straight into it, one converted to another
dtype is converted from the file's mapping a block at a time (:class:`hfax.checkpoints.CheckpointFile`).
"""

from __future__ import annotations

import torch

from hfax import checkpoints

#: safetensors' dtype names as torch dtypes.
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsFile(checkpoints.CheckpointFile):
    """One open safetensors file: its header, and ``read(key, dtype)`` for any of its tensors."""

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Tensor ``key`` as a new tensor of ``dtype`` (default: as stored). A conversion reads a block of
        rows at a time, so the stored bytes mapped in stay under ``CONVERT_BLOCK_BYTES`` besides the
        result."""
        entry = self.header[key]
        stored = DTYPES.get(entry["dtype"])
        if stored is None:
            raise ValueError(
                f"{self.path}: tensor {key!r} is stored as {entry['dtype']}, which hfax does not read; "
                f"supported: {sorted(DTYPES)}"
            )
        shape = tuple(entry["shape"])
        begin = self.data_start + entry["data_offsets"][0]
        out = empty(shape, stored if dtype is None else dtype)
        if out.dtype == stored or not shape:
            block = out if out.dtype == stored else empty(shape, stored)
            self.read_into(key, memoryview(block.view(-1).view(torch.uint8).numpy()), begin)
            return out if block is out else out.copy_(block)
        row_bytes = max(1, out[:1].numel() * stored.itemsize)
        rows = max(1, checkpoints.CONVERT_BLOCK_BYTES // row_bytes)
        for first in range(0, shape[0], rows):
            block = out[first : first + rows]
            with self.mapped_run(begin + first * row_bytes, len(block) * row_bytes, key) as raw:
                block.copy_(torch.from_numpy(raw).view(stored).view(block.shape))
        return out


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new tensor; a large one has its pages allocated before the read fills them
    (:func:`hfax.checkpoints.populated`)."""
    count = 1
    for size in shape:
        count *= size
    region = checkpoints.populated(count * dtype.itemsize)
    if region is None:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).reshape(shape)
