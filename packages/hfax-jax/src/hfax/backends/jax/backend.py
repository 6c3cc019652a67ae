"""The JAX backend object core loads by name (``backend="jax"``)."""

from __future__ import annotations

from typing import Any

import jax

from hfax import Backend
from hfax.backends.jax import monitor, pytrees
from hfax.backends.jax.mesh import adopt, make_mesh, replicate_position_tables
from hfax.backends.jax.model import JaxModel


class JaxBackend(Backend):
    """Builds :class:`JaxModel` objects, makes and adopts JAX meshes and serves; the per-step work goes
    through the hooks in ``plugin.py``."""

    name = "jax"

    def __init__(self) -> None:
        monitor.install()
        pytrees.register_loaded()

    def adopt_mesh(self, mesh: Any, axis_names: Any = None) -> Any:
        """A user's ``jax.sharding.Mesh`` as hfax uses it; see :func:`hfax.backends.jax.mesh.adopt`."""
        return mesh if mesh is None else adopt(mesh, axis_names)

    def make_mesh(self, **axis_sizes: int) -> Any:
        """``hfax.make_mesh``: see :func:`hfax.backends.jax.mesh.make_mesh`."""
        return make_mesh(**axis_sizes)

    def devices(self) -> list[str]:
        return [f"{device.platform}:{device.id}" for device in jax.devices()]

    def build(
        self, model: Any, *, params: dict[str, jax.Array], family: str, plan: Any, mesh: Any
    ) -> JaxModel:
        from hfax.plugins import get_plugin_manager

        hook = get_plugin_manager().hook

        def compile_step(fn: Any, **options: Any) -> Any:
            return hook.hfax_compile_step(fn=fn, backend=self.name, **options)

        if mesh is not None:
            replicate_position_tables(model, mesh)
        return JaxModel(
            model, params, family=family, plan=plan, mesh=mesh, compile_step=compile_step
        )

    def serves(self) -> bool:
        return True

    def serving_engine(
        self,
        model: Any,
        *,
        slots: int,
        length: int,
        chunk: int,
        prefixes: int = 0,
        piece: int = 0,
        lookup: int = 0,
    ) -> Any:
        """The continuous-batching engine ``hfax serve`` drives (:mod:`hfax.backends.jax.slots`)."""
        from hfax.backends.jax.slots import SlotEngine

        model.check_can_generate()
        return SlotEngine(
            model, slots, length, chunk, prefixes=prefixes, piece=piece, lookup=lookup
        )
