"""What every long-tail family plugin is: a :class:`LongTailFamily`, its hook implementations.

:mod:`hfax.patches.longtail.families` names one per family, and the distribution names each as an entry
point, so each family is its own plugin: listed by ``hfax plugins``, blocked by
``HFAX_BLOCK_PLUGINS=<name>``, with the transformers versions it was tested on. Its code is the module of
its name, imported only when a model of the family is patched or generates: listing or loading plugins
imports neither torch nor transformers' models.

A long-tail family claims a model with a priority below a dedicated family plugin's (``hfax.Claim``
priority 0, what a plain family name means), so a plugin written for one of these architectures outranks
it. Its patches apply to every model whose config, or any config inside it, has one of its model types:
an encoder-decoder or vision-language model holds them in sub-configs (a TrOCR decoder, a BERT decoder of
an ``EncoderDecoderModel``), whichever family claims the whole.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

from hfax import Claim, FamilySpec, hookimpl
from hfax.generation.traits import GenerationTraits

#: The transformers versions the long-tail families were tested with; outside them hfax warns (strict:
#: raises).
TRANSFORMERS = ">=5.23,<5.26"

#: The priority of a long-tail family's claim: below a dedicated family's.
PRIORITY = -1


#: The config :func:`model_types` read last (a weak reference) and its answer: every family asks of the
#: same config in turn, several times per ``generate``, and a config's model types do not change.
_LAST: tuple[weakref.ref, frozenset[str]] | None = None


def model_types(config: Any) -> frozenset[str]:
    """The ``model_type`` of ``config`` and of every config inside it: its text config, its
    ``sub_configs`` and its encoder and decoder configs, recursively."""
    global _LAST
    if _LAST is not None and _LAST[0]() is config:
        return _LAST[1]
    found: set[str] = set()
    pending, seen = [config], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        found.add(getattr(current, "model_type", None) or "")
        inner = []
        try:
            inner.append(current.get_text_config())
        except (AttributeError, ValueError):  # none, or several: then sub_configs names each
            pass
        names = [*(getattr(current, "sub_configs", None) or {}), "encoder", "decoder"]
        inner += [getattr(current, name, None) for name in names]
        pending += [item for item in inner if hasattr(item, "model_type")]
    types = frozenset(found - {""})
    try:
        _LAST = (weakref.ref(config), types)
    except TypeError:  # an object without weak references: asked again next time
        pass
    return types


class LongTailFamily:
    """One family's hooks: ``name`` claims ``types`` (the top-level ``model_type``), and on every model
    that holds one of them binds the ``PATCHES`` of module ``hfax.patches.longtail.<name>`` (``{class
    name: (method, replacement)}``) where it has them and calls its ``patch_model(model, patcher)`` where
    it has one; ``generate`` asks the same models' traits of its ``generation_traits(model, config)`` where
    it has one. The patches apply on every backend, or only on those the module's ``BACKENDS`` names
    (a fix for what one backend's compiler refuses leaves the others on transformers' code)."""

    def __init__(self, name: str, types: tuple[str, ...]) -> None:
        self.name, self.types = name, types

    def _code(self, config: Any) -> Any:
        """The family's module when ``config`` holds one of its model types, else ``None``."""
        if config is None or not model_types(config) & set(self.types):
            return None
        return importlib.import_module(f"hfax.patches.longtail.{self.name}")

    @hookimpl
    def hfax_families(self) -> list[FamilySpec]:
        return [FamilySpec(self.name, self.types, TRANSFORMERS)]

    @hookimpl
    def hfax_detect_model(self, config: Any) -> Claim | None:
        if getattr(config, "model_type", None) in self.types:
            return Claim(self.name, PRIORITY)
        return None

    @hookimpl
    def hfax_patch_model(self, model: Any, backend: str, patcher: Any) -> None:
        module = self._code(getattr(model, "config", None))
        if module is None or backend not in getattr(module, "BACKENDS", (backend,)):
            return
        if getattr(module, "PATCHES", None):
            patcher.bind_by_class(model, module.PATCHES)
        patch_model = getattr(module, "patch_model", None)
        if patch_model is not None:
            patch_model(model, patcher)

    @hookimpl
    def hfax_generation_traits(self, model: Any, config: Any) -> GenerationTraits | None:
        module = self._code(config)
        traits = getattr(module, "generation_traits", None)
        return None if traits is None else traits(model, config)
