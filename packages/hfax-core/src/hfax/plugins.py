"""Finding, loading and asking plugins.

Plugins are loaded on first use, one entry point at a time, in a stable order (distribution name, then
entry-point name). A plugin that fails to import or register is reported and skipped, never taking the
others down; ``HFAX_STRICT_PLUGINS=1`` re-raises instead (hfax's own CI runs strict).

Environment switches, read when plugins are first loaded:

``HFAX_DISABLE_PLUGINS=1``
    load no entry-point plugins at all (core's built-in defaults stay).
``HFAX_PLUGINS=jax,llama``
    load only these entry points.
``HFAX_BLOCK_PLUGINS=broken``
    load every entry point except these.
``HFAX_STRICT_PLUGINS=1``
    a plugin that fails to load raises :class:`PluginLoadError`, one whose hook fails raises
    :class:`PluginHookError`.

A plugin is identified by its distribution and entry-point name, ``hfax-patches-llama:llama``: another
distribution whose entry point is also called ``llama`` is another plugin and cannot displace it. The
switches take either form; a bare name means every distribution's entry point of that name.

Hook calls are isolated at run time as loading is: an implementation of :data:`ISOLATED_HOOKS` that
raises, or any implementation that returns a value of the wrong type (checked against the hook spec's
annotation), is reported with the plugin's name and skipped (patches it made halfway are undone), or
raises :class:`PluginHookError` in strict mode.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import importlib.metadata
import logging
import os
import threading
import types
import typing
import warnings
from typing import Any, cast

import pluggy

from hfax import _builtin, hookspecs
from hfax.patching import Patcher
from hfax.specs import BackendSpec, Claim, FamilySpec

log = logging.getLogger("hfax")

ENTRY_POINT_GROUP = "hfax"
IN_CODE = "(registered in code)"
GENERIC_FAMILY = "generic"


class PluginLoadWarning(UserWarning):
    """A plugin could not be loaded and was skipped."""


class PluginLoadError(RuntimeError):
    """A plugin failed to load in strict mode (``HFAX_STRICT_PLUGINS=1``); the cause is chained."""


class PluginHookWarning(UserWarning):
    """A plugin's hook implementation failed at run time and was skipped."""


class PluginHookError(RuntimeError):
    """A plugin's hook implementation failed in strict mode (``HFAX_STRICT_PLUGINS=1``)."""


#: Hooks whose failing implementation can be skipped: the others' failures (a backend placing weights
#: or compiling) are the user's errors and propagate unchanged.
ISOLATED_HOOKS = frozenset(
    {
        "hfax_backends",
        "hfax_families",
        "hfax_detect_model",
        "hfax_sharding_plan",
        "hfax_patch_model",
        "hfax_register_commands",
    }
)


class PluginConflictError(RuntimeError):
    """Two plugins claim the same model with the same priority."""


@dataclasses.dataclass
class PluginInfo:
    """What ``hfax plugins`` shows for one plugin."""

    name: str
    distribution: str
    version: str
    status: str  # "loaded", "failed", "blocked" or "builtin"
    error: str = ""
    backends: tuple[str, ...] = ()
    families: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``distribution:name``: what the plugin manager registers it as and the switches accept."""
        if self.status == "builtin" or self.distribution == IN_CODE:
            return self.name
        return f"{self.distribution}:{self.name}"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _names(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _named(info: PluginInfo, names: set[str]) -> bool:
    """Whether a switch's ``names`` pick ``info``: by ``distribution:name``, or by a bare name."""
    return info.id in names or info.name in names


def strict() -> bool:
    """Whether plugin problems raise instead of warning (``HFAX_STRICT_PLUGINS=1``)."""
    return _flag("HFAX_STRICT_PLUGINS")


