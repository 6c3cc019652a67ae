"""The PyTorch/XLA backend object core loads by name (``backend="torch_xla"``)."""

from __future__ import annotations

from typing import Any

import torch

from hfax import Backend
from hfax.backends.torchxla import runtime
from hfax.backends.torchxla.model import TorchXlaModel

#: How many times dynamo may trace the step functions (it would stop at 8 per function).
DYNAMO_TRACE_LIMIT = 4096


class TorchXlaBackend(Backend):
    """Builds :class:`TorchXlaModel` objects; the per-step work goes through the hooks in ``plugin.py``.
    It takes meshes as axis sizes and has no continuous-batching engine: :class:`hfax.Backend`'s defaults.

    Nothing here touches the XLA runtime: the first model's ``hfax_shard_weights`` starts it, in SPMD mode
    when it has a mesh (a choice PyTorch/XLA takes only before the first computation).
    """

    name = "torch_xla"

    def __init__(self) -> None:
        # dynamo traces a step again for every bucket and every model (it guards on the module object; a
        # retrace of the same graph finds its XLA program by hash, so costs no compilation). Its limits, 8 per
        # function and 256 in all, would end in an error (fullgraph): the compile budget bounds the programs.
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, DYNAMO_TRACE_LIMIT)
        config.accumulated_recompile_limit = max(
            config.accumulated_recompile_limit, DYNAMO_TRACE_LIMIT
        )

    def devices(self) -> list[str]:
        return runtime.devices()

    def build(
        self, model: Any, *, params: dict[str, torch.Tensor], family: str, plan: Any, mesh: Any
    ) -> TorchXlaModel:
        from hfax.plugins import get_plugin_manager

        hook = get_plugin_manager().hook

        def compile_step(fn: Any, **options: Any) -> Any:
            return hook.hfax_compile_step(fn=fn, backend=self.name, **options)

        return TorchXlaModel(
            model, params, family=family, plan=plan, mesh=mesh, compile_step=compile_step
        )
