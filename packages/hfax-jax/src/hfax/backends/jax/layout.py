"""What a sharding plan puts on each device, from shapes alone, and how much a device can hold."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import jax
import numpy as np
import torch
from jax.sharding import Mesh

from hfax.backends.jax.mesh import partition
from hfax.registry import Layout, Placement, ShardingPlan
from hfax.tensors import distinct_tensors

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """``"16GB"``, ``"512MiB"``, ``"1e9"`` as bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"expected a size such as 16GB, 512MiB or 1e9, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def device_memory(devices: list[Any]) -> tuple[int | None, str]:
    """The bytes each of ``devices`` can still take (the least of them) and where that number came from.

    ``HFAX_DEVICE_MEMORY`` (e.g. ``16GB``) wins; otherwise the devices' own ``memory_stats`` (TPU, GPU).
    CPU devices report none, so on CPU nothing is checked unless the variable is set.
    """
    configured = os.environ.get("HFAX_DEVICE_MEMORY")
    if configured:
        try:
            return parse_size(configured), "HFAX_DEVICE_MEMORY"
        except ValueError as error:
            raise ValueError(f"HFAX_DEVICE_MEMORY: {error}") from None
    free = []
    for device in devices:
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    if not free:
        return None, ""
    return min(free), f"free memory of a {devices[0].device_kind}"


def plan_layout(model: torch.nn.Module, plan: ShardingPlan, mesh: Mesh | Mapping[str, int] | None) -> Layout:
    """The layout ``move_weights`` will give ``model``'s tensors (real or on the ``meta`` device).

    ``mesh`` may be a mapping of axis sizes, to plan for devices that are not attached; the device memory
    is then that of the local devices (or ``HFAX_DEVICE_MEMORY``).
    """
    sizes = {} if mesh is None else dict(mesh.shape if isinstance(mesh, Mesh) else mesh)
    placements = []
    for name, tensor in distinct_tensors(model).items():
        shape = tuple(tensor.shape)
        spec = tuple(partition(plan, name, shape, sizes)) if sizes else ()
        spec += (None,) * (len(shape) - len(spec))
        whole = int(np.prod(shape)) * tensor.element_size()
        split = int(np.prod([sizes[axis] for axis in spec if axis is not None]))
        placements.append(Placement(name, shape, str(tensor.dtype).removeprefix("torch."), spec, whole, whole // split))
    devices = list(mesh.local_devices) if isinstance(mesh, Mesh) else jax.local_devices()
    memory, source = device_memory(devices)
    return Layout(tuple(sizes.items()), tuple(placements), memory, source)


def array_layout(params: Mapping[str, jax.Array], mesh: Mesh | None) -> Layout:
    """The layout placed arrays have: what ``model.sharding_report()`` prints."""
    placements = []
    for name, array in params.items():
        spec = tuple(getattr(array.sharding, "spec", ()))
        spec = tuple(axis if axis is None or isinstance(axis, str) else "+".join(axis) for axis in spec)
        spec += (None,) * (array.ndim - len(spec))
        shard = int(np.prod(array.sharding.shard_shape(array.shape))) * array.dtype.itemsize
        placements.append(Placement(name, tuple(array.shape), str(array.dtype), spec, int(array.nbytes), shard))
    return Layout(tuple(dict(mesh.shape).items()) if mesh is not None else (), tuple(placements))
