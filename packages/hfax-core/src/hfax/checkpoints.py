"""Where each weight of a model lies in its safetensors checkpoint, so a backend can read it straight onto
its devices (``hfax_load_weights``) instead of transformers building the whole model on the host first.

transformers' own loading rules are kept: checkpoint keys are renamed by the model's registered
``WeightRenaming`` transforms (legacy names such as ``LayerNorm.gamma``, the ``base_model_prefix``), and
non-persistent buffers (rotary ``inv_freq``, embedding scales) are computed by the model's
``_init_weights`` exactly as transformers' ``from_pretrained`` computes them. A checkpoint that needs
more (a ``WeightConverter`` merging or splitting tensors, a quantization config, keys transformers would
initialize at random, GGUF or ``.bin`` files) is not streamable: :func:`find_checkpoint` says why and
the caller takes transformers' path.

:class:`CheckpointFile` is one open checkpoint file as both backends' ``safetensors_reader`` read it: the
reading that holds the least memory (a read straight into the device's buffer, or a conversion from the
file's mapping whose pages are dropped as it goes) is the same whatever array type the bytes end in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from hfax.tensors import tensor_slots

#: ``from_pretrained`` arguments the streamed path honours; any other sends the load to transformers.
STREAMABLE_KWARGS = frozenset({"dtype", "revision", "attn_implementation"})

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"


class NotStreamable(Exception):
    """The checkpoint must be loaded by transformers; the message says why."""


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """One weight's place in the checkpoint: the file and the key it is stored under there."""

    file: str
    key: str


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A safetensors checkpoint, as the model's state names see it.

    ``sources`` maps every parameter and persistent buffer name of the model (each name of a tied weight)
    to the tensor that holds it. Non-persistent buffers are not in it: they are computed on the host and
    already set on the module.
    """

    files: tuple[str, ...]
    sources: Mapping[str, TensorSource]


def safetensors_files(name_or_path: str, revision: str | None = None) -> list[str]:
    """The safetensors files of a local dir or Hub id (downloaded if needed), or ``[]`` if it has none."""
    from transformers.utils import cached_file

    def find(filename: str) -> str | None:
        return cached_file(
            name_or_path,
            filename,
            revision=revision,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )

    index = find(SAFETENSORS_INDEX)
    if index is not None:
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [find(shard) for shard in shards]
    single = find(SAFETENSORS_SINGLE)
    return [single] if single is not None else []


def find_checkpoint(name_or_path: str, model: Any, hf_kwargs: Mapping[str, Any]) -> Checkpoint:
    """The streamable checkpoint of ``name_or_path`` for ``model`` (built on the meta device), or
    :class:`NotStreamable` naming what makes transformers' own path necessary."""
    unknown = sorted(set(hf_kwargs) - STREAMABLE_KWARGS)
    if unknown:
        raise NotStreamable(f"from_pretrained arguments {unknown} are applied by transformers")
    if getattr(model.config, "quantization_config", None) is not None:
        raise NotStreamable("the checkpoint is quantized (config.quantization_config)")
    _check_dtype(model, hf_kwargs.get("dtype"))
    files = safetensors_files(name_or_path, hf_kwargs.get("revision"))
    if not files:
        raise NotStreamable("the checkpoint has no safetensors files (GGUF or .bin)")
    return Checkpoint(tuple(files), _sources(model, _checkpoint_keys(files)))


def _check_dtype(model: Any, dtype: Any) -> None:
    """Refuse the dtypes the meta model cannot tell: those transformers settles while loading."""
    import torch

    if isinstance(dtype, dict):
        raise NotStreamable("a dtype per sub-model is applied by transformers")
    if dtype in (None, "auto") and getattr(model.config, "dtype", None) is None:
        raise NotStreamable("the config names no dtype: transformers takes the checkpoint's")
    if model.dtype in (torch.float16, torch.bfloat16) and (
        model._keep_in_fp32_modules_strict
        or (model.dtype == torch.float16 and model._keep_in_fp32_modules)
    ):
        raise NotStreamable("the model keeps some modules in float32 while loading 16-bit weights")