class _Plugins:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._manager: pluggy.PluginManager | None = None
        self.infos: list[PluginInfo] = []

    @property
    def manager(self) -> pluggy.PluginManager:
        with self._lock:
            if self._manager is None:
                self._manager = self._load()
            return self._manager

    def reset(self) -> None:
        with self._lock:
            self._manager = None
            self.infos = []

    def _load(self) -> pluggy.PluginManager:
        pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        pm.add_hookspecs(hookspecs)
        pm.register(_builtin, name="hfax-core")
        core = PluginInfo("hfax-core", "hfax-core", _version("hfax-core"), "builtin")
        core.backends, core.families = _provides(pm, _builtin)
        infos = [core]
        only, blocked = _names("HFAX_PLUGINS"), _names("HFAX_BLOCK_PLUGINS") or set()
        disabled = _flag("HFAX_DISABLE_PLUGINS")
        entry_points = sorted(
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
            key=lambda ep: (ep.dist.name if ep.dist else "", ep.name),
        )
        for ep in entry_points:
            dist = ep.dist.name if ep.dist else "?"
            info = PluginInfo(ep.name, dist, ep.dist.version if ep.dist else "?", "loaded")
            if disabled or (only is not None and not _named(info, only)) or _named(info, blocked):
                pm.set_blocked(info.id)
            if pm.is_blocked(info.id):
                info.status = "blocked"
            else:
                try:
                    plugin = _Isolated(pm, ep.load(), info.id)
                    pm.register(plugin, name=info.id)
                    try:
                        info.backends, info.families = _provides(pm, plugin)
                    except Exception:
                        pm.unregister(plugin)
                        raise
                except Exception as error:
                    _failed(info, f"{type(error).__name__}: {error}", error)
            infos.append(info)
        named_blocks = [info.id for info in infos if _named(info, blocked)]
        if named_blocks:  # a bare name may block several distributions' plugins: say which
            log.info("hfax: HFAX_BLOCK_PLUGINS blocks %s", ", ".join(named_blocks))
        self.infos = infos
        return pm


def _failed(info: PluginInfo, error: str, cause: Exception | None = None) -> None:
    """Report a plugin that could not be loaded: raise in strict mode, else warn and mark it failed."""
    message = (
        f"hfax plugin {info.name!r} from distribution {info.distribution!r} failed to load and was skipped "
        f"({error}). Disable it with HFAX_BLOCK_PLUGINS={info.id} or uninstall {info.distribution}."
    )
    if strict():
        raise PluginLoadError(message) from cause
    info.status, info.error = "failed", error
    warnings.warn(message, PluginLoadWarning, stacklevel=5)


class _Isolated:
    """What hfax registers for a plugin: its hook implementations, each isolated by :func:`_guarded`.

    pluggy stops a hook call at the first implementation that raises, so isolation must wrap each
    implementation, not the call; the plugin object itself is left as it is."""

    def __init__(self, pm: pluggy.PluginManager, plugin: Any, plugin_id: str) -> None:
        self.hfax_plugin = plugin
        for name in dir(plugin):
            options = pm.parse_hookimpl_opts(plugin, name)
            if options is None:
                continue
            function = getattr(plugin, name)
            wraps = options.get("wrapper") or options.get("hookwrapper")
            setattr(self, name, function if wraps else _guarded(function, name, plugin_id))


def _guarded(function: Any, hook: str, plugin_id: str) -> Any:
    expected = _return_type(hook)

    @functools.wraps(function)
    def guarded(*args: Any) -> Any:
        patcher = next((arg for arg in args if isinstance(arg, Patcher)), None)
        keep = len(patcher.patched) if patcher is not None else 0
        try:
            result = function(*args)
        except Exception as error:
            if hook not in ISOLATED_HOOKS:
                raise
            if patcher is not None:
                patcher.undo(keep)
            return hook_failed(plugin_id, hook, f"raised {type(error).__name__}: {error}", error)
        if not _conforms(result, expected):
            problem = f"returned {type(result).__name__} {result!r:.80}, not {_type_text(expected)}"
            if hook not in ISOLATED_HOOKS:
                raise PluginHookError(f"hfax plugin {plugin_id!r}: {hook} {problem}")
            return hook_failed(plugin_id, hook, problem)
        return result

    return guarded


def hook_failed(plugin_id: str, hook: str, problem: str, cause: Exception | None = None) -> None:
    """Report a failed hook implementation: raise in strict mode, else warn; its answer is skipped."""
    message = (
        f"hfax plugin {plugin_id!r}: {hook} {problem}; its answer was skipped. Fix or upgrade the "
        f"plugin, or disable it with HFAX_BLOCK_PLUGINS={plugin_id}."
    )
    if strict():
        raise PluginHookError(message) from cause
    warnings.warn(message, PluginHookWarning, stacklevel=4)


@functools.cache
def _return_type(hook: str) -> Any:
    """The return annotation of hook spec ``hook``."""
    from hfax import checkpoints, patching, specs
    from hfax.generation import traits

    # Every name the specs import for type checking only (get_type_hints evaluates them all).
    names = {
        name: value
        for module in (specs, patching, checkpoints, traits)
        for name, value in vars(module).items()
        if isinstance(value, type)
    }
    return typing.get_type_hints(getattr(hookspecs, hook), localns=names).get("return", Any)


