"""The hooks through which backends and model families plug into hfax.

A plugin is a module (or object) with functions named like the specs below, decorated with
``hfax.hookimpl``, advertised in the ``hfax`` entry-point group of its distribution::

    [project.entry-points.hfax]
    myfamily = "hfax_myfamily.plugin"

Hook arguments are passed by name; an implementation may accept any subset of them, as in pluggy.
The order in which ``hfax.AutoModelForTPU.from_pretrained`` calls them is the order below; the last two
are asked later: ``hfax_generation_traits`` by ``generate``, ``hfax_register_commands`` by the ``hfax``
command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from hfax.checkpoints import Checkpoint
    from hfax.generation.traits import GenerationTraits
    from hfax.patching import Patcher
    from hfax.specs import BackendSpec, Claim, FamilySpec, Layout, ShardingPlan

hookspec = pluggy.HookspecMarker("hfax")


@hookspec
def hfax_backends() -> list[BackendSpec]:
    """Name the backends this plugin provides.

    The backend registry: ``backend="jax"`` in the user API is looked up among the answers. A
    :class:`~hfax.specs.BackendSpec` only names the backend and how to load it, so listing plugins
    never imports torch or jax.

    Example::

        @hfax.hookimpl
        def hfax_backends():
            return [hfax.BackendSpec("jax", "hfax.backends.jax.backend:JaxBackend")]
    """


@hookspec
def hfax_families() -> list[FamilySpec]:
    """Name the model families this plugin provides, with the transformers versions it was tested on.

    Used by ``hfax plugins`` and to warn when a family's patches meet an untested transformers version.

    Example::

        @hfax.hookimpl
        def hfax_families():
            return [hfax.FamilySpec("llama", model_types=("llama", "mistral"), transformers=">=5.23,<5.26")]
    """


@hookspec
def hfax_detect_model(config: Any) -> Claim | str | None:
    """Claim a model, given its ``transformers.PretrainedConfig``.

    Return the family name (or a :class:`~hfax.specs.Claim` with a priority) when this plugin's family
    handles the model, else ``None``. Every plugin is asked; core picks the claim with the highest priority
    and rejects a tie between different families with an error naming both plugins. A config nobody
    claims runs on the ``"generic"`` family: the unmodified transformers code.

    Example::

        @hfax.hookimpl
        def hfax_detect_model(config):
            return "llama" if config.model_type in ("llama", "mistral") else None
    """


@hookspec(firstresult=True)
def hfax_sharding_plan(model: Any, config: Any, family: str) -> ShardingPlan | None:
    """Say how a model's parameters are laid out over the mesh axes ``data``, ``fsdp`` and ``model``.

    The first non-``None`` answer wins. hfax-core answers last with a plan derived from
    ``config.base_model_tp_plan`` (transformers' own colwise / rowwise plan), split between attention
    heads; a family overrides it by answering first. ``from_pretrained`` asks before loading, so ``model``
    may be built on torch's ``meta`` device: read names and shapes, not values.

    Example::

        @hfax.hookimpl
        def hfax_sharding_plan(model, config, family):
            if family == "llama":
                return hfax.ShardingPlan.from_tp_styles({"layers.*.mlp.up_proj": "colwise"}, prefix="model.")
    """


@hookspec(firstresult=True)
def hfax_plan_layout(model: Any, plan: ShardingPlan, mesh: Any, backend: str) -> Layout | None:
    """Say what every device will hold once ``model``'s weights are placed by ``plan`` over ``mesh``.

    ``from_pretrained`` asks before loading any weight, with ``model`` built on torch's ``meta`` device
    (names, shapes and dtypes, no data), and calls :meth:`~hfax.specs.Layout.check` on the answer, so a
    model too large for its devices fails in seconds, not after the download; ``hfax plan`` prints it.
    ``mesh`` is what ``from_pretrained`` got (``None`` for one device) or, to plan for devices that are not
    attached, a mapping of axis sizes such as ``{"model": 8}``. Implemented by the backend named
    ``backend``; without an answer nothing is checked.

    Example::

        @hfax.hookimpl
        def hfax_plan_layout(model, plan, mesh, backend):
            if backend == "mine" and mesh is None:
                tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
                return hfax.Layout(mesh=(), placements=tuple(
                    hfax.Placement(name, tuple(t.shape), str(t.dtype), (None,) * t.ndim, t.nbytes, t.nbytes)
                    for name, t in tensors.items()
                ))
    """


@hookspec
def hfax_patch_model(model: Any, family: str, backend: str, patcher: Patcher) -> None:
    """Patch a loaded PyTorch model for a backend, on the instance only.

    Every plugin is called (families first check ``family``, backends check ``backend``). All changes go
    through ``patcher`` so they are recorded, idempotent and undone by ``hfax.unpatch(model)``; never
    patch ``transformers`` module globals.

    Example::

        @hfax.hookimpl
        def hfax_patch_model(model, family, backend, patcher):
            if family == "llama" and backend == "jax":
                patcher.setattr(model.config, "_attn_implementation", "hfax_jax")
    """


@hookspec(firstresult=True)
def hfax_shard_weights(model: Any, plan: ShardingPlan, mesh: Any, backend: str) -> Any:
    """Move a model's weights onto the backend's devices, placed by ``plan`` over ``mesh``.

    Implemented by the backend named ``backend``; returns the backend's parameter pytree (for JAX, a
    dict of ``jax.Array`` keyed by ``state_dict`` names). ``mesh`` is ``None`` for a single device.

    Example::

        @hfax.hookimpl
        def hfax_shard_weights(model, plan, mesh, backend):
            if backend == "jax":
                return {name: place(tensor, plan.spec_for(name, tensor.ndim), mesh) for name, tensor in ...}
    """


@hookspec(firstresult=True)
def hfax_load_weights(
    model: Any, checkpoint: Checkpoint, plan: ShardingPlan, mesh: Any, backend: str
) -> Any:
    """Read a model's weights from its safetensors checkpoint straight onto the backend's devices.

    ``from_pretrained`` asks this instead of ``hfax_shard_weights`` when the checkpoint needs none of
    transformers' conversions (see ``hfax.checkpoints``): ``model`` is patched, its weights are on torch's
    ``meta`` device and its non-persistent buffers are real host tensors. ``checkpoint.sources[name]`` says
    which file and key hold weight ``name`` (every name of a tied weight points at the same one). Returns
    what ``hfax_shard_weights`` returns, with the module pointed at the placed arrays; ``None`` (or no
    implementation) makes ``from_pretrained`` load through transformers and ``hfax_shard_weights``.

    Example::

        @hfax.hookimpl
        def hfax_load_weights(model, checkpoint, plan, mesh, backend):
            if backend == "mine":
                return {name: read_onto_device(source.file, source.key)
                        for name, source in checkpoint.sources.items()}
    """


@hookspec(firstresult=True)
def hfax_compile_step(
    fn: Callable[..., Any],
    backend: str,
    name: str,
    static_argnames: tuple[str, ...],
    donate_argnames: tuple[str, ...],
) -> Callable[..., Any] | None:
    """Turn a pure step function (``prefill``, ``decode``, ``forward``) into a compiled program.

    Implemented by the backend named ``backend`` (JAX: ``jax.jit``). A plugin answering first can wrap
    compilation, e.g. to add profiling or a compiler option. ``name`` labels the program in logs.

    Example::

        @hfax.hookimpl
        def hfax_compile_step(fn, backend, name, static_argnames, donate_argnames):
            if backend == "jax":
                return jax.jit(fn, static_argnames=static_argnames, donate_argnames=donate_argnames)
    """


@hookspec
def hfax_generation_traits(model: Any, config: Any) -> GenerationTraits | None:
    """Tell ``generate`` what only the family knows about ``model`` (a transformers model, ``config`` its
    config): a :class:`~hfax.generation.traits.GenerationTraits`, or ``None`` for nothing special.

    Every plugin is asked, at every ``generate`` call (and by ``hfax serve`` before it builds its engine),
    so answer from the model and its config alone, cheaply, and only for the models the family claims.
    Core merges the answers (reasons joined, options united; two plugins giving one model different
    appended tokens or decoder prompts are an error) and acts on them: a refusal is raised before anything
    compiles, a reason against a static cache makes the model decode without one, a decoder prompt builder
    replaces the decoder start token. An implementation that raises or returns another type fails the
    call: generation never runs on a guess.

    Example::

        @hfax.hookimpl
        def hfax_generation_traits(model, config):
            from hfax.generation.traits import GenerationTraits

            if config.model_type == "mymodel":
                return GenerationTraits(no_static_cache="its layers keep their state in module attributes")
    """


@hookspec
def hfax_register_commands(cli: Any) -> None:
    """Add commands to the ``hfax`` command line (``hfax serve`` comes from hfax-serve this way).

    ``cli`` is a ``typer.Typer`` to declare commands on with ``@cli.command(...)``; hfax asks each plugin
    every time it builds the command line (``hfax --help`` lists the commands, ``hfax NAME`` runs one). A
    name that hfax-core or another plugin already gives is refused with the plugin's name. Keep the module
    that implements this hook light: import torch, jax or a server inside the command, not at the top.
    :mod:`hfax.cli` gives commands the pieces the built-in ones use: :class:`~hfax.cli.UserError` and
    :func:`~hfax.cli.user_errors` (one-line errors, exit code 2), the shared options (``ModelOption``,
    ``BackendOption``, ...), :func:`~hfax.cli.check_options` and :func:`~hfax.cli.load_model`.

    Example::

        @hfax.hookimpl
        def hfax_register_commands(cli):
            @cli.command("hello", help="Say hello.")
            def hello(name: str = "world"):
                print(f"hello {name}")
    """


#: Marks a plugin's implementation of one of the hooks above.
hookimpl = pluggy.HookimplMarker("hfax")