def finish_model(model: Any, name_or_path: str, revision: str | None = None) -> None:
    """What transformers' ``from_pretrained`` sets after the weights: the name and generation config."""
    import transformers

    model.config.name_or_path = name_or_path
    if not model.can_generate():
        return
    try:
        model.generation_config = transformers.GenerationConfig.from_pretrained(
            name_or_path, revision=revision
        )
    except OSError:  # no generation_config.json: the one built from the model config stays
        pass


def read_header(path: str) -> tuple[int, dict[str, Any]]:
    """A safetensors file's header (``{key: {"dtype", "shape", "data_offsets"}}``) and where its data
    starts: the file is 8 bytes of header length, the JSON header, then the tensors' bytes."""
    with open(
        path, "rb", buffering=0
    ) as f:  # unbuffered: read the header's bytes, not a buffer's worth
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


#: At most this many stored bytes are converted at once, then dropped from resident memory: what a
#: converting read holds of the file besides its result (per reading thread). Larger blocks convert faster
#: (torch splits one conversion over its own threads), smaller ones hold less.
CONVERT_BLOCK_BYTES = 8 << 20
#: Buffers this large or larger have their pages allocated before a read fills them (:func:`populated`).
PREFAULT_MIN_BYTES = 1 << 20
#: Linux's ``madvise`` advice that allocates a mapping's pages now (Python's ``mmap`` does not name it).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


