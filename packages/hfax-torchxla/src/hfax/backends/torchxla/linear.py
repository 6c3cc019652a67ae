"""``nn.Linear`` layers that multiply by an ``[in, out]`` copy of their weight while ``generate`` holds one.

XLA:CPU multiplies a few rows faster by a weight stored ``[in, out]`` than by PyTorch's ``[out, in]``; one
row is as fast or faster ``[out, in]``, so batch 1 keeps it.
A bfloat16 weight is copied as float32: XLA:CPU has no bfloat16 product and would convert every weight on
every step; the copy is that conversion, done once per call, and the tokens are the same (the tests
compare them). The package README has the measurements.

The plugin's patch hook binds :func:`forward` to every ``nn.Linear`` of a model loaded for torch_xla
(through ``hfax.Patcher``, undone by ``hfax.unpatch``); without a copy it is ``nn.Linear``'s forward.
``generate`` makes the copies per call (:func:`copies`) and holds them only while its programs run
(:func:`held`); the modules' own weights are untouched.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

#: The fewest rows, and new tokens, for which a call on CPU multiplies by ``[in, out]`` weights.
#: Rows: one row is as fast or faster ``[out, in]``. Steps: the JAX backend's threshold for its transposed
#: copy (:data:`hfax.backends.jax.decode_layout.TRANSPOSE_FROM_STEPS`), which a copy made once per call
#: must pay back. Tested in packages/hfax-torchxla/tests/test_generate.py.
TRANSPOSE_FROM_ROWS = 2
TRANSPOSE_FROM_STEPS = 64
#: The attribute under which an ``nn.Linear`` holds its ``[in, out]`` copy while a call runs.
IN_OUT = "hfax_weight_in_out"


def forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward``, multiplying by the ``[in, out]`` copy of the weight while a call holds one.

    A float32 copy of a bfloat16 weight multiplies the input widened to float32, and the product is rounded
    back to bfloat16: what XLA:CPU computes for the bfloat16 product itself.
    """
    weight = self.__dict__.get(IN_OUT)
    if weight is None or input.dtype != self.weight.dtype:
        return torch.nn.functional.linear(input, self.weight, self.bias)
    output = torch.matmul(input.to(weight.dtype), weight).to(input.dtype)
    return output if self.bias is None else output + self.bias


def patch(model: torch.nn.Module, patcher: Any) -> None:
    """Bind :func:`forward` to every plain ``nn.Linear`` of ``model`` (subclasses keep their own)."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            patcher.bind(module, "forward", forward)


def wanted(platform: str, mesh: Any, rows: int, capacity: int) -> bool:
    """Whether a call of ``rows`` rows and ``capacity`` new tokens multiplies by ``[in, out]`` copies:
    on one CPU device, for two rows or more and :data:`TRANSPOSE_FROM_STEPS` new tokens or more."""
    return (
        platform == "CPU"
        and mesh is None
        and rows >= TRANSPOSE_FROM_ROWS
        and capacity >= TRANSPOSE_FROM_STEPS
    )


def _in_out_copy(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` stored ``[in, out]``; a bfloat16 weight widened to float32."""
    wide = torch.float32 if weight.dtype == torch.bfloat16 else weight.dtype
    return weight.t().to(wide).contiguous()


def copies(model: torch.nn.Module) -> dict[torch.nn.Linear, torch.Tensor]:
    """An ``[in, out]`` copy of the weight of every patched ``nn.Linear`` of ``model`` (lazy tensors: they
    are computed with the graph that first reads them)."""
    return {
        module: _in_out_copy(module.weight)
        for module in model.modules()
        if type(module) is torch.nn.Linear and getattr(module.forward, "__func__", None) is forward
    }


@contextlib.contextmanager
def held(weights: dict[torch.nn.Linear, torch.Tensor]) -> Iterator[None]:
    """Within: every layer of ``weights`` multiplies by its copy."""
    try:
        for module, copy in weights.items():
            module.__dict__[IN_OUT] = copy
        yield
    finally:
        for module in weights:
            module.__dict__.pop(IN_OUT, None)
