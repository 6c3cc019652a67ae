"""Moving a PyTorch model's weights into JAX arrays placed on devices (from the module's host tensors, or
read from the safetensors checkpoint straight into each device's piece), and back to the host."""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.sharding import NamedSharding, SingleDeviceSharding

from hfax import checkpoints
from hfax.backends.jax.mesh import partition, place
from hfax.backends.jax.runtime import to_tensor
from hfax.backends.jax.safetensors_reader import SafetensorsFile
from hfax.checkpoints import Checkpoint
from hfax.tensors import tensor_slots


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy without a copy where possible (bfloat16 through its bit pattern)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
    return tensor.numpy()


def host_tensor(array: Any) -> torch.Tensor:
    """A JAX or numpy array as a CPU torch tensor, gathered whole (bfloat16 through its bit pattern, which
    numpy cannot hand torch): the inverse of :func:`host_array`."""
    array = np.array(array)  # a writable copy: torch warns on JAX's read-only host buffers
    if array.dtype == jnp.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def move_weights(model: torch.nn.Module, plan: Any, mesh: Any) -> dict[str, jax.Array]:
    """Place every parameter and buffer of ``model`` and make the module hold torchax views of them.

    Returns ``{state name: jax.Array}`` with one entry per distinct tensor (tied weights once). Each host
    tensor is dropped from the module as soon as it is placed, so host memory holds the model once, and
    each device receives only its own shard of a split tensor.
    """
    return _install(model, lambda name, tensor: place(host_array(tensor), plan, name, mesh))


#: Threads reading checkpoint pieces while the main thread places the ones already read: a read is a copy
#: out of the page cache into freshly allocated pages (and a dtype conversion), which releases the GIL,
#: so two cores read at once and reading overlaps placing.
READ_THREADS = 2
#: At most this many bytes of pieces read ahead of the tensor being placed (at least one tensor's, however
#: large): on an accelerator each piece is host memory until it is placed; on CPU it becomes the device
#: buffer itself, so reading ahead costs nothing there.
READ_AHEAD_BYTES = 128 << 20


def load_weights(
    model: torch.nn.Module, checkpoint: Checkpoint, plan: Any, mesh: Any
) -> dict[str, jax.Array]:
    """Like :func:`move_weights` for a model whose weights are on the ``meta`` device: each is read from
    ``checkpoint`` into the pieces this process's devices hold, converted to the weight's dtype.

    Only the bytes of this process's pieces are read (see ``safetensors_reader``), a few tensors ahead of
    the one being placed (:class:`ReadAhead`). Host tensors (the non-persistent buffers) are placed as
    :func:`move_weights` places them.
    """
    meta = {
        name: tensor
        for name, tensor in _distinct_tensors(model).items()
        if tensor.device.type == "meta"
    }
    with (
        checkpoints.open_files(checkpoint, SafetensorsFile) as files,
        ThreadPoolExecutor(READ_THREADS) as pool,
    ):
        ahead = ReadAhead(pool)
        for name, tensor in meta.items():
            source = checkpoint.sources[name]
            sharding = _sharding(plan, name, tensor, mesh)
            ahead.add(name, files[source.file], source.key, tensor, sharding)

        def array(name: str, tensor: torch.Tensor) -> jax.Array:
            if tensor.device.type != "meta":
                return place(host_array(tensor), plan, name, mesh)
            return ahead.array(name)

        return _install(model, array)


