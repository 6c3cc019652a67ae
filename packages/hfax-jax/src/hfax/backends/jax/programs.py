"""Traced programs kept on disk, so a new process does not trace the model again.

JAX's persistent compilation cache spares a new process the XLA compile, but to find a program there JAX
needs its HLO, and so a trace of the whole transformers model through torchax: a second or more for a
small model, several for a real one, in every process. hfax also keeps the traced program itself
(``jax.export``: serialized StableHLO, tens of kilobytes, weights not included since they are arguments)
under a key made of everything the trace depends on. A later process with the same key deserializes it
in milliseconds and compiles it, which the persistent cache answers.

Both caches live in JAX's compilation cache folder: the user's (``jax_compilation_cache_dir``) when they
set one, else hfax's (``$HFAX_CACHE/jax``), which :func:`compilation_cache` enables around hfax's own
programs only, through JAX's thread-local settings: loading a model changes no global JAX setting, and the
user's own programs are not cached unless they ask for it.

The key (:func:`model_fingerprint` and :func:`call_key`): the program's name and static settings; the
structure, shapes, dtypes and shardings of its arguments; the model's class, the source file it is defined
in, its full config (attention implementation included) and every hfax patch on it; the versions of jax,
jaxlib, torch, torchax and transformers; the text of hfax's own modules (an edited checkout makes new
keys); the JAX platform and the flags that change tracing. Code changed at runtime without any of these
changing (a monkeypatched transformers function) is not seen: ``HFAX_NO_COMPILATION_CACHE=1`` turns this
cache off with JAX's. A program that cannot be exported (e.g. one with host callbacks) or serialized
runs through ``jax.jit`` as usual.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import types
from pathlib import Path
from typing import Any, Callable

import jax

# JAX's config options as thread-local context managers (jax.config.update only sets them globally).
from jax._src import config as jax_config

log = logging.getLogger("hfax")

#: Bumped when what is stored changes meaning.
FORMAT = 1
_VERSIONED = ("jax", "jaxlib", "torch", "torchax", "transformers")
_FLAGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_dynamic_shapes")


@functools.cache
def _hfax_compilation_dir() -> str:
    from hfax.demo import cache_dir as hfax_cache_dir

    path = str(hfax_cache_dir() / "jax")
    log.info(
        "hfax: JAX's persistent compilation cache for hfax's programs is %s (set jax_compilation_cache_dir "
        "to use your own; HFAX_NO_COMPILATION_CACHE=1 turns it off)",
        path,
    )
    return path


def compilation_cache() -> contextlib.AbstractContextManager:
    """Around a compile of hfax's: JAX's persistent cache in hfax's folder, every program cached (CPU ones
    compile in about a second, under JAX's 1 s threshold), unless the user configured a cache or turned it
    off. Thread-local, so the user's settings and programs are untouched."""
    if os.environ.get("HFAX_NO_COMPILATION_CACHE") or jax.config.jax_compilation_cache_dir:
        return contextlib.nullcontext()
    scope = contextlib.ExitStack()
    scope.enter_context(jax_config.compilation_cache_dir(_hfax_compilation_dir()))
    scope.enter_context(jax_config.persistent_cache_min_compile_time_secs(0))
    return scope


def cache_dir() -> Path | None:
    """Where traced programs live (beside JAX's compiled ones), or ``None`` when caching is off."""
    if os.environ.get("HFAX_NO_COMPILATION_CACHE"):
        return None
    compiled = jax.config.jax_compilation_cache_dir
    return Path(compiled) / "hfax-programs" if compiled else None


