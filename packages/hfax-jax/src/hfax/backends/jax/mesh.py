"""Device meshes with hfax's axis names, and where weights, inputs and the KV cache go on one.

Every placement builds its global array with ``jax.make_array_from_callback``: each process hands JAX
only the pieces its own devices hold, so the same code runs on one host and on a multi-host mesh
(``jax.distributed.initialize``) where a process sees only its local devices.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hfax.specs import MESH_AXES, ShardingPlan

#: The axes a batch is split over: ``data`` replicates parameters, ``fsdp`` shards them too.
BATCH_AXES = ("data", "fsdp")


def make_mesh(**axis_sizes: int) -> Mesh:
    """A mesh over all devices with axes among ``data``, ``fsdp``, ``model``, e.g. ``make_mesh(data=2, model=4)``.

    Axes are of JAX's *Auto* type: jax 0.10's default (Explicit) makes torchax's reshapes fail. On several
    hosts, call ``jax.distributed.initialize()`` first: the mesh then spans every process's devices.
    """
    unknown = set(axis_sizes) - set(MESH_AXES)
    if unknown or not axis_sizes:
        raise ValueError(
            f"mesh axes must be among {MESH_AXES}, got {sorted(axis_sizes) or 'none'}; e.g. make_mesh(model=8)"
        )
    total = int(np.prod(list(axis_sizes.values())))
    if total != jax.device_count():
        raise ValueError(
            f"a mesh of {axis_sizes} needs {total} devices but {jax.device_count()} are visible; sizes must multiply to "
            "the device count (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)"
        )
    names = tuple(axis_sizes)
    return jax.make_mesh(
        tuple(axis_sizes.values()), names, axis_types=(AxisType.Auto,) * len(names)
    )


def adopt(mesh: Mesh, axis_names: Mapping[str, str] | None = None) -> Mesh:
    """A user's mesh as hfax places weights on it: the same devices in the same order, with Auto axes named
    among ``data``, ``fsdp``, ``model``.

    ``axis_names`` maps hfax's names to the mesh's (``{"model": "tp", "data": "dp"}``). Explicit and
    Explicit/Auto-mixed axes (``jax.make_mesh``'s default in jax 0.10) become Auto: the transformers code
    hfax runs has no sharding annotations, so GSPMD decides where intermediates go, as on hfax's own meshes.
    A mesh whose axes hfax does not know is refused: every weight would stay whole on every device.
    """
    mapping = dict(axis_names or {})
    unknown = set(mapping) - set(MESH_AXES)
    if unknown:
        raise ValueError(
            f"axis_names keys must be hfax's axes {MESH_AXES}, got {sorted(unknown)}; e.g. "
            'axis_names={"model": "tp", "data": "dp"}'
        )
    missing = set(mapping.values()) - set(mesh.axis_names)
    if missing:
        raise ValueError(
            f"axis_names names {sorted(missing)}, which the mesh lacks (its axes: {mesh.axis_names})"
        )
    rename = {theirs: ours for ours, theirs in mapping.items()}
    names = tuple(rename.get(name, name) for name in mesh.axis_names)
    strange = [name for name in names if name not in MESH_AXES]
    if strange:
        raise ValueError(
            f"mesh axes {strange} are not among hfax's axes {MESH_AXES} (data: batch rows, fsdp: batch "
            "rows and weights, model: tensor parallelism); name them so in jax.make_mesh, or map them: "
            f"from_pretrained(..., mesh=mesh, axis_names={{'model': {strange[0]!r}}})"
        )
    return Mesh(mesh.devices, names, axis_types=(AxisType.Auto,) * len(names))


def partition(
    plan: ShardingPlan, name: str, shape: tuple[int, ...], sizes: Mapping[str, int]
) -> PartitionSpec:
    """Where weight ``name`` goes on a mesh of axis ``sizes`` (``dict(mesh.shape)``): see ``ShardingPlan.spec_on``."""
    return PartitionSpec(*plan.spec_on(name, shape, sizes))


def put(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array laid out by ``sharding`` from a host array every process holds whole."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def place(array: Any, plan: ShardingPlan, name: str, mesh: Mesh | None) -> jax.Array:
    """Put one host array on the device(s): whole on the default device, or split over ``mesh``."""
    if mesh is None:
        return jax.device_put(array)
    return put(array, NamedSharding(mesh, partition(plan, name, array.shape, dict(mesh.shape))))


def batch_axes(mesh: Mesh, batch: int) -> tuple[str, ...]:
    """The batch axes of ``mesh`` that together divide ``batch`` (the ``data`` axis first)."""
    axes: list[str] = []
    for axis in BATCH_AXES:
        if (
            mesh.shape.get(axis, 1) > 1
            and batch % int(np.prod([mesh.shape[a] for a in (*axes, axis)])) == 0
        ):
            axes.append(axis)
    return tuple(axes)


def batch_multiple(mesh: Mesh | None) -> int:
    """How many rows a batch needs so that every batch axis of ``mesh`` splits it."""
    return 1 if mesh is None else int(np.prod([mesh.shape.get(axis, 1) for axis in BATCH_AXES]))


def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Rows split over the batch axes, every other dimension whole."""
    if not shape:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(
        mesh, PartitionSpec(batch_axes(mesh, shape[0]) or None, *(None,) * (len(shape) - 1))
    )


def cache_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """A ``[batch, kv_heads, length, head_dim]`` cache buffer: rows over the batch axes, heads over ``model``.

    With fewer key/value heads than the ``model`` axis (or a count it does not divide) the heads are
    replicated: each device keeps every key/value head, as its k/v projections are whole too.
    """
    batch, heads = shape[:2]
    model = mesh.shape.get("model", 1)
    head_axis = "model" if model > 1 and heads % model == 0 else None
    return NamedSharding(
        mesh, PartitionSpec(batch_axes(mesh, batch) or None, head_axis, *(None,) * (len(shape) - 2))
    )


def shard_batch(tree: Any, mesh: Mesh | None) -> Any:
    """Host arrays in ``tree`` as global arrays split along their first (batch) dimension.

    Arrays that already span several processes are taken as placed.
    """
    if mesh is None:
        return jax.device_put(tree)  # not jnp.asarray: it compiles a conversion program per shape

    def one(x: Any) -> jax.Array:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        return put(np.asarray(x), batch_sharding(mesh, np.shape(x)))

    return jax.tree.map(one, tree)


def replicate(tree: Any, mesh: Mesh | None) -> Any:
    """Host values in ``tree`` (scalars, small arrays) as global arrays every device holds whole."""
    if mesh is None:
        return jax.device_put(tree)
    whole = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: put(np.asarray(x), whole), tree)


