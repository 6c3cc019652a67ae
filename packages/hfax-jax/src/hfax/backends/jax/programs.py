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
structure, shapes, dtypes and shardings of its arguments; the model's config (not where it was loaded
from), family and every hfax patch on it; the model instance itself, module by module: each module's class
and the source files of its class hierarchy, its attributes and hooks, so a swapped activation or a PEFT
wrapper makes another key; the versions of jax, jaxlib, torch, torchax and transformers and the content of
transformers' own files (an edited transformers, or one installed from a checkout, makes new keys); the
text of hfax's own modules and of every loaded plugin's package; the JAX platform and the flags that change
tracing or numerics. A model holding something that cannot be named by content (a function typed into an interactive
session, an object of unknown kind) is not kept on disk at all: its programs are traced in every process.
Code changed at runtime elsewhere (a monkeypatched transformers function) is not seen:
``HFAX_NO_COMPILATION_CACHE=1`` turns this cache off with JAX's.

Each file records its key and a checksum of the program; a file that does not match its key, fails the
checksum or cannot be deserialized is traced again and replaced, with one warning naming it. Writes are
atomic. A cache folder that cannot be read or written costs a warning and an uncached run, never an error.
The folder is created private to the user (0700): whatever it holds runs as the user's code, so it must
be trusted like the code itself. A program that cannot be exported (e.g. one with host callbacks) or
serialized runs through ``jax.jit`` as usual.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

# JAX's config options as thread-local context managers (jax.config.update only sets them globally).
from jax._src import config as jax_config

log = logging.getLogger("hfax")

#: Bumped when what is stored changes meaning.
FORMAT = 2
_MAGIC = b"hfax traced program\n"
_VERSIONED = ("jax", "jaxlib", "torch", "torchax", "transformers")
#: JAX flags that change what a trace computes: dtypes, precision, random bits, partitioning.
_FLAGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_dynamic_shapes",
    "jax_threefry_partitionable",
    "jax_default_prng_impl",
    "jax_enable_custom_prng",
    "jax_numpy_dtype_promotion",
    "jax_use_shardy_partitioner",
)
#: Module attributes that are not part of what the module computes.
_SKIPPED_ATTRIBUTES = frozenset(
    {
        "_parameters",  # weights and buffers are arguments of the program, by shape in call_key
        "_buffers",
        "_modules",  # described each on its own line
        "_non_persistent_buffers_set",
        "_is_hf_initialized",
        "_hfax_patches",  # described with the values the patches put in place
        "name_or_path",  # where the checkpoint was loaded from
    }
)


class Uncacheable(Exception):
    """Something the trace depends on cannot be named by content: the program is not kept on disk."""


@functools.cache
def _hfax_compilation_dir() -> str:
    from hfax.user_cache import cache_dir as hfax_cache_dir

    path = str(hfax_cache_dir() / "jax")
    try:  # programs in the cache run as the user's code: only the user may write them
        make_private_dir(Path(path))
    except OSError:  # JAX and _store each warn that they cannot use it, and run without it
        pass
    log.info(
        "hfax: JAX's persistent compilation cache for hfax's programs is %s (set jax_compilation_cache_dir "
        "to use your own; HFAX_NO_COMPILATION_CACHE=1 turns it off)",
        path,
    )
    return path


def compilation_cache() -> contextlib.AbstractContextManager:
    """Around a compile of hfax's: JAX's persistent cache in hfax's folder, every program cached (JAX's
    default skips programs that compile faster than its ``persistent_cache_min_compile_time_secs``, as
    most CPU programs do), unless the user configured a cache or turned it off. Thread-local, so the
    user's settings and programs are untouched."""
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


