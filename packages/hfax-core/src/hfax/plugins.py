"""Finding, loading and asking plugins.

Plugins are loaded on first use, one entry point at a time, in a stable order (distribution name, then
entry-point name). A plugin that fails to import or register is reported and skipped, never taking the
others down; ``HFAX_STRICT_PLUGINS=1`` re-raises instead (hfax's own CI runs strict).

Environment switches, read when plugins are first loaded:

``HFAX_DISABLE_PLUGINS=1``
    load no entry-point plugins at all (core's built-in defaults stay).
``HFAX_PLUGINS=jax,llama``
    load only these entry-point names.
``HFAX_BLOCK_PLUGINS=broken``
    load every entry point except these names.
``HFAX_STRICT_PLUGINS=1``
    a plugin that fails to load raises :class:`PluginLoadError`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import threading
import warnings
from typing import Any

import pluggy

from hfax import _builtin, hookspecs
from hfax.registry import BackendSpec, Claim, FamilySpec

ENTRY_POINT_GROUP = "hfax"
GENERIC_FAMILY = "generic"


class PluginLoadWarning(UserWarning):
    """A plugin could not be loaded and was skipped."""


class PluginLoadError(RuntimeError):
    """A plugin failed to load in strict mode (``HFAX_STRICT_PLUGINS=1``); the cause is chained."""


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


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _names(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


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
        taken = {
            core.name: core.distribution
        }  # plugin name -> the distribution whose plugin holds it
        only, blocked = _names("HFAX_PLUGINS"), _names("HFAX_BLOCK_PLUGINS") or set()
        disabled = _flag("HFAX_DISABLE_PLUGINS")
        entry_points = sorted(
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
            key=lambda ep: (ep.dist.name if ep.dist else "", ep.name),
        )
        for ep in entry_points:
            dist = ep.dist.name if ep.dist else "?"
            info = PluginInfo(ep.name, dist, ep.dist.version if ep.dist else "?", "loaded")
            if ep.name in taken:
                _failed(
                    info,
                    f"entry-point name {ep.name!r} is already taken by distribution {taken[ep.name]!r}",
                )
            elif disabled or (only is not None and ep.name not in only) or ep.name in blocked:
                info.status = "blocked"
            else:
                try:
                    plugin = ep.load()
                    pm.register(plugin, name=ep.name)
                    try:
                        info.backends, info.families = _provides(pm, plugin)
                    except Exception:
                        pm.unregister(plugin)
                        raise
                    taken[ep.name] = dist
                except Exception as error:
                    _failed(info, f"{type(error).__name__}: {error}", error)
            infos.append(info)
        self.infos = infos
        return pm


def _failed(info: PluginInfo, error: str, cause: Exception | None = None) -> None:
    """Report a plugin that could not be loaded: raise in strict mode, else warn and mark it failed."""
    message = (
        f"hfax plugin {info.name!r} from distribution {info.distribution!r} failed to load and was skipped "
        f"({error}). Disable it with HFAX_BLOCK_PLUGINS={info.name} or uninstall {info.distribution}."
    )
    if strict():
        raise PluginLoadError(message) from cause
    info.status, info.error = "failed", error
    warnings.warn(message, PluginLoadWarning, stacklevel=5)


def _ask(pm: pluggy.PluginManager, plugin: Any, hook: str) -> list[Any]:
    impls = [impl for impl in getattr(pm.hook, hook).get_hookimpls() if impl.plugin is plugin]
    return [item for impl in impls for item in (impl.function() or [])]


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


def reset_plugins() -> None:
    """Forget loaded plugins so the next use reloads them (and re-reads the environment switches)."""
    _plugins.reset()


def register(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object directly, without an entry point (tests, notebooks)."""
    pm = get_plugin_manager()
    pm.register(plugin, name=name)
    backends, families = _provides(pm, plugin)
    _plugins.infos.append(
        PluginInfo(
            pm.get_name(plugin) or "?", "(registered in code)", "", "loaded", "", backends, families
        )
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
        claims.append((claim, impl.plugin_name))
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