class CheckpointFile:
    """One open safetensors file, as a backend's ``safetensors_reader`` reads it: its header, where its
    data starts, :meth:`read_into` for bytes kept as stored and :meth:`mapped_run` for bytes converted as
    they go.

    Not ``safetensors.safe_open``: it maps the file, and every page a read touches stays in the process's
    resident memory while the file is open, so streaming a checkpoint through it holds the checkpoint
    twice (the mapped pages and the devices' copy). Bytes kept as stored are read with ``os.preadv``
    straight into the buffer that becomes the device's (counted by ``/proc/self/io`` ``rchar``). Bytes
    converted to another dtype are converted from the file's mapping without a copy first, and their
    pages leave the process's resident memory once converted, so converting a whole checkpoint holds one
    run's pages besides its result.

    The mapping is copy-on-write and never written: its pages are the page cache's, and numpy and torch
    take them as writable arrays. One mapping for all the runs, so reading threads fault pages in side by
    side (a mapping per run serializes them on the process's mmap lock).
    """

    #: How far before a faulting page Linux maps the file's cached pages along with it ("fault-around",
    #: 64 KiB by default): a run's first fault maps pages of the run before, which its drop covers again.
    FAULT_AROUND_BYTES = 64 << 10

    def __init__(self, path: str) -> None:
        self.path = path
        self.data_start, self.header = read_header(path)
        self.fd = os.open(path, os.O_RDONLY)
        self.mapped = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY)

    def close(self) -> None:
        self.mapped.close()
        os.close(self.fd)

    def read_into(self, key: str, buffer: memoryview, position: int) -> None:
        """Fill ``buffer`` with the bytes at file ``position`` (of tensor ``key``)."""
        if buffer.nbytes and os.preadv(self.fd, [buffer], position) != buffer.nbytes:
            raise OSError(f"{self.path} ends inside tensor {key!r}: the file is truncated")

    @contextlib.contextmanager
    def mapped_run(self, position: int, nbytes: int, key: str) -> Iterator[np.ndarray]:
        """The ``nbytes`` bytes at file ``position`` (of tensor ``key``) as a uint8 array, valid inside the
        ``with`` block; their pages, and those fault-around mapped before them, are dropped after it (the
        page cache keeps them; a page another thread still reads is faulted in again)."""
        end = position + nbytes
        if end > len(self.mapped):
            raise OSError(f"{self.path} ends inside tensor {key!r}: the file is truncated")
        yield np.frombuffer(self.mapped, np.uint8, nbytes, position)
        first = max(0, position // mmap.PAGESIZE * mmap.PAGESIZE - self.FAULT_AROUND_BYTES)
        self.mapped.madvise(mmap.MADV_DONTNEED, first, end - first)


File = TypeVar("File", bound=CheckpointFile)


@contextlib.contextmanager
def open_files(checkpoint: Checkpoint, reader: type[File]) -> Iterator[dict[str, File]]:
    """Each file of ``checkpoint`` opened as ``reader`` (a backend's :class:`CheckpointFile`), by path;
    all closed when the block ends."""
    files: dict[str, File] = {}
    try:
        for file in checkpoint.files:
            files[file] = reader(file)
        yield files
    finally:
        for opened in files.values():
            opened.close()


def populated(nbytes: int) -> mmap.mmap | None:
    """For a buffer of ``PREFAULT_MIN_BYTES`` or more, an anonymous mapping whose pages are all allocated
    now by one ``madvise(MADV_POPULATE_WRITE)``, not by one page fault per 4 KiB page while a read fills
    it (slow on this kind of VM); page-aligned. None for a smaller buffer. The array made of it keeps it
    alive, and it is unmapped with the array."""
    if nbytes < PREFAULT_MIN_BYTES:
        return None
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # Linux before 5.14: the read faults the pages in
        region.madvise(MADV_POPULATE_WRITE)
    return region


def _checkpoint_keys(files: list[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every key of the checkpoint with its file and shape, read from the files' headers alone."""
    keys = {}
    for file in files:
        for key, entry in read_header(file)[1].items():
            keys[key] = (file, tuple(entry["shape"]))
    return keys


def _sources(
    model: Any, keys: Mapping[str, tuple[str, tuple[int, ...]]]
) -> dict[str, TensorSource]:
    """Map the model's state names to checkpoint keys with transformers' renaming rules."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    expected = model.state_dict()
    found: dict[str, TensorSource] = {}
    for key, (file, shape) in keys.items():
        name, converted = rename_source_key(
            key, renamings, converters, model.base_model_prefix, expected
        )
        if converted is not None:
            raise NotStreamable(
                f"checkpoint key {key!r} needs transformers' weight conversion {converted!r}"
            )
        if name not in expected:
            continue  # transformers ignores unexpected keys too (e.g. old rotary inv_freq buffers)
        if shape != tuple(expected[name].shape):
            raise NotStreamable(
                f"checkpoint key {key!r} has shape {shape}, the model's {name!r} {tuple(expected[name].shape)}"
            )
        found[name] = TensorSource(file, key)
    return _tied_sources(model, found)


def _tied_sources(model: Any, found: dict[str, TensorSource]) -> dict[str, TensorSource]:
    """Give every name of a tied weight the source of the name the checkpoint stores it under."""
    by_tensor: dict[int, list[str]] = {}
    persistent: set[str] = set(model.state_dict())
    for full_name, _, _, tensor in tensor_slots(model):
        if full_name in persistent:
            by_tensor.setdefault(id(tensor), []).append(full_name)
    sources = {}
    for names in by_tensor.values():
        stored = next((found[name] for name in names if name in found), None)
        if stored is None:
            raise NotStreamable(
                f"the checkpoint lacks {names[0]!r}: transformers would initialize it at random"
            )
        sources.update(dict.fromkeys(names, stored))
    return sources


def compute_buffers(model: Any) -> None:
    """Give ``model``'s non-persistent buffers their values on the host, as transformers' loading does:
    an empty tensor each, filled by the model's ``_init_weights``; the meta weights are left alone."""
    import torch

    for *_, tensor in tensor_slots(model):
        tensor._is_hf_initialized = True  # tells transformers' init functions to skip it
    for full_name, buffer in model.named_non_persistent_buffers():
        module_name, _, name = full_name.rpartition(".")
        module = model.get_submodule(module_name)
        module._buffers[name] = torch.empty_like(buffer, device="cpu")
    model.initialize_weights()
    stray = [
        f"{prefix}.{attribute}"
        for prefix, module in model.named_modules()
        for attribute, value in vars(module).items()
        if isinstance(value, torch.Tensor) and value.device.type == "meta"
    ]
    if stray:
        raise NotStreamable(f"modules hold tensors that are neither weights nor buffers: {stray}")