def _conforms(value: Any, expected: Any) -> bool:
    """Whether ``value`` fits annotation ``expected`` (unions, ``None``, lists, callables, classes)."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if expected is None or expected is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(item, args[0]) for item in value)
    if origin is collections.abc.Callable:
        return callable(value)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def _type_text(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected).replace("hfax.specs.", "")


def _ask(pm: pluggy.PluginManager, plugin: Any, hook: str) -> list[Any]:
    impls = [impl for impl in getattr(pm.hook, hook).get_hookimpls() if impl.plugin is plugin]
    # the implementation itself, not its isolation: a plugin that fails here fails to load
    functions = [getattr(impl.function, "__wrapped__", impl.function) for impl in impls]
    return [item for function in functions for item in (function() or [])]


def _provides(pm: pluggy.PluginManager, plugin: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the backends and families ``plugin`` provides."""
    backends = tuple(spec.name for spec in _ask(pm, plugin, "hfax_backends"))
    return backends, tuple(spec.name for spec in _ask(pm, plugin, "hfax_families"))


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


_plugins = _Plugins()


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, loading plugins on first call."""
    return _plugins.manager


def plugin_infos() -> list[PluginInfo]:
    """Every plugin seen, with its status and what it provides."""
    get_plugin_manager()
    return list(_plugins.infos)


def loaded_plugins() -> list[tuple[str, str, str, Any]]:
    """``(name, distribution, version, plugin object)`` of every registered plugin, in a stable order."""
    infos = {info.id: info for info in plugin_infos()}
    found = []
    for name, plugin in get_plugin_manager().list_name_plugin():
        info = infos.get(name)
        plugin = getattr(plugin, "hfax_plugin", plugin)  # the plugin itself, not its _Isolated
        found.append(
            (name, info.distribution if info else "?", info.version if info else "?", plugin)
        )
    return sorted(found, key=lambda item: item[:3])


def reset_plugins() -> None:
    """Forget loaded plugins so the next use reloads them (and re-reads the environment switches)."""
    _plugins.reset()


def register(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object directly, without an entry point (tests, notebooks)."""
    pm = get_plugin_manager()
    plugin = _Isolated(pm, plugin, name or f"{type(plugin).__qualname__} registered in code")
    pm.register(plugin, name=name)
    backends, families = _provides(pm, plugin)
    _plugins.infos.append(
        PluginInfo(pm.get_name(plugin) or "?", IN_CODE, "", "loaded", "", backends, families)
    )


def unregister(name: str) -> None:
    """Undo :func:`register`."""
    get_plugin_manager().unregister(name=name)
    _plugins.infos = [info for info in _plugins.infos if info.name != name]


def backends() -> dict[str, BackendSpec]:
    """Installed backends by name."""
    found: dict[str, BackendSpec] = {}
    for specs in get_plugin_manager().hook.hfax_backends():
        for spec in specs:
            found.setdefault(spec.name, spec)
    return found


def families() -> dict[str, FamilySpec]:
    """Installed model families by name."""
    found: dict[str, FamilySpec] = {}
    for specs in get_plugin_manager().hook.hfax_families():
        for spec in specs:
            found.setdefault(spec.name, spec)
    return found


def detect_family(config: Any) -> str:
    """The family that handles ``config``: the highest-priority claim, or ``"generic"`` if unclaimed."""
    pm = get_plugin_manager()
    claims: list[tuple[Claim, str]] = []
    for impl in reversed(pm.hook.hfax_detect_model.get_hookimpls()):
        answer = impl.function(
            *[config for _ in impl.argnames]
        )  # an implementation may take no arguments
        if answer is None:
            continue
        claim = Claim(answer) if isinstance(answer, str) else answer
        claims.append((cast(Claim, claim), impl.plugin_name))
    if not claims:
        return GENERIC_FAMILY
    best = max(claim.priority for claim, _ in claims)
    winners = sorted({(claim.family, plugin) for claim, plugin in claims if claim.priority == best})
    if len({family for family, _ in winners}) > 1:
        named = ", ".join(f"{family!r} (plugin {plugin!r})" for family, plugin in winners)
        raise PluginConflictError(
            f"model_type {getattr(config, 'model_type', '?')!r} is claimed by several families: {named}. "
            "Block one with HFAX_BLOCK_PLUGINS=<plugin>, or have one return hfax.Claim(family, priority=1)."
        )
    return winners[0][0]
