"""The user API: ``AutoModelForTPU`` and its task mirrors, following one call through the hooks."""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from typing import Any, Mapping

import transformers
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from hfax import checkpoints, plugins
from hfax.patching import Patcher
from hfax.specs import STREAMED_LOADING, Backend

logger = logging.getLogger("hfax")


def install_command(extra: str) -> str:
    """The command that installs hfax with ``extra`` (``jax``, ``torchxla``, ``demo``): hfax's distributions
    are not on PyPI, so pip reads them from a clone (each ``requirements/*.txt`` names the local folders)."""
    return f"in the root of a clone of hfax, pip install -r requirements/{extra}.txt"


#: Backends hfax knows how to install, with the command that does it.
KNOWN_BACKENDS = {"jax": install_command("jax"), "torch_xla": install_command("torchxla")}


class BackendNotInstalledError(ImportError):
    """A known backend was asked for, but its distribution is not installed."""


class UntestedVersionWarning(UserWarning):
    """A family's patches meet a transformers version outside the range they were tested on."""


def get_backend(name: str) -> Backend:
    """Load the backend called ``name``, or explain how to get it."""
    installed = plugins.backends()
    if name in installed:
        return installed[name].load()
    have = ", ".join(sorted(installed)) or "none"
    if name in KNOWN_BACKENDS:
        raise BackendNotInstalledError(
            f"backend {name!r} is not installed (installed backends: {have}). To install it: {KNOWN_BACKENDS[name]}"
        )
    raise ValueError(
        f"unknown backend {name!r}; installed backends: {have}; hfax also offers: {', '.join(KNOWN_BACKENDS)}"
    )


#: ``(family, transformers version)`` pairs already warned about: each warns once per process.
_WARNED: set[tuple[str, str]] = set()


def check_family_version(family: str) -> None:
    """Warn once (strict mode: raise) when transformers is outside the range ``family``'s patches were
    tested on (the generic family's: hfax-core's own, ``hfax._builtin.TESTED_TRANSFORMERS``)."""
    spec = plugins.families().get(family)
    if spec is None or not spec.transformers:
        return
    try:
        tested = SpecifierSet(spec.transformers)
    except InvalidSpecifier as error:
        raise ValueError(
            f"family {family!r} declares an invalid transformers range {spec.transformers!r}"
        ) from error
    # The module as sys.modules has it now: importing some transformers.models.* modules replaces the
    # `transformers` entry with a new module object, so the one bound when this module loaded may be stale.
    version = sys.modules["transformers"].__version__
    if version in tested or (not plugins.strict() and (family, version) in _WARNED):
        return
    message = (
        f"hfax family {family!r} was tested with transformers{spec.transformers}, but transformers "
        f"{version} is installed; its patches may not fit. Install a tested version, or set "
        "HFAX_BLOCK_PLUGINS to run the generic path."
    )
    if plugins.strict():
        raise RuntimeError(message)
    _WARNED.add((family, version))
    warnings.warn(message, UntestedVersionWarning, stacklevel=3)


def _resolve_model_class(config: Any, auto_class: str | None) -> Any:
    if auto_class is not None:
        return getattr(transformers, auto_class)
    for architecture in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, architecture, None)
        if cls is None:
            continue
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            raise ValueError(
                f"config.architectures names {architecture!r}, which is not a transformers model "
                "class; fix the checkpoint's config.json, or load it with a task class such as "
                "hfax.AutoModelForCausalLM"
            )
        return cls
    auto_map = getattr(config, "auto_map", None) or {}
    for name in ("AutoModelForCausalLM", "AutoModel"):
        if name in auto_map:  # the checkpoint's own code: built when trust_remote_code=True
            return getattr(transformers, name)
    from transformers.models.auto import modeling_auto

    if config.model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModel


