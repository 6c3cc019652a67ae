"""Reading a safetensors file's tensors whole into fresh torch tensors, with ``os.preadv``.

Not ``safetensors.safe_open``: it memory-maps the file, and every page a read touches stays in the
process's resident memory while the file is open, so streaming a checkpoint through it holds the
checkpoint twice (the mapped pages and the device's copy). Read into a fresh tensor, only the tensor in
flight is on the host, and on CPU it becomes the device buffer itself (``sharding.load_weights``). A
tensor converted to another dtype is converted from a mapping of the file a block at a time, each
block's pages dropped once converted (:class:`hfax.checkpoints.MappedFile`).
"""

from __future__ import annotations

import contextlib
import mmap
import os

import torch

from hfax.checkpoints import MappedFile, read_header

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
#: At most this many stored bytes are converted at once, then dropped from resident memory. Larger blocks
#: convert faster (torch splits one conversion over its own threads), smaller ones hold less.
CONVERT_BLOCK_BYTES = 8 << 20
#: Tensors this large or larger have their pages allocated before they are read into (see :func:`empty`).
PREFAULT_MIN_BYTES = 1 << 20
#: Linux's ``madvise`` advice that allocates a mapping's pages now (Python's ``mmap`` does not name it).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


class SafetensorsFile:
    """One open safetensors file: its header, and ``read(key, dtype)`` for any of its tensors."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data_start, self.header = read_header(path)
        self.fd = os.open(path, os.O_RDONLY)
        self.mapped = MappedFile(path, self.fd)  # what converting reads read from

    def close(self) -> None:
        self.mapped.close()
        os.close(self.fd)

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
            self._read_into(key, block, begin)
            return out if block is out else out.copy_(block)
        row_bytes = max(1, out[:1].numel() * stored.itemsize)
        rows = max(1, CONVERT_BLOCK_BYTES // row_bytes)
        for first in range(0, shape[0], rows):
            block = out[first : first + rows]
            with self.mapped.run(begin + first * row_bytes, len(block) * row_bytes, key) as raw:
                block.copy_(torch.from_numpy(raw).view(stored).view(block.shape))
        return out

    def _read_into(self, key: str, tensor: torch.Tensor, position: int) -> None:
        if tensor.numel() == 0:
            return
        view = memoryview(tensor.view(-1).view(torch.uint8).numpy())
        if os.preadv(self.fd, [view], position) != view.nbytes:
            raise OSError(f"{self.path} ends inside tensor {key!r}: the file is truncated")


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new tensor; one of ``PREFAULT_MIN_BYTES`` or more gets its own anonymous mapping whose pages are
    all allocated by one ``madvise(MADV_POPULATE_WRITE)`` before the read fills them, not by one page
    fault per 4 KiB page during it (slow on this kind of VM). The tensor keeps the mapping alive."""
    count = 1
    for size in shape:
        count *= size
    nbytes = count * dtype.itemsize
    if nbytes < PREFAULT_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # Linux before 5.14: the read faults the pages in
        region.madvise(MADV_POPULATE_WRITE)
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).reshape(shape)