def constrain(tree: Any, sharding: Any) -> Any:
    """``jax.lax.with_sharding_constraint`` on every array of ``tree``; ``sharding(shape)`` picks each one's."""
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding(x.shape)), tree)


def replicate_position_tables(module: Any, mesh: Mesh) -> None:
    """Keep the cos/sin tables of ``module``'s rotary-embedding submodules (transformers names their classes
    ``...RotaryEmbedding``) whole on every device, wherever the model runs on ``mesh``.

    They are small (``[batch, tokens, head_dim]``) and every attention layer reads them. Left to sharding
    propagation under a ``model`` or ``fsdp`` axis, XLA partitions Qwen3.5's interleaved multimodal table
    (strided in-place writes into a slice of it) so that it comes out wrong: a sharded Qwen3.5's logits
    differed from PyTorch's by 0.7, where one device gives 3e-5.
    """
    from hfax.backends.jax.runtime import to_array, to_tensor

    whole = NamedSharding(mesh, PartitionSpec())

    def whole_tables(_module: Any, _inputs: Any, output: Any) -> Any:
        arrays = jax.tree.map(to_array, output)
        return to_tensor(constrain(arrays, lambda shape: whole))

    for submodule in module.modules():
        if type(submodule).__name__.endswith("RotaryEmbedding"):
            submodule.register_forward_hook(whole_tables)