class AutoModelForTPU:
    """Load a transformers model and run it on an XLA backend.

    ``from_pretrained`` builds the class named in ``config.architectures``; the task mirrors
    (``hfax.AutoModelForCausalLM``, ...) build their task's class, like transformers' auto classes.
    """

    _auto_class: str | None = None

    def __init__(self) -> None:
        raise TypeError(f"use {type(self).__name__}.from_pretrained(...) or .from_model(...)")

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | None = None,
        *,
        backend: str = "jax",
        mesh: Any = None,
        axis_names: Mapping[str, str] | None = None,
        **hf_kwargs: Any,
    ) -> Any:
        """Load ``name_or_path`` (a Hub id or local dir; ``None`` = hfax's default model) on ``backend``.

        ``hf_kwargs`` go to transformers' ``from_pretrained`` (``dtype``, ``gguf_file``, ``revision``,
        ``attn_implementation``, ...). ``mesh`` places weights over devices (``hfax.make_mesh``, or a mesh
        of your own whose axes are ``data``, ``fsdp``, ``model``, or are mapped to them by ``axis_names``,
        e.g. ``{"model": "tp", "data": "dp"}``). Before any weight is read, the bytes each device will hold
        are logged (logger ``hfax``) and checked against the device's memory: a model that cannot fit raises
        :class:`~hfax.specs.DeviceMemoryError`.
        A safetensors checkpoint is read straight into the devices' arrays (``hfax_load_weights``); GGUF,
        ``.bin`` and checkpoints that need transformers' conversions load through transformers first
        (docs/SHARDING.md, "Host memory while loading").
        """
        engine = get_backend(backend)  # fail on a missing backend before loading gigabytes
        mesh = engine.adopt_mesh(mesh, axis_names)
        name_or_path, model_class, family, model = cls._resolve(name_or_path, hf_kwargs)
        plan = _plan(model, backend, family, mesh)
        streamed = _stream(name_or_path, model, engine, backend, family, mesh, plan, hf_kwargs)
        if streamed is not None:
            return streamed
        model = model_class.from_pretrained(name_or_path, **hf_kwargs)
        return _finish(model, engine, backend, family, mesh, plan)

    @classmethod
    def plan(
        cls,
        name_or_path: str | None = None,
        *,
        backend: str = "jax",
        mesh: Any = None,
        **hf_kwargs: Any,
    ) -> Any:
        """What ``from_pretrained`` would put on every device, without reading a weight.

        Returns an :class:`~hfax.specs.Layout`: ``print`` it for the table (tensor, shape, dtype, spec,
        bytes per device). ``mesh`` may be a mapping of axis sizes (``{"model": 8}``) to plan for devices
        that are not attached.
        """
        get_backend(backend)
        _, _, family, model = cls._resolve(name_or_path, hf_kwargs)
        hook = plugins.get_plugin_manager().hook
        plan = hook.hfax_sharding_plan(model=model, config=model.config, family=family)
        layout = hook.hfax_plan_layout(model=model, plan=plan, mesh=mesh, backend=backend)
        if layout is None:
            raise ValueError(
                f"backend {backend!r} does not implement hfax_plan_layout, so it cannot say where weights go"
            )
        return layout

    @classmethod
    def _resolve(
        cls, name_or_path: str | None, hf_kwargs: dict[str, Any]
    ) -> tuple[str, Any, str, Any]:
        """Resolve ``name_or_path`` to its model class and family, and build the model on the meta device."""
        if name_or_path is None:
            from hfax.demo import default_model

            name_or_path = default_model()
        config_kwargs: dict[str, Any] = {
            key: hf_kwargs[key] for key in ("gguf_file", "revision") if key in hf_kwargs
        }
        # Always said, never left to transformers' [y/N] prompt: without the flag no remote code runs.
        trust = bool(hf_kwargs.get("trust_remote_code", False))
        config_kwargs["trust_remote_code"] = trust
        config = transformers.AutoConfig.from_pretrained(name_or_path, **config_kwargs)
        family = plugins.detect_family(config)
        check_family_version(family)
        model_class = _resolve_model_class(config, cls._auto_class)
        return (
            name_or_path,
            model_class,
            family,
            _meta_model(
                model_class,
                config,
                hf_kwargs.get("dtype"),
                trust,
                attn_implementation=hf_kwargs.get("attn_implementation"),
            ),
        )

    @classmethod
    def from_model(
        cls,
        model: Any,
        *,
        backend: str = "jax",
        mesh: Any = None,
        axis_names: Mapping[str, str] | None = None,
    ) -> Any:
        """Run an already-loaded ``torch.nn.Module`` from transformers on ``backend``."""
        engine = get_backend(backend)
        mesh = engine.adopt_mesh(mesh, axis_names)
        family = plugins.detect_family(model.config)
        check_family_version(family)
        return _finish(model, engine, backend, family, mesh)


