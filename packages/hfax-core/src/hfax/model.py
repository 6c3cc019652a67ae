"""What the model every backend builds holds, and how it names positional arguments and caches programs."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, Callable

from hfax.tensors import tensor_slots


@functools.cache
def named_after(backend: type, transformers_class: type) -> type:
    """A subclass of ``backend`` (``JaxModel``, ...) that adds nothing but the name of the transformers
    class its model runs (``LlamaForCausalLM``). transformers' pipelines check a model's class name
    against the architectures of their task (``Pipeline.check_model_type``) and log an error for any
    other name; isinstance checks against the backend's class still hold."""
    if backend.__name__ == transformers_class.__name__:  # already named
        return backend
    name = transformers_class.__name__
    namespace = {"__module__": backend.__module__, "__qualname__": name, "backend_class": backend}
    return type(name, (backend,), namespace)


class BackendModel:
    """The common part of a backend's model (``JaxModel``, ``TorchXlaModel``).

    Holds the patched transformers ``module`` (its ``config`` and ``generation_config`` too), the weights as
    the backend placed them (``params``, by ``state_dict`` name), the ``family``, sharding ``plan`` and
    ``mesh`` it was built with, and ``last_generate_stats`` (:class:`hfax.generation.driver.GenerateStats`).
    ``compile_step(fn, name=..., static_argnames=..., donate_argnames=...)`` reaches the ``hfax_compile_step``
    hook; :meth:`compiled` keeps one program per name.

    Where transformers' pipelines and user code look, it behaves like a transformers model: ``config``,
    ``generation_config``, ``name_or_path``, ``device``, ``dtype``, ``can_generate()``, ``eval()``,
    ``to(...)`` and ``save_pretrained(directory)``. Its class is named after the transformers class it runs
    (:func:`named_after`): transformers' pipelines accept a model by its class name.

    ``pad_forward`` (True unless set False): on both backends a language model's ``model(input_ids=...)``
    runs padded into a bucket shape and its logits are cut back (:mod:`hfax.forward_buckets`), so calls of
    many lengths share a few compiled programs; False runs every call at its own shape.
    """

    pad_forward: bool = True

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
        self.__class__ = named_after(type(self), type(module))
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
        backend = getattr(type(self), "backend_class", type(self))  # JaxModel, TorchXlaModel
        return f"{backend.__name__}({type(self.module).__name__}, family={self.family!r}, parameters={self.num_parameters():,})"

    def num_parameters(self) -> int:
        """How many weights the model has (tied ones once)."""
        raise NotImplementedError

    def host_params(self) -> dict[str, Any]:
        """``params`` gathered back to the host as CPU torch tensors (split weights whole again)."""
        raise NotImplementedError

    def can_generate(self) -> bool:
        """Whether the model has a head ``generate`` can decode with (transformers' answer)."""
        return bool(self.module.can_generate())

    def check_can_generate(self) -> None:
        """Refuse ``generate`` on a model without a language-model head, naming the class that has one."""
        if not self.can_generate():
            raise TypeError(
                f"{type(self.module).__name__} has no language-model head, so it cannot generate; load the "
                "checkpoint with hfax.AutoModelForCausalLM (or AutoModelForSeq2SeqLM) to generate text"
            )

    def forward(self, *args: Any, **inputs: Any) -> Any:
        """The compiled forward, as ``model(...)`` runs it (transformers' pipelines call ``forward``)."""
        return self(*args, **inputs)

    @property
    def name_or_path(self) -> str:
        """Where the model was loaded from, as transformers' model says it (tools such as
        lm-evaluation-harness name a model by it)."""
        return self.module.name_or_path

    @property
    def input_modalities(self) -> Any:
        return self.module.input_modalities

    @property
    def output_modalities(self) -> Any:
        return self.module.output_modalities

    def eval(self) -> BackendModel:
        """A no-op returning the model, as in PyTorch: hfax models always run in inference mode."""
        return self

    def to(self, *args: Any, **kwargs: Any) -> BackendModel:
        """The model itself when asked for the device or dtype it already has (``model.device``,
        ``model.dtype``), as pipelines ask; anything else is refused: hfax places weights when it loads them."""
        wanted = [*args, *kwargs.values()]
        have = {str(self.device), str(self.dtype).removeprefix("torch.")}
        if all(str(value).removeprefix("torch.") in have for value in wanted):
            return self
        raise ValueError(
            f"{type(self).__name__}.to{tuple(wanted)}: hfax places and casts weights when it loads them; "
            "load again with from_pretrained(..., dtype=..., mesh=...) (the model reports device "
            f"{self.device} and dtype {self.dtype})"
        )

    def save_pretrained(self, directory: str | Path, **kwargs: Any) -> None:
        """Write a standard transformers checkpoint of the weights the devices hold (gathered from every
        shard) to ``directory``; ``transformers.AutoModel*.from_pretrained(directory)`` loads it back.
        ``kwargs`` go to transformers' ``save_pretrained`` (``safe_serialization``, ``max_shard_size``, ...).
        """
        import torch

        host = self.host_params()
        # Every slot's name -> the name params keeps its tensor under (a tied weight's first slot).
        first: dict[int, str] = {}
        key_of = {
            full_name: first.setdefault(id(tensor), full_name)
            for full_name, _, _, tensor in tensor_slots(self.module)
        }
        build = getattr(type(self.module), "_from_config", None) or type(self.module).from_config
        with torch.device("meta"):
            clone = build(self.config)
        placed: dict[str, Any] = {}
        for full_name, registry, name, tensor in tensor_slots(clone):
            key = key_of[full_name]
            if key not in placed:
                value = host[key]
                placed[key] = (
                    torch.nn.Parameter(value, requires_grad=False)
                    if isinstance(tensor, torch.nn.Parameter)
                    else value
                )
            registry[name] = placed[key]
        if self.generation_config is not None:
            clone.generation_config = self.generation_config
        clone.save_pretrained(directory, **kwargs)

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
