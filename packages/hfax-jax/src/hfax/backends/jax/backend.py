"""The JAX backend object core loads by name (``backend="jax"``)."""

from __future__ import annotations

import os
from typing import Any

import jax

from hfax.backends.jax import monitor, pytrees
from hfax.backends.jax.model import JaxModel


def _enable_compilation_cache() -> None:
    """Keep compiled programs on disk so a second process does not compile again (unless the user chose a dir)."""
    if jax.config.jax_compilation_cache_dir or os.environ.get("HFAX_NO_COMPILATION_CACHE"):
        return
    from hfax.backends.jax.programs import make_private_dir
    from hfax.demo import cache_dir

    try:  # programs in the cache run as the user's code: only the user may write them
        make_private_dir(cache_dir() / "jax")
    except OSError:  # JAX and programs.py each warn that they cannot use it, and run without it
        pass
    jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))
    # CPU programs compile in about a second; cache them all, not only the slow ones.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class JaxBackend:
    """Builds :class:`JaxModel` objects; the per-step work goes through the hooks in ``plugin.py``."""

    name = "jax"

    def __init__(self) -> None:
        _enable_compilation_cache()
        monitor.install()
        pytrees.register_loaded()

    def devices(self) -> list[str]:
        return [f"{device.platform}:{device.id}" for device in jax.devices()]

    def build(
        self, model: Any, *, params: dict[str, jax.Array], family: str, plan: Any, mesh: Any
    ) -> JaxModel:
        from hfax.plugins import get_plugin_manager

        hook = get_plugin_manager().hook

        def compile_step(fn: Any, **options: Any) -> Any:
            return hook.hfax_compile_step(fn=fn, backend=self.name, **options)

        return JaxModel(
            model, params, family=family, plan=plan, mesh=mesh, compile_step=compile_step
        )