@functools.cache
def _source_digest() -> str:
    """A digest of hfax's own Python modules, every installed hfax distribution's: edits make new keys."""
    import hfax

    digest = hashlib.sha256()
    for root in sorted({str(Path(p).resolve()) for p in hfax.__path__}):
        for path in sorted(Path(root).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _describe(value: Any) -> str:
    """A patch's value, by what it is rather than where it lives in memory."""
    if isinstance(value, types.MethodType):
        value = value.__func__
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    return (
        repr(value)
        if isinstance(value, (str, int, float, bool, type(None), tuple))
        else type(value).__qualname__
    )


def model_fingerprint(module: Any, family: str) -> str:
    """Everything about ``module`` and this installation that a trace of it depends on, as one digest."""
    from hfax.patching import Patcher

    cls = type(module)
    try:
        source = Path(inspect.getfile(cls)).read_bytes()
    except (OSError, TypeError):
        source = b""
    config = module.config
    parts = [
        f"format {FORMAT}",
        f"{cls.__module__}.{cls.__qualname__}",
        hashlib.sha256(source).hexdigest(),
        config.to_json_string(use_diff=False),
        repr(getattr(config, "_attn_implementation", None)),
        family,
        repr(
            [
                (type(target).__qualname__, name, _describe(getattr(target, name, None)))
                for target, name in Patcher(module).patched
            ]
        ),
        repr([(name, _version(name)) for name in _VERSIONED]),
        _source_digest(),
        jax.default_backend(),
        repr([(flag, getattr(jax.config, flag, None)) for flag in _FLAGS]),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _leaf(value: Any) -> str:
    if isinstance(value, jax.Array):
        return f"{value.dtype}{list(value.shape)}@{value.sharding}"
    shaped = jax.typeof(value) if hasattr(jax, "typeof") else jax.api_util.shaped_abstractify(value)
    return str(shaped)


def call_key(name: str, static: Any, args: tuple[Any, ...]) -> str:
    """What one call of program ``name`` traces to, besides the model: its static settings and its arguments'
    structure, shapes, dtypes and placement."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return "\n".join([name, repr(static), str(tree), *map(_leaf, leaves)])


class Program:
    """A program of one model (``fn(*args, static=...)``, jitted), traced once per argument signature and
    process, and kept on disk between processes.

    ``__call__`` runs it; ``lower`` and ``trace`` are the jitted function's, for inspecting the program.
    """

    def __init__(
        self,
        name: str,
        jitted: Callable[..., Any],
        fingerprint: Callable[[], str],
        donate: tuple[int, ...],
        label: str,
    ) -> None:
        self.name = name
        self.label = label
        self.jitted = jitted
        self._fingerprint = fingerprint
        self._donate = donate
        self._callables: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.jitted, attribute)  # lower, trace, eval_shape, ...

    def __call__(self, *args: Any, static: Any) -> Any:
        key = call_key(self.name, static, args)
        with compilation_cache():
            run = self._callables.get(key)
            if run is None:
                run = self._callables[key] = self._build(key, args, static)
            return run(*args)

    def _build(self, key: str, args: tuple[Any, ...], static: Any) -> Callable[..., Any]:
        directory = cache_dir()
        usable = (
            directory is not None and hasattr(self.jitted, "trace") and jax.process_count() == 1
        )
        if not usable:
            return functools.partial(self.jitted, static=static)
        digest = hashlib.sha256(f"{self._fingerprint()}\n{key}".encode()).hexdigest()
        path = directory / f"{self.name}-{digest}.bin"
        exported = None
        if path.is_file():
            try:
                exported = jax.export.deserialize(bytearray(path.read_bytes()))
            except Exception as error:  # a truncated or foreign file: trace again and replace it
                log.info("hfax: ignoring unreadable traced program %s (%s)", path, error)
        if exported is None:
            try:
                exported = jax.export.export(self.jitted)(*args, static=static)
            except Exception as error:
                log.info(
                    "hfax: program %r cannot be exported (%s); running it through jax.jit",
                    self.name,
                    error,
                )
                return functools.partial(self.jitted, static=static)
            _store(path, exported)

        def program(*args: Any) -> Any:
            return exported.call(*args)

        program.__name__ = program.__qualname__ = (
            self.label
        )  # what compile events and profiles call it
        return jax.jit(program, donate_argnums=self._donate)


def _store(path: Path, exported: Any) -> None:
    try:
        blob = exported.serialize()
    except (
        Exception
    ) as error:  # e.g. an output type jax.export cannot name: this process still uses it
        log.info("hfax: program %s is not kept on disk (%s)", path.name, error)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.write_bytes(blob)
    staging.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
