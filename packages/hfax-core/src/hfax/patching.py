"""Recorded, idempotent, undoable patches on one model instance (in the spirit of ``pytest.MonkeyPatch``).

Patches never touch modules or classes: changing ``transformers`` globals leaks between models and tests.
The record lives on the model itself, so ``hfax.unpatch(model)`` works wherever the model went.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable

_RECORD = "_hfax_patches"
_MISSING = object()


@dataclasses.dataclass
class _Change:
    target: Any
    name: str
    original: Any
    owned: bool  # restored by setting the original back (an instance attribute or a property), else deleted
    value: Any


def _owned(target: Any, name: str) -> bool:
    if name in getattr(target, "__dict__", {}):
        return True
    # A property (e.g. a transformers config's ``_attn_implementation``) stores the value elsewhere: it is
    # restored by setting the original back, not by deleting an instance attribute that never existed.
    if hasattr(getattr(type(target), name, None), "__set__"):
        return True
    # torch.nn.Module keeps submodules, parameters and buffers in registries, not in __dict__.
    return any(
        name in (getattr(target, registry, None) or {})
        for registry in ("_modules", "_parameters", "_buffers")
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, types.MethodType) and isinstance(b, types.MethodType):
        return a.__func__ is b.__func__ and a.__self__ is b.__self__
    return a is b


class Patcher:
    """Applies and records changes to ``model`` and objects it owns (submodules, config, caches)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        if _RECORD not in vars(model):
            object.__setattr__(model, _RECORD, [])
        self._changes: list[_Change] = vars(model)[_RECORD]

    def setattr(self, target: Any, name: str, value: Any) -> None:
        """Set ``target.name = value``; setting the same value again is a no-op."""
        if isinstance(target, (types.ModuleType, type)):
            raise TypeError(
                f"refusing to patch {name!r} on {target!r}: patches apply to instances only, "
                "because changing a module or class leaks into every other model. Patch the model instance."
            )
        for change in self._changes:
            if change.target is target and change.name == name:
                if not _same(getattr(target, name, _MISSING), value):
                    setattr(target, name, value)
                    change.value = value
                return
        original = getattr(target, name, _MISSING)
        self._changes.append(_Change(target, name, original, _owned(target, name), value))
        setattr(target, name, value)

    def bind(self, target: Any, name: str, function: Callable[..., Any]) -> None:
        """Replace method ``name`` of one instance with ``function(self, ...)``."""
        self.setattr(target, name, types.MethodType(function, target))

    def bind_by_class(self, model: Any, table: dict[str, tuple[str, Callable[..., Any]]]) -> None:
        """For every submodule of ``model`` whose class name ``table`` lists, replace the method it names
        with its replacement (``{class name: (method, replacement)}``); anything but a torch module is left
        alone."""
        if not callable(getattr(model, "modules", None)):
            return
        for module in model.modules():
            entry = table.get(type(module).__name__)
            if entry is not None:
                self.bind(module, *entry)

    def undo(self, keep: int) -> None:
        """Undo the changes after the first ``keep``, newest first (a plugin that failed halfway)."""
        while len(self._changes) > keep:
            _restore(self._changes.pop())

    @property
    def patched(self) -> list[tuple[Any, str]]:
        """``(target, attribute)`` for every change in force, oldest first."""
        return [(change.target, change.name) for change in self._changes]


def unpatch(model: Any) -> None:
    """Undo every hfax patch on ``model``, newest first, restoring the original objects."""
    changes: list[_Change] = vars(model).get(_RECORD, [])
    while changes:
        _restore(changes.pop())


def _restore(change: _Change) -> None:
    if change.owned:
        setattr(change.target, change.name, change.original)
    elif change.name in getattr(change.target, "_modules", {}) or change.name in vars(
        change.target
    ):
        delattr(change.target, change.name)
