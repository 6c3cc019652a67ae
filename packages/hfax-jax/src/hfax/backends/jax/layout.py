"""What a sharding plan puts on each device, from shapes alone, and how much a device can hold."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
import torch
from jax.sharding import Mesh

from hfax import tensors
from hfax.specs import Layout, Placement, ShardingPlan, configured_device_memory


def device_memory(devices: list[Any]) -> tuple[int | None, str]:
    """The bytes each of ``devices`` can still take (the least of them) and where that number came from.

    ``HFAX_DEVICE_MEMORY`` (e.g. ``16GB``) wins; otherwise the devices' own ``memory_stats`` (TPU, GPU).
    CPU devices report none, so on CPU nothing is checked unless the variable is set.
    """
    configured = configured_device_memory()
    if configured[0] is not None:
        return configured
    free = []
    for device in devices:
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    if not free:
        return None, ""
    return min(free), f"free memory of a {devices[0].device_kind}"


def plan_layout(
    model: torch.nn.Module, plan: ShardingPlan, mesh: Mesh | Mapping[str, int] | None
) -> Layout:
    """The layout ``move_weights`` will give ``model``'s tensors (real or on the ``meta`` device).

    ``mesh`` may be a mapping of axis sizes, to plan for devices that are not attached; the device memory
    is then that of the local devices (or ``HFAX_DEVICE_MEMORY``).
    """
    sizes = {} if mesh is None else dict(mesh.shape if isinstance(mesh, Mesh) else mesh)
    devices = list(mesh.local_devices) if isinstance(mesh, Mesh) else jax.local_devices()
    return tensors.plan_layout(model, plan, sizes, *device_memory(devices))


def array_layout(params: Mapping[str, jax.Array], mesh: Mesh | None) -> Layout:
    """The layout placed arrays have: what ``model.sharding_report()`` prints."""
    placements = []
    for name, array in params.items():
        spec = tuple(getattr(array.sharding, "spec", ()))
        spec = tuple(
            axis if axis is None or isinstance(axis, str) else "+".join(axis) for axis in spec
        )
        spec += (None,) * (array.ndim - len(spec))
        shard = int(np.prod(array.sharding.shard_shape(array.shape))) * array.dtype.itemsize
        placements.append(
            Placement(name, tuple(array.shape), str(array.dtype), spec, int(array.nbytes), shard)
        )
    return Layout(tuple(dict(mesh.shape).items()) if mesh is not None else (), tuple(placements))
