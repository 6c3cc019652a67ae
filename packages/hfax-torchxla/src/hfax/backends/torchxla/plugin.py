"""The PyTorch/XLA backend's hook implementations (entry point ``torch_xla`` in group ``hfax``).

Importing this module imports neither torch nor torch_xla: ``hfax plugins`` stays cheap.
"""

from __future__ import annotations

from typing import Any, Callable

from hfax import BackendSpec, hookimpl

NAME = "torch_xla"


@hookimpl
def hfax_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            NAME, "hfax.backends.torchxla.backend:TorchXlaBackend", "PyTorch/XLA (TPU, GPU, CPU)"
        )
    ]


@hookimpl
def hfax_patch_model(model: Any, family: str, backend: str, patcher: Any) -> None:
    """Every plain ``nn.Linear`` multiplies by an ``[in, out]`` copy of its weight while ``generate`` holds
    one (see :mod:`hfax.backends.torchxla.linear`); transformers' expert layers run every expert on every
    token instead of its grouped path, whose token counts torch_xla cannot compute (:mod:`hfax.experts`).
    What one architecture needs on torch_xla is its family plugin's (``BACKENDS`` of a long-tail family)."""
    if backend != NAME:
        return
    from hfax import experts
    from hfax.backends.torchxla import linear

    linear.patch(model, patcher)
    experts.compile_experts(model, patcher, experts.NAME)


@hookimpl
def hfax_plan_layout(model: Any, plan: Any, mesh: Any, backend: str) -> Any:
    """What ``hfax_shard_weights`` will put on each device, from shapes alone."""
    if backend != NAME:
        return None
    from hfax.backends.torchxla.sharding import plan_layout

    return plan_layout(model, plan, mesh)


@hookimpl
def hfax_shard_weights(model: Any, plan: Any, mesh: Any, backend: str) -> dict[str, Any] | None:
    """Move the module to the XLA device (tied weights stay one tensor) and, on a mesh, mark each weight's
    sharding from ``plan``; returns the distinct tensors by ``state_dict`` name."""
    if backend != NAME:
        return None
    from hfax.backends.torchxla.sharding import move_weights

    return move_weights(model, plan, mesh)


@hookimpl
def hfax_load_weights(model: Any, checkpoint: Any, plan: Any, mesh: Any, backend: str) -> Any:
    """Read each weight from the safetensors checkpoint onto the XLA device, one at a time (tied weights
    once), instead of transformers building the whole model on the host first."""
    if backend != NAME:
        return None
    from hfax.backends.torchxla.sharding import load_weights

    return load_weights(model, checkpoint, plan, mesh)


@hookimpl
def hfax_compile_step(
    fn: Callable[..., Any],
    backend: str,
    name: str,
    static_argnames: tuple[str, ...],
    donate_argnames: tuple[str, ...],
) -> Callable[..., Any] | None:
    """``torch.compile(fn, backend="openxla")``, each graph first through
    :func:`hfax.backends.torchxla.inplace_views.rewrite`: dynamo traces the step once per shape and Python
    constants (``static_argnames`` need nothing more: dynamo guards on them); later calls run the cached XLA
    program without re-tracing the model in Python. In-place updates of input tensors (the KV cache) stay in
    place. A call that fails leaves the process working
    (:func:`hfax.backends.torchxla.runtime.flushed_on_failure`)."""
    if backend != NAME:
        return None
    import torch

    from hfax.backends.torchxla import inplace_views, runtime

    # The decode step must be one graph; a forward may break where a model does something dynamo cannot
    # trace (the pieces still run on XLA). Each graph's in-place view calls become out-of-place first.
    backend_fn = inplace_views.openxla_backend()
    compiled = torch.compile(fn, backend=backend_fn, fullgraph=name != "forward", dynamic=False)
    return runtime.flushed_on_failure(compiled)
