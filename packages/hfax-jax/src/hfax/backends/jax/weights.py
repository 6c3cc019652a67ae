"""Moving a PyTorch model's weights into JAX arrays placed on devices (from the module's host tensors, or
read from the safetensors checkpoint straight into each device's piece), and back to the host."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.sharding import NamedSharding, SingleDeviceSharding

from hfax.backends.jax.mesh import partition, place
from hfax.backends.jax.runtime import to_tensor
from hfax.backends.jax.safetensors_reader import SafetensorsFile
from hfax.checkpoints import Checkpoint, TensorSource
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


def load_weights(
    model: torch.nn.Module, checkpoint: Checkpoint, plan: Any, mesh: Any
) -> dict[str, jax.Array]:
    """Like :func:`move_weights` for a model whose weights are on the ``meta`` device: each is read from
    ``checkpoint`` into the pieces this process's devices hold, converted to the weight's dtype.

    Only one device piece of one tensor is on the host at a time besides the placed arrays, and only the
    bytes of this process's pieces are read (see ``safetensors_reader``). Host tensors (the
    non-persistent buffers) are placed as :func:`move_weights` places them.
    """
    with _open_files(checkpoint) as files:

        def array(name: str, tensor: torch.Tensor) -> jax.Array:
            if tensor.device.type != "meta":
                return place(host_array(tensor), plan, name, mesh)
            source = checkpoint.sources[name]
            return read(files[source.file], source, tensor, _sharding(plan, name, tensor, mesh))

        return _install(model, array)


def read(
    file: SafetensorsFile, source: TensorSource, tensor: torch.Tensor, sharding: Any
) -> jax.Array:
    """The checkpoint tensor ``source`` as a global array laid out by ``sharding``, in ``tensor``'s dtype.

    ``jax.make_array_from_callback`` asks for exactly the index ranges of this process's devices, and
    only their bytes are read: a host reads its own shards, not the whole tensor. On CPU the piece read
    becomes the device buffer itself (aligned for it), so it is never copied.
    """
    dtype = host_array(torch.empty(0, dtype=tensor.dtype)).dtype

    def piece(index: tuple[slice, ...]) -> np.ndarray:
        return file.read(source.key, index, dtype)

    return jax.make_array_from_callback(tuple(tensor.shape), sharding, piece)


def _sharding(plan: Any, name: str, tensor: torch.Tensor, mesh: Any) -> Any:
    if mesh is None:
        return SingleDeviceSharding(jax.config.jax_default_device or jax.local_devices()[0])
    return NamedSharding(mesh, partition(plan, name, tuple(tensor.shape), dict(mesh.shape)))


@contextlib.contextmanager
def _open_files(checkpoint: Checkpoint) -> Iterator[dict[str, SafetensorsFile]]:
    files: dict[str, SafetensorsFile] = {}
    try:
        for file in checkpoint.files:
            files[file] = SafetensorsFile(file)
        yield files
    finally:
        for opened in files.values():
            opened.close()


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
