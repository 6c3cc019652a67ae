"""Device meshes with hfax's axis names, and where each weight goes on one."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hfax.registry import MESH_AXES, ShardingPlan


def make_mesh(**axis_sizes: int) -> Mesh:
    """A mesh over all devices with axes among ``data``, ``fsdp``, ``model``, e.g. ``make_mesh(data=2, model=4)``.

    Axes are of JAX's *Auto* type: jax 0.10's default (Explicit) makes torchax's reshapes fail.
    """
    unknown = set(axis_sizes) - set(MESH_AXES)
    if unknown or not axis_sizes:
        raise ValueError(f"mesh axes must be among {MESH_AXES}, got {sorted(axis_sizes) or 'none'}; e.g. make_mesh(model=8)")
    total = int(np.prod(list(axis_sizes.values())))
    if total != jax.device_count():
        raise ValueError(
            f"a mesh of {axis_sizes} needs {total} devices but {jax.device_count()} are visible; sizes must multiply to "
            "the device count (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)"
        )
    names = tuple(axis_sizes)
    return jax.make_mesh(tuple(axis_sizes.values()), names, axis_types=(AxisType.Auto,) * len(names))


def partition(plan: ShardingPlan, name: str, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Where weight ``name`` goes: the plan's ``model`` split where the mesh has that axis and the size divides,
    then ``fsdp`` over the largest remaining dimension it divides; anything else is replicated."""
    spec: list[str | None] = []
    for axis, size in zip(plan.spec_for(name, len(shape)), shape):
        keep = axis in mesh.shape and size % mesh.shape[axis] == 0
        spec.append(axis if keep else None)
    fsdp = mesh.shape.get("fsdp", 1)
    if fsdp > 1:
        free = [i for i, axis in enumerate(spec) if axis is None and shape[i] % fsdp == 0]
        if free:
            spec[max(free, key=lambda i: shape[i])] = "fsdp"
    return PartitionSpec(*spec)


def place(array: Any, plan: ShardingPlan, name: str, mesh: Mesh | None) -> jax.Array:
    """Put one host array on the device(s): whole on the default device, or split over ``mesh``."""
    if mesh is None:
        return jax.device_put(array)
    return jax.device_put(array, NamedSharding(mesh, partition(plan, name, array.shape, mesh)))
