"""Weights on the XLA device (moved from the module's host tensors, or read from the safetensors checkpoint
one at a time), and over a device mesh with SPMD (``torch_xla.distributed.spmd``).

On a mesh, every weight is marked with the layout the family's :class:`~hfax.specs.ShardingPlan` gives it
(``ShardingPlan.spec_on``, the same rule the JAX backend follows); the XLA compiler's sharding propagation
places activations and the KV cache and inserts the collectives.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
import torch_xla.utils.dlpack as xla_dlpack

from hfax import checkpoints, tensors
from hfax.backends.torchxla import runtime
from hfax.backends.torchxla.safetensors_reader import SafetensorsFile
from hfax.checkpoints import Checkpoint
from hfax.specs import MESH_AXES, Layout, ShardingPlan, configured_device_memory


def make_mesh(**axis_sizes: int) -> xs.Mesh:
    """An SPMD mesh over every device with axes among ``data``, ``fsdp``, ``model``, e.g. ``make_mesh(model=4)``.

    Starts the runtime in SPMD mode, which must happen before any other XLA work of the process. On CPU,
    set ``CPU_NUM_DEVICES=N`` before the process starts (``XLA_FLAGS=--xla_force_host_platform_device_count``
    is ignored by PyTorch/XLA).
    """
    unknown = set(axis_sizes) - set(MESH_AXES)
    if unknown or not axis_sizes:
        raise ValueError(
            f"mesh axes must be among {MESH_AXES}, got {sorted(axis_sizes) or 'none'}; e.g. make_mesh(model=4)"
        )
    runtime.start(spmd=True)
    count = xr.global_runtime_device_count()
    total = int(np.prod(list(axis_sizes.values())))
    if total != count:
        raise ValueError(
            f"a mesh of {axis_sizes} needs {total} devices but {count} are visible; sizes must multiply to the device "
            "count (on CPU, set CPU_NUM_DEVICES=N before starting the process)"
        )
    return xs.Mesh(np.arange(count), tuple(axis_sizes.values()), tuple(axis_sizes))


def as_mesh(mesh: Any) -> xs.Mesh | None:
    """``None``, a ``torch_xla`` SPMD mesh, or a mapping of axis sizes (``{"model": 4}``) as a mesh."""
    if mesh is None or isinstance(mesh, xs.Mesh):
        return mesh
    if isinstance(mesh, Mapping):
        return make_mesh(**mesh)
    raise TypeError(
        f"backend 'torch_xla' takes mesh=None, a mapping of axis sizes such as {{'model': 4}}, or a "
        f"torch_xla.distributed.spmd.Mesh; got {type(mesh).__name__} (hfax.make_mesh builds JAX meshes)"
    )


def axis_sizes(mesh: xs.Mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.mesh_shape))


def move_weights(model: torch.nn.Module, plan: ShardingPlan, mesh: Any) -> dict[str, torch.Tensor]:
    """Put ``model``'s tensors on the XLA device and, on a mesh, mark each weight's layout; return the distinct
    tensors by ``state_dict`` name.

    Tensors move one by one (``Module.to`` would give each module its own copy of a tied weight on XLA), and
    each host tensor is dropped from the module once moved, so host memory holds the model once.
    """
    return _place(model, plan, mesh, lambda name, tensor: tensor.detach())


def load_weights(
    model: torch.nn.Module, checkpoint: Checkpoint, plan: ShardingPlan, mesh: Any
) -> dict[str, torch.Tensor]:
    """Like :func:`move_weights` for a model whose weights are on the ``meta`` device: each weight is read
    from ``checkpoint`` into a fresh host tensor, converted to its dtype and placed before the next is
    read. On one CPU device the fresh tensor becomes the device buffer itself (DLPack: no copy), so the
    host holds the weights once; elsewhere it is copied to the device and dropped. Host tensors (the
    non-persistent buffers) move as :func:`move_weights` moves them.

    Each process reads whole tensors: PyTorch/XLA's SPMD places a host tensor on the one virtual device
    and splits it there (``xs.mark_sharding``); reading only a process's shards would need a sharded
    tensor built from per-device pieces (docs/SHARDING.md).
    """
    with checkpoints.open_files(checkpoint, SafetensorsFile) as files:

        def read(name: str, tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device.type != "meta":
                return tensor.detach()
            source = checkpoint.sources[name]
            return files[source.file].read(source.key, tensor.dtype)

        return _place(model, plan, mesh, read, fresh=True)


def _place(
    model: torch.nn.Module,
    plan: ShardingPlan,
    mesh: Any,
    host_tensor: Callable[[str, torch.Tensor], torch.Tensor],
    fresh: bool = False,
) -> dict[str, torch.Tensor]:
    """Replace each distinct tensor of ``model`` by ``host_tensor(state name, tensor)`` moved to the XLA
    device (a tied weight once, every module holding it pointed at the one device tensor), then mark the
    weights' layouts on a mesh. ``fresh``: ``host_tensor`` reads new tensors for the ``meta`` weights,
    which on one CPU device become device buffers without a copy (the module's own buffers are copied)."""
    runtime.start(spmd=mesh is not None)
    # decided once the runtime has started: asking for the platform first could start it without SPMD
    adopt = fresh and mesh is None and runtime.platform() == "CPU"
    mesh = as_mesh(mesh)
    device = runtime.device()
    moved: dict[int, torch.Tensor] = {}
    placed_by_name: dict[str, torch.Tensor] = {}
    for full_name, registry, name, tensor in tensors.tensor_slots(model):
        if id(tensor) not in moved:
            host = host_tensor(full_name, tensor)
            read = adopt and tensor.device.type == "meta" and host.is_contiguous()
            placed = xla_dlpack.from_dlpack(host) if read else host.to(device)
            if isinstance(tensor, torch.nn.Parameter):
                placed = torch.nn.Parameter(placed, requires_grad=False)
            moved[id(tensor)] = placed_by_name[full_name] = placed
        registry[name] = moved[id(tensor)]
    if mesh is not None:
        sizes = axis_sizes(mesh)
        for name, tensor in placed_by_name.items():
            spec = plan.spec_on(name, tuple(tensor.shape), sizes)
            if any(axis is not None for axis in spec):
                xs.mark_sharding(tensor, mesh, spec)
    return placed_by_name


def plan_layout(model: torch.nn.Module, plan: ShardingPlan, mesh: Any) -> Layout:
    """What :func:`move_weights` will put on each device, from shapes alone (``model`` may be on ``meta``).

    ``mesh`` may be a mapping of axis sizes. The device memory is ``HFAX_DEVICE_MEMORY`` only: asking
    PyTorch/XLA for it would start the runtime, before SPMD could still be chosen.
    """
    sizes = {} if mesh is None else axis_sizes(mesh) if isinstance(mesh, xs.Mesh) else dict(mesh)
    return tensors.plan_layout(model, plan, sizes, *configured_device_memory())


def spec_of(tensor: torch.Tensor) -> str:
    """The sharding XLA holds for ``tensor`` (``""`` when replicated or not sharded)."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(tensor)
