"""What the model every backend builds holds, and how it names positional arguments and caches programs."""

from __future__ import annotations

import inspect
from typing import Any, Callable


class BackendModel:
    """The common part of a backend's model (``JaxModel``, ``TorchXlaModel``).

    Holds the patched transformers ``module`` (its ``config`` and ``generation_config`` too), the weights as
    the backend placed them (``params``, by ``state_dict`` name), the ``family``, sharding ``plan`` and
    ``mesh`` it was built with, and ``last_generate_stats`` (:class:`hfax.generation.driver.GenerateStats`).
    ``compile_step(fn, name=..., static_argnames=..., donate_argnames=...)`` reaches the ``hfax_compile_step``
    hook; :meth:`compiled` keeps one program per name.
    """

    def __init__(
        self,
        module: Any,
        params: dict[str, Any],
        *,
        family: str,
        plan: Any,
        mesh: Any,
        compile_step: Callable[..., Callable[..., Any]],
    ) -> None:
        self.module = module
        self.config = module.config
        self.generation_config = getattr(module, "generation_config", None)
        self.params = params
        self.family = family
        self.plan = plan
        self.mesh = mesh
        self._compile_step = compile_step
        self._programs: dict[str, Callable[..., Any]] = {}
        self._signature = inspect.signature(module.forward).parameters
        self.last_generate_stats: Any = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.module).__name__}, family={self.family!r}, parameters={self.num_parameters():,})"

    def num_parameters(self) -> int:
        """How many weights the model has (tied ones once)."""
        raise NotImplementedError

    def compiled(self, name: str, make: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
        """The program called ``name``, made by ``make()`` on first use (through the compile-step hook)."""
        if name not in self._programs:
            self._programs[name] = make()
        return self._programs[name]

    def named_inputs(self, args: tuple[Any, ...], inputs: dict[str, Any]) -> dict[str, Any]:
        """``forward``'s positional ``args`` by their parameter names, merged into ``inputs``; ``use_cache`` is
        False unless asked for (a forward call has no cache to fill; generate brings its own)."""
        if args:
            names = [name for name in self._signature if name != "self"]
            inputs = {**inputs, **dict(zip(names, args))}
        if "use_cache" in self._signature and "use_cache" not in inputs:
            inputs = {**inputs, "use_cache": False}
        return inputs
