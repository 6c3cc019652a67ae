"""Moving a PyTorch model's weights into JAX arrays, placed on devices, and back to the host."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hfax.backends.jax.mesh import place
from hfax.backends.jax.runtime import to_tensor
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
    moved: dict[int, torch.Tensor] = {}
    params: dict[str, jax.Array] = {}
    for full_name, registry, name, tensor in tensor_slots(model):
        if id(tensor) not in moved:
            array = place(host_array(tensor), plan, full_name, mesh)
            params[full_name] = array
            view = to_tensor(array)
            moved[id(tensor)] = (
                torch.nn.Parameter(view, requires_grad=False)
                if isinstance(tensor, torch.nn.Parameter)
                else view
            )
        registry[name] = moved[id(tensor)]
    return params


def host_tensor(array: Any) -> torch.Tensor:
    """A JAX (or numpy) array as a CPU torch tensor, gathered from its devices (bfloat16 through its bit
    pattern): the inverse of :func:`host_array`."""
    array = np.asarray(jax.device_get(array))
    if array.dtype == jnp.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())
