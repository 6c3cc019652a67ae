"""The JAX backend's hook implementations (entry point ``jax`` in group ``hfax``).

Importing this module imports neither torch nor jax: ``hfax plugins`` stays cheap.
"""

from __future__ import annotations

from typing import Any, Callable

from hfax import BackendSpec, hookimpl

NAME = "jax"


@hookimpl
def hfax_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            NAME, "hfax.backends.jax.backend:JaxBackend", "JAX through torchax (TPU, GPU, CPU)"
        )
    ]


@hookimpl
def hfax_patch_model(model: Any, family: str, backend: str, patcher: Any) -> None:
    """Attention through hfax's JAX kernel for the families that declare transformers' attention
    contract (``FamilySpec.features``); every other model keeps its own. Expert layers run transformers'
    ``"grouped_mm"``, which :mod:`hfax.backends.jax.lowerings` lowers to ``ragged_dot``, also where the
    class defaults to its eager loop (:func:`hfax.experts.compile_experts`)."""
    if backend != NAME:
        return
    from hfax import experts, plugins
    from hfax.specs import ATTENTION_INTERFACE

    experts.compile_experts(model, patcher, "grouped_mm")

    spec = plugins.families().get(family)
    if spec is not None and ATTENTION_INTERFACE in spec.features:
        from hfax.backends.jax import attention

        attention.switch(model, patcher)


@hookimpl
def hfax_plan_layout(model: Any, plan: Any, mesh: Any, backend: str) -> Any:
    """What ``hfax_shard_weights`` will put on each device, from shapes alone, and the devices' memory."""
    if backend != NAME:
        return None
    from hfax.backends.jax.layout import plan_layout

    return plan_layout(model, plan, mesh)


@hookimpl
def hfax_shard_weights(model: Any, plan: Any, mesh: Any, backend: str) -> dict[str, Any] | None:
    """Copy every parameter and buffer to JAX arrays placed by ``plan`` over ``mesh``, and point the module at them.

    The module's own tensors are replaced by torchax views of the placed arrays, one by one, so host memory
    holds no second copy and eager debugging calls still work. Tied weights stay one array.
    """
    if backend != NAME:
        return None
    from hfax.backends.jax.weights import move_weights

    return move_weights(model, plan, mesh)


@hookimpl
def hfax_load_weights(model: Any, checkpoint: Any, plan: Any, mesh: Any, backend: str) -> Any:
    """Read each weight from the safetensors checkpoint into the pieces this process's devices hold.

    Host memory holds the placed arrays and the pieces read ahead of them (``weights.READ_AHEAD_BYTES``);
    on several hosts each reads only the byte ranges of its own shards. Tied weights stay one array.
    """
    if backend != NAME:
        return None
    from hfax.backends.jax.weights import load_weights

    return load_weights(model, checkpoint, plan, mesh)


@hookimpl
def hfax_compile_step(
    fn: Callable[..., Any],
    backend: str,
    name: str,
    static_argnames: tuple[str, ...],
    donate_argnames: tuple[str, ...],
) -> Callable[..., Any] | None:
    if backend != NAME:
        return None
    import jax

    return jax.jit(fn, static_argnames=static_argnames, donate_argnames=donate_argnames)


@hookimpl
def hfax_register_commands(cli: Any) -> None:
    """``hfax finetune`` (:mod:`hfax.backends.jax.commands`)."""
    from hfax.backends.jax import commands

    commands.register(cli)
