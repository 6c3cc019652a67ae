"""Gated MLPs whose gate and up projections a decode loop multiplies as one matrix.

A gated MLP (``down(act(gate(x)) * up(x))``: Llama's, Mistral's, Qwen's, Gemma's) multiplies its input by
two ``[intermediate, hidden]`` weights. XLA:CPU runs each product of a decode step as its own call, one
after another, and one product over both weights stacked ``[2 * intermediate, hidden]`` reads them faster
than two. On the benchmark Llama (``benchmarks/decode.py``, 63 decode steps profiled with
``jax.profiler``, 2-core EPYC), the weight products of a step took 15.0 / 13.0 ms (float32, batch 1),
11.1 / 9.4 (bfloat16, batch 1), 45.0 / 37.7 (float32, batch 8) and 31.2 / 25.9 (bfloat16, batch 8)
unstacked / stacked; making the stacked copy before the loop cost 0.5 to 1.7 ms per step of those 63.

A family whose parity tests cover it lets its MLPs take a stacked weight with :func:`allow`;
``generation.decode`` stacks the weights once, before its loop, with :func:`stack`, and the MLPs read the
stacked copy inside the loop. Everywhere else (prefill, ``forward``, ``apply``, streaming) they run as
transformers wrote them, on the weights the model holds.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import torch

#: The attribute under which a decode loop hands an allowed MLP its stacked weight (``torch.func.functional_call``
#: sets names a module does not have as plain attributes for the call), and under which it is a parameter name:
#: ``f"{mlp}.{STACKED}"``, rows ``[gate; up]``.
STACKED = "hfax_gate_up"

#: Set on an MLP that :func:`allow` patched.
ALLOWED = "hfax_stacks_gate_up"


def gated(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a gated MLP whose two input projections can be stacked: ``gate_proj`` and
    ``up_proj`` bias-free ``nn.Linear`` of the same shape, beside ``down_proj`` and ``act_fn``."""
    gate, up = getattr(module, "gate_proj", None), getattr(module, "up_proj", None)
    return (
        isinstance(gate, torch.nn.Linear)
        and isinstance(up, torch.nn.Linear)
        and gate.bias is None
        and up.bias is None
        and gate.weight.shape == up.weight.shape
        and isinstance(getattr(module, "down_proj", None), torch.nn.Module)
        and callable(getattr(module, "act_fn", None))
    )


def _forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' gated MLP forward; with a stacked weight, both input projections in one product."""
    stacked = getattr(self, STACKED, None)
    if stacked is None:
        return type(self).forward(self, x)
    gate, up = torch.nn.functional.linear(x, stacked).chunk(2, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


def allow(model: torch.nn.Module, patcher: Any) -> None:
    """Let every gated MLP of ``model`` (see :func:`gated`) take a stacked gate/up weight in a decode loop.

    For families whose MLP forward is exactly ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: a family
    plugin vouches for that with a parity test. Recorded by ``patcher``, undone by ``hfax.unpatch``.
    """
    for module in model.modules():
        if gated(module):
            patcher.bind(module, "forward", _forward)
            patcher.setattr(module, ALLOWED, True)


def stackable(model: torch.nn.Module, params: Mapping[str, Any]) -> tuple[str, ...]:
    """The allowed MLPs (module paths) of ``model`` whose gate and up weights are distinct entries of ``params``."""
    uses: dict[int, int] = {}
    for _, tensor in model.named_parameters(remove_duplicate=False):
        uses[id(tensor)] = uses.get(id(tensor), 0) + 1
    return tuple(
        prefix
        for prefix, module in model.named_modules()
        if getattr(module, ALLOWED, False)
        and gated(module)
        and all(f"{prefix}.{p}.weight" in params and uses[id(getattr(module, p).weight)] == 1 for p in ("gate_proj", "up_proj"))
    )


def stack(params: Mapping[str, jax.Array], mlps: tuple[str, ...]) -> dict[str, jax.Array]:
    """``params`` with each of ``mlps``' gate and up weights replaced by one ``[gate; up]`` weight (a copy)."""
    stacked = dict(params)
    for prefix in mlps:
        gate, up = stacked.pop(f"{prefix}.gate_proj.weight"), stacked.pop(f"{prefix}.up_proj.weight")
        stacked[f"{prefix}.{STACKED}"] = jnp.concatenate([gate, up], axis=0)
    return stacked


def stacked_names(mlps: tuple[str, ...]) -> frozenset[str]:
    """The parameter names :func:`stack` gives the stacked weights of ``mlps``."""
    return frozenset(f"{prefix}.{STACKED}" for prefix in mlps)