def _meta_model(
    model_class: Any,
    config: Any,
    dtype: Any = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> Any:
    """``model_class`` built from ``config`` on torch's ``meta`` device: names, shapes and dtypes, no memory.

    ``dtype`` and ``attn_implementation`` are ``from_pretrained``'s (``dtype`` ``None`` or ``"auto"``: the
    checkpoint's, from the config). An auto class builds the checkpoint's own code only with
    ``trust_remote_code``, as its ``from_pretrained`` does.
    """
    import torch

    kwargs: dict[str, Any] = (
        {}
        if dtype in (None, "auto")
        else {"dtype": getattr(torch, dtype) if isinstance(dtype, str) else dtype}
    )
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    build = getattr(model_class, "_from_config", None)
    if build is None:  # an auto class
        build = functools.partial(model_class.from_config, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return build(config, **kwargs)


def _plan(model: Any, backend: str, family: str, mesh: Any) -> Any:
    """The sharding plan for ``model``, after checking that the weights it places fit the devices."""
    hook = plugins.get_plugin_manager().hook
    plan = hook.hfax_sharding_plan(model=model, config=model.config, family=family)
    layout = hook.hfax_plan_layout(model=model, plan=plan, mesh=mesh, backend=backend)
    if layout is not None:
        logger.info("hfax: %s", layout.summary())
        layout.check()
    return plan


def _stream(
    name_or_path: str,
    model: Any,
    engine: Backend,
    backend: str,
    family: str,
    mesh: Any,
    plan: Any,
    hf_kwargs: dict[str, Any],
) -> Any:
    """The model with its weights read from the checkpoint straight onto the devices, or ``None`` where
    transformers must load it (the reason is logged): see ``hfax.checkpoints``.

    Only models of a family that declares :data:`~hfax.specs.STREAMED_LOADING` stream: transformers' own
    loading re-initializes some weights of other models after reading them (a weight computed from others
    at init), and hfax must hold what transformers would (the coverage sweep found it); such a family
    vouches for its models' loading."""
    spec = plugins.families().get(family)
    if spec is None or STREAMED_LOADING not in spec.features:
        logger.info(
            "hfax: weights load through transformers: family %r does not declare streamed loading",
            family,
        )
        return None
    try:
        checkpoint = checkpoints.find_checkpoint(name_or_path, model, hf_kwargs)
        checkpoints.compute_buffers(model)
    except checkpoints.NotStreamable as reason:
        logger.info("hfax: weights load through transformers: %s", reason)
        return None
    checkpoints.finish_model(model, name_or_path, hf_kwargs.get("revision"))
    hook = plugins.get_plugin_manager().hook
    _patch(model, family, backend)
    params = hook.hfax_load_weights(
        model=model, checkpoint=checkpoint, plan=plan, mesh=mesh, backend=backend
    )
    if params is None:
        logger.info(
            "hfax: backend %r does not stream weights; they load through transformers", backend
        )
        return None
    return engine.build(model, params=params, family=family, plan=plan, mesh=mesh)


def _patch(model: Any, family: str, backend: str) -> None:
    model.eval()
    plugins.get_plugin_manager().hook.hfax_patch_model(
        model=model, family=family, backend=backend, patcher=Patcher(model)
    )


def _finish(
    model: Any, engine: Backend, backend: str, family: str, mesh: Any, plan: Any = None
) -> Any:
    hook = plugins.get_plugin_manager().hook
    _patch(model, family, backend)
    if plan is None:  # an already-loaded model: checked now, before its weights move
        plan = _plan(model, backend, family, mesh)
    params = hook.hfax_shard_weights(model=model, plan=plan, mesh=mesh, backend=backend)
    if params is None:
        raise RuntimeError(
            f"no plugin implements hfax_shard_weights for backend {backend!r}; its plugin is broken"
        )
    return engine.build(model, params=params, family=family, plan=plan, mesh=mesh)


class AutoModel(AutoModelForTPU):
    """Mirror of ``transformers.AutoModel`` (base model: hidden states)."""

    _auto_class = "AutoModel"


class AutoModelForCausalLM(AutoModelForTPU):
    """Mirror of ``transformers.AutoModelForCausalLM``."""

    _auto_class = "AutoModelForCausalLM"


class AutoModelForSeq2SeqLM(AutoModelForTPU):
    """Mirror of ``transformers.AutoModelForSeq2SeqLM``."""

    _auto_class = "AutoModelForSeq2SeqLM"


class AutoModelForSequenceClassification(AutoModelForTPU):
    """Mirror of ``transformers.AutoModelForSequenceClassification``."""

    _auto_class = "AutoModelForSequenceClassification"


class AutoModelForMaskedLM(AutoModelForTPU):
    """Mirror of ``transformers.AutoModelForMaskedLM``."""

    _auto_class = "AutoModelForMaskedLM"
