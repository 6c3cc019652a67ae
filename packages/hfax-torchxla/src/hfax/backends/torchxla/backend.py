"""The PyTorch/XLA backend object core loads by name (``backend="torch_xla"``)."""

from __future__ import annotations

from typing import Any

import torch

from hfax.backends.torchxla import generation, runtime
from hfax.backends.torchxla.model import TorchXlaModel


class TorchXlaBackend:
    """Builds :class:`TorchXlaModel` objects; the per-step work goes through the hooks in ``plugin.py``.

    Nothing here touches the XLA runtime: the first model's ``hfax_shard_weights`` starts it, in SPMD mode
    when it has a mesh (a choice PyTorch/XLA takes only before the first computation).
    """

    name = "torch_xla"

    def __init__(self) -> None:
        # dynamo recompiles the decode step once per shape bucket; its default limit (8) would silently fall
        # back to uncompiled lazy tensors. The compile budget, not dynamo, bounds the programs.
        limit = generation.compile_budget()
        if torch._dynamo.config.recompile_limit < limit:
            torch._dynamo.config.recompile_limit = limit

    def devices(self) -> list[str]:
        return runtime.devices()

    def build(self, model: Any, *, params: dict[str, torch.Tensor], family: str, plan: Any, mesh: Any) -> TorchXlaModel:
        from hfax.plugins import get_plugin_manager

        hook = get_plugin_manager().hook

        def compile_step(fn: Any, **options: Any) -> Any:
            return hook.hfax_compile_step(fn=fn, backend=self.name, **options)

        return TorchXlaModel(model, params, family=family, plan=plan, mesh=mesh, compile_step=compile_step)
