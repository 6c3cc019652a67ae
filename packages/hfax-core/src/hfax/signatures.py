"""What a transformers forward takes, found by what an argument is rather than by how a release spells it.

transformers renames arguments between releases: 5.24 calls the cache ``cache`` where 5.23 called it
``past_key_values`` (``cache_params`` for Mamba-style models), and the cache's length ``cache_length``
where 5.23 had ``past_key_values_length``. So hfax never writes either spelling:

- a forward's cache parameter is the one annotated with a transformers ``Cache`` class
  (:func:`cache_parameter`); a forward that annotates its cache otherwise (BERT-style decoders say
  ``tuple[tuple[Tensor]]``) is read by the name the installed transformers gives its own cache
  (:func:`release_cache_name`, from ``GenerationMixin.prepare_inputs_for_generation``);
- a model output's cache is the field holding a ``Cache`` (:func:`output_cache`).

Plain Python over signatures and annotations, importable without torch. Only :func:`cache_keyword` runs
while a program is traced (inside hfax's replacements of transformers' layers): an ``isinstance`` over a
dict, which dynamo traces. Tested by ``packages/hfax-core/tests/test_signatures.py`` and, against both
releases, by the ``transformers_oldest`` and ``transformers_newest`` nox sessions.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from typing import Any

# transformers' caches import torch, which hfax-core does not need: without it no model runs to pass one.
try:
    from transformers.cache_utils import Cache as _Cache
except ImportError:
    _Cache = None


def names_a_cache(annotation: Any) -> bool:
    """Whether a parameter's ``annotation`` names a transformers ``Cache`` class: the class itself, any
    subclass (``EncoderDecoderCache``, a model's own), inside a union or ``Optional``, or a string
    annotation naming one."""
    if isinstance(annotation, str):
        return "Cache" in annotation
    if isinstance(annotation, type):
        return any(
            base.__name__ == "Cache" and base.__module__.startswith("transformers")
            for base in annotation.__mro__
        ) or (
            annotation.__name__.endswith("Cache")
            and annotation.__module__.startswith("transformers")
        )
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(names_a_cache(argument) for argument in typing.get_args(annotation))
    return False


@functools.cache
def release_cache_name() -> str:
    """The name under which the installed transformers passes a model its cache: the ``Cache``-annotated
    parameter of its own ``GenerationMixin.prepare_inputs_for_generation`` (``"cache"`` on 5.24,
    ``"past_key_values"`` on 5.23). ``""`` where transformers' generation cannot import (no torch)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except Exception:  # hfax-core without torch: no model runs, none needs the name
        return ""
    parameters = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return next((name for name, p in parameters.items() if names_a_cache(p.annotation)), "")


def cache_parameter(function: Any) -> str:
    """The parameter of ``function`` (a forward) that takes a transformers cache, or ``""``: the one
    annotated with a ``Cache`` class; else, for a forward that annotates its cache otherwise, the one
    named as the installed transformers names its cache (:func:`release_cache_name`)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return ""
    typed = [name for name, p in parameters.items() if names_a_cache(p.annotation)]
    if typed:
        return typed[0]
    release = release_cache_name()
    return release if release and release in parameters else ""


def output_cache(output: Any) -> Any:
    """The cache a transformers model output holds (its field whose value is a ``Cache``), or ``None``."""
    values = output.values() if hasattr(output, "values") else ()
    return next((value for value in values if names_a_cache(type(value))), None)


def cache_keyword(arguments: dict[str, Any]) -> str | None:
    """The keyword under which a forward's caller passed its cache (the key of ``arguments`` whose value
    is a transformers ``Cache``), or ``None`` where none was passed. For replacements of transformers'
    methods, which receive the cache under whatever name the installed release uses; plain ``isinstance``
    over a dict, so dynamo (torch_xla) traces it."""
    if _Cache is None:
        return None
    return next((key for key, value in arguments.items() if isinstance(value, _Cache)), None)


def cache_field(output_class: type) -> str:
    """The field of a transformers output class that holds the cache (``past_key_values`` on 5.23,
    ``cache`` on 5.24): the dataclass field annotated with a ``Cache`` class, or ``""``."""
    import dataclasses

    fields = dataclasses.fields(output_class) if dataclasses.is_dataclass(output_class) else ()
    return next((field.name for field in fields if names_a_cache(field.type)), "")