class ReadAhead:
    """Checkpoint tensors read on a thread pool in the order they will be placed, ``READ_AHEAD_BYTES`` ahead.

    Each tensor's pieces are the index boxes ``jax.make_array_from_callback`` will ask for, in its order
    (one box for a replicated array, else one per addressable device): :meth:`array` hands it the pieces
    already read, and reads any box it did not foresee on the spot. A host reads its own devices' pieces,
    not the whole tensor; on CPU each piece read becomes the device buffer itself (aligned for it).
    """

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        #: name -> (file, key, shape, sharding, dtype, bytes of this process's pieces)
        self.tensors: dict[
            str, tuple[SafetensorsFile, str, tuple[int, ...], Any, np.dtype, int]
        ] = {}
        self.waiting: collections.deque[str] = collections.deque()  # added, not yet submitted
        self.reading: dict[str, dict[tuple, collections.deque[Future]]] = {}
        self.bytes_ahead = 0

    def add(
        self, name: str, file: SafetensorsFile, key: str, tensor: torch.Tensor, sharding: Any
    ) -> None:
        dtype = host_array(torch.empty(0, dtype=tensor.dtype)).dtype
        shape = tuple(tensor.shape)
        self.tensors[name] = (file, key, shape, sharding, dtype, _nbytes(shape, sharding, dtype))
        self.waiting.append(name)

    def array(self, name: str) -> jax.Array:
        """Tensor ``name`` as a global array laid out by its sharding."""
        file, key, shape, sharding, dtype, nbytes = self.tensors[name]
        self._submit(until=name)
        pending = self.reading.pop(name, {})

        def piece(index: tuple[slice, ...]) -> np.ndarray:
            queued = pending.get(_box(index, shape))
            if queued:
                return queued.popleft().result()
            return file.read(key, index, dtype)

        array = jax.make_array_from_callback(shape, sharding, piece)
        self.bytes_ahead -= nbytes
        self._submit()
        return array

    def _submit(self, until: str | None = None) -> None:
        """Start reading waiting tensors while under ``READ_AHEAD_BYTES`` ahead, and at least ``until``."""
        while self.waiting and (
            self.bytes_ahead < READ_AHEAD_BYTES or (until is not None and until not in self.reading)
        ):
            name = self.waiting.popleft()
            file, key, shape, sharding, dtype, nbytes = self.tensors[name]
            boxes: dict[tuple, collections.deque[Future]] = {}
            for index in _pieces(shape, sharding):
                future = self.pool.submit(file.read, key, index, dtype)
                boxes.setdefault(_box(index, shape), collections.deque()).append(future)
            self.reading[name] = boxes
            self.bytes_ahead += nbytes


def _pieces(shape: tuple[int, ...], sharding: Any) -> list[tuple[slice, ...]]:
    """The index boxes ``jax.make_array_from_callback`` asks for, in its order."""
    if sharding.is_fully_replicated:
        return [(slice(None),) * len(shape)]
    return list(sharding.addressable_devices_indices_map(shape).values())


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple:
    return tuple(part.indices(size)[:2] for part, size in zip(index, shape))


def _nbytes(shape: tuple[int, ...], sharding: Any, dtype: np.dtype) -> int:
    pieces = 1 if sharding.is_fully_replicated else len(sharding.addressable_devices)
    return pieces * int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * dtype.itemsize


def _distinct_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each distinct tensor of ``model`` under the first state name :func:`_install` meets it by."""
    seen: set[int] = set()
    tensors = {}
    for full_name, _, _, tensor in tensor_slots(model):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors[full_name] = tensor
    return tensors


def _sharding(plan: Any, name: str, tensor: torch.Tensor, mesh: Any) -> Any:
    if mesh is None:
        return SingleDeviceSharding(jax.config.jax_default_device or jax.local_devices()[0])
    return NamedSharding(mesh, partition(plan, name, tuple(tensor.shape), dict(mesh.shape)))


def _install(
    model: torch.nn.Module, array_for: Callable[[str, torch.Tensor], jax.Array]
) -> dict[str, jax.Array]:
    """Replace each distinct tensor of ``model`` by a torchax view of ``array_for(state name, tensor)``."""
    moved: dict[int, torch.Tensor] = {}
    params: dict[str, jax.Array] = {}
    for full_name, registry, name, tensor in tensor_slots(model):
        if id(tensor) not in moved:
            array = array_for(full_name, tensor)
            params[full_name] = array
            view = to_tensor(array)
            moved[id(tensor)] = (
                torch.nn.Parameter(view, requires_grad=False)
                if isinstance(tensor, torch.nn.Parameter)
                else view
            )
        registry[name] = moved[id(tensor)]
    return params