def make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents readable and writable by the user alone (0700)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def _file_digest(path: str) -> str:
    stat = os.stat(path)
    return _content_digest(path, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _content_digest(path: str, size: int, mtime_ns: int) -> str:
    """The digest of a file's text, read once per size and modification time."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(_file_digest(str(path)).encode())
    return digest.hexdigest()


@functools.cache
def _source_digest() -> str:
    """A digest of hfax's own Python modules, every installed hfax distribution's: edits make new keys."""
    import hfax

    roots = sorted({Path(path).resolve() for path in hfax.__path__})
    return hashlib.sha256("".join(map(_tree_digest, roots)).encode()).hexdigest()


def installed_digest(root: Path, memo_dir: Path | None) -> str:
    """A digest of the text of every ``.py`` file under ``root``.

    Hashing transformers' thousands of files takes a while, so the digest is kept in ``memo_dir`` under
    the files' names, sizes and modification times: it is computed once per installed file set."""
    listing = hashlib.sha256()
    files = sorted(root.rglob("*.py"))
    for path in files:
        stat = path.stat()
        listing.update(f"{path.relative_to(root)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    memo = memo_dir / f"{root.name}-{listing.hexdigest()}.digest" if memo_dir else None
    try:
        if memo is not None and memo.is_file():
            return memo.read_text().strip()
    except OSError:
        pass
    digest = _tree_digest(root)
    if memo is not None:
        _write_atomic(memo, digest.encode(), quiet=True)
    return digest


@functools.cache
def _transformers_digest(memo_dir: Path | None) -> str:
    import transformers

    return installed_digest(Path(transformers.__file__).parent, memo_dir)


def _code_root(module: types.ModuleType) -> Path | None:
    """The folder of the outermost one-folder package ``module`` belongs to, or its file if none."""
    parts = module.__name__.split(".")
    for depth in range(1, len(parts) + 1):
        package = sys.modules.get(".".join(parts[:depth]))
        # a package spread over several folders (hfax itself, extend_path) is not one package's code
        if getattr(package, "__file__", None) and len(getattr(package, "__path__", ())) == 1:
            return Path(package.__file__).parent
    file = getattr(module, "__file__", None)
    return Path(file) if file else None


def _plugins_digest() -> str:
    """Every loaded plugin by name, distribution, version and the text of its package."""
    from hfax.plugins import loaded_plugins

    parts = []
    for name, distribution, version, plugin in loaded_plugins():
        module = plugin if isinstance(plugin, types.ModuleType) else inspect.getmodule(plugin)
        root = _code_root(module) if module is not None else None
        if root is None:
            raise Uncacheable(f"plugin {name!r} has no source file")
        code = _tree_digest(root) if root.is_dir() else _file_digest(str(root))
        parts.append(f"{name} {distribution} {version} {code}")
    return "\n".join(parts)


def _config_text(config: Any) -> str:
    """The config as JSON, without where it was loaded from (the same checkpoint elsewhere is the same)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "_name_or_path"}
        return value

    data = strip(json.loads(config.to_json_string(use_diff=False)))
    return json.dumps(data, sort_keys=True) + repr(getattr(config, "_attn_implementation", None))


class _Describer:
    """Names the values a module holds by what they are, never by where they live in memory."""

    def __init__(self) -> None:
        self._configs: dict[int, str] = {}

    def type_name(self, cls: type) -> str:
        """A class by name and the text of the files its hierarchy is defined in."""
        names = []
        for klass in cls.__mro__:
            if klass is object:
                continue
            try:
                file = inspect.getsourcefile(klass)
            except TypeError:  # a built-in class: the installed versions name it
                file = None
            if klass.__module__ == "__main__" and file is None:
                raise Uncacheable(f"class {klass.__qualname__} has no source file")
            code = _file_digest(file) if file and os.path.isfile(file) else ""
            names.append(f"{klass.__module__}.{klass.__qualname__}:{code}")
        return "(" + " ".join(names) + ")"

    def function(self, fn: types.FunctionType, depth: int) -> str:
        file = inspect.getsourcefile(fn)
        if not file or not os.path.isfile(file):
            raise Uncacheable(f"function {fn.__qualname__} has no source file")
        cells = _cell_contents(fn.__closure__)
        return (
            f"{fn.__module__}.{fn.__qualname__}:{_file_digest(file)}"
            f"{self(fn.__defaults__, depth)}{self(fn.__kwdefaults__, depth)}{self(cells, depth)}"
        )

    def __call__(self, value: Any, depth: int = 0) -> str:
        import torch
        from transformers import GenerationConfig, PretrainedConfig

        if depth > 6:
            raise Uncacheable(f"a {type(value).__qualname__} nested too deep")
        depth += 1
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return repr(value)
        if isinstance(value, (torch.dtype, torch.device, torch.Size)):
            return repr(value)
        if isinstance(value, (tuple, list)):
            return f"{type(value).__name__}[" + ",".join(self(v, depth) for v in value) + "]"
        if isinstance(value, (set, frozenset)):
            return "{" + ",".join(sorted(self(v, depth) for v in value)) + "}"
        if isinstance(value, dict):
            items = [f"{self(k, depth)}:{self(v, depth)}" for k, v in value.items()]
            return f"{type(value).__name__}{{" + ",".join(items) + "}"
        if isinstance(value, type):
            return self.type_name(value)
        if isinstance(value, PretrainedConfig):
            if id(value) not in self._configs:
                self._configs[id(value)] = _config_text(value)
            return self._configs[id(value)]
        if isinstance(value, GenerationConfig):
            return value.to_json_string(use_diff=False)
        if isinstance(value, torch.nn.Module):  # held outside _modules: its class names it
            return self.type_name(type(value))
        if isinstance(value, torch.Tensor):
            if value.is_meta or value.numel() > 1 << 16:
                raise Uncacheable("a large tensor held as a plain attribute")
            data = value.detach().cpu().contiguous().numpy().tobytes()
            return f"tensor{value.dtype}{list(value.shape)}:{hashlib.sha256(data).hexdigest()}"
        if isinstance(value, types.MethodType):
            return f"method {self(value.__func__, depth)} of {self.type_name(type(value.__self__))}"
        if isinstance(value, types.FunctionType):
            return self.function(value, depth)
        if isinstance(value, functools.partial):
            return f"partial({self(value.func, depth)},{self(value.args, depth)},{self(value.keywords, depth)})"
        if (
            isinstance(value, (types.BuiltinFunctionType, types.ModuleType))
            or callable(value)
            and (type(value).__module__ == "torch._ops")
        ):
            return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', value.__name__)}"
        if hasattr(value, "__dict__") and not callable(value):
            return f"{self.type_name(type(value))}{self(vars(value), depth)}"
        if callable(value) and hasattr(value, "__dict__"):  # an object whose __call__ is its code
            return f"{self.type_name(type(value))}{self(vars(value), depth)}"
        raise Uncacheable(f"a {type(value).__qualname__} held by the model")


def _cell_contents(closure: tuple[Any, ...] | None) -> list[Any]:
    contents = []
    for cell in closure or ():
        try:
            contents.append(cell.cell_contents)
        except ValueError:  # an empty cell: a variable not yet assigned
            continue
    return contents


def _structure(module: Any, describe: _Describer) -> str:
    """Every submodule by path, class, attributes and hooks: what the instance is, not what its class
    would build from its config."""
    lines = []
    for path, sub in module.named_modules(remove_duplicate=False):
        state = {k: v for k, v in vars(sub).items() if k not in _SKIPPED_ATTRIBUTES}
        lines.append(f"{path}: {describe.type_name(type(sub))} {describe(state)}")
    return "\n".join(lines)


def model_fingerprint(module: Any, family: str) -> str | None:
    """Everything about ``module`` and this installation that a trace of it depends on, as one digest;
    ``None`` when the model holds something that cannot be named by content (the program is then traced
    in every process)."""
    from hfax.patching import Patcher

    describe = _Describer()
    try:
        parts = [
            f"format {FORMAT}",
            _config_text(module.config),
            family,
            describe(
                [(type(target).__qualname__, name) for target, name in Patcher(module).patched]
            ),
            _structure(module, describe),
            repr([(name, _version(name)) for name in _VERSIONED]),
            _transformers_digest(cache_dir()),
            _source_digest(),
            _plugins_digest(),
            jax.default_backend(),
            repr([(flag, getattr(jax.config, flag, None)) for flag in _FLAGS]),
        ]
    except Uncacheable as reason:
        log.info("hfax: traced programs of this model are not kept on disk: it holds %s", reason)
        return None
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
        plain = functools.partial(self.jitted, static=static)
        directory = cache_dir()
        if directory is None or not hasattr(self.jitted, "trace") or jax.process_count() != 1:
            return plain
        fingerprint = self._fingerprint()
        if fingerprint is None:
            return plain
        digest = hashlib.sha256(f"{fingerprint}\n{key}".encode()).hexdigest()
        path = directory / f"{self.name}-{digest}.bin"
        exported = _load(path, digest)
        if exported is None:
            try:
                exported = jax.export.export(self.jitted)(*args, static=static)
            except Exception as error:
                log.info(
                    "hfax: program %r cannot be exported (%s); running it through jax.jit",
                    self.name,
                    error,
                )
                return plain
            _store(path, digest, exported)

        def program(*args: Any) -> Any:
            return exported.call(*args)

        program.__name__ = program.__qualname__ = self.label  # what compile events call it
        return jax.jit(program, donate_argnums=self._donate)


def _load(path: Path, digest: str) -> Any:
    """The program stored at ``path`` for key ``digest``, or ``None`` (absent, unreadable, damaged or
    another key's: then it is traced again and replaced, with a warning naming the file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        _warn_unusable(path, error)
        return None
    from hfax.backends.jax import pytrees

    pytrees.register_loaded()  # the output types the model's classes brought, named in the program
    try:
        return jax.export.deserialize(bytearray(_payload(data, digest)))
    except Exception as error:  # a damaged file the checksum missed, or a foreign one
        log.warning(
            "hfax: traced program %s is not used: %s; tracing again and replacing it", path, error
        )
        return None


def _payload(data: bytes, digest: str) -> bytes:
    """The serialized program in a stored file's bytes, checked against key ``digest``."""
    if not data.startswith(_MAGIC):
        raise ValueError("it is not an hfax traced program")
    header, _, blob = data[len(_MAGIC) :].partition(b"\n")
    try:
        fields = json.loads(header)
    except ValueError:
        raise ValueError("its header is damaged") from None
    if fields.get("format") != FORMAT:
        raise ValueError(f"it has format {fields.get('format')!r}, not {FORMAT}")
    if fields.get("key") != digest:
        raise ValueError(
            "it was stored under another key (a file renamed or copied into this slot)"
        )
    if fields.get("sha256") != hashlib.sha256(blob).hexdigest():
        raise ValueError("its checksum does not match (the file is damaged)")
    return blob


def _store(path: Path, digest: str, exported: Any) -> None:
    try:
        blob = bytes(exported.serialize())
    except (
        Exception
    ) as error:  # e.g. an output type jax.export cannot name: this process still uses it
        log.info("hfax: program %s is not kept on disk (%s)", path.name, error)
        return
    header = json.dumps(
        {"format": FORMAT, "key": digest, "sha256": hashlib.sha256(blob).hexdigest()}
    )
    _write_atomic(path, _MAGIC + header.encode() + b"\n" + blob)


_unusable_warned: set[Path] = set()


def _warn_unusable(path: Path, error: Exception) -> None:
    """One warning per folder and process for a cache that cannot be read or written."""
    if path.parent in _unusable_warned:
        return
    _unusable_warned.add(path.parent)
    log.warning(
        "hfax: cannot use the traced-program cache at %s (%s: %s); running without it. "
        "Point HFAX_CACHE at a writable folder, or set HFAX_NO_COMPILATION_CACHE=1.",
        path,
        type(error).__name__,
        error,
    )


def _write_atomic(path: Path, data: bytes, quiet: bool = False) -> None:
    """Write ``data`` to ``path`` so that a concurrent reader sees the old file or the whole new one."""
    staging = None
    try:
        make_private_dir(path.parent)
        descriptor, staging = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(staging, path)
    except OSError as error:
        if staging is not None and os.path.exists(staging):
            os.unlink(staging)
        if not quiet:
            _warn_unusable(path, error)
