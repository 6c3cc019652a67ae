"""transformers' output and cache types as JAX pytrees, registered generically.

Every ``ModelOutput`` subclass flattens to its present fields; every ``Cache`` and cache layer flattens to
its array-valued attributes, chosen by attribute name once per object so that the tree structure does not
depend on whether a value is a concrete array or a tracer. Types are registered when hfax first sees
them and, for those already imported, when the backend loads.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import jax
import torch
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DummyLayer,
    LinearAttentionCacheLayerMixin,
)
from transformers.utils import ModelOutput

#: Cache containers and the layer kinds they hold: attention layers, linear-attention (Mamba-style) layers
#: and the empty layers of models that share another layer's cache.
CACHE_TYPES = (Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin, DummyLayer)
_registered: set[type] = set()
_lock = threading.Lock()
_ARRAY_ATTRIBUTES = (
    "keys",
    "values",
    "cumulative_length",
    "layers",
    "conv_states",
    "recurrent_states",
)


class _Static:
    """Hashable holder for the non-array attributes of a cache object (compared by value where possible)."""

    def __init__(self, items: tuple[tuple[str, Any], ...]) -> None:
        self.items = items

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Static) or [k for k, _ in self.items] != [
            k for k, _ in other.items
        ]:
            return False
        try:
            return all(bool(a == b) for (_, a), (_, b) in zip(self.items, other.items))
        except Exception:  # an attribute without a plain truth value: fall back to identity
            return all(a is b for (_, a), (_, b) in zip(self.items, other.items))

    def __hash__(self) -> int:
        return hash(tuple(k for k, _ in self.items))


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, torch.Tensor)) or (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, (*CACHE_TYPES, jax.Array, torch.Tensor)) for v in value)
    )


def _flatten_output(output: ModelOutput) -> tuple[list[Any], tuple[str, ...]]:
    keys = tuple(output.keys())
    return [output[key] for key in keys], keys


def _flatten_object(obj: Any) -> tuple[list[Any], tuple[tuple[str, ...], _Static]]:
    state = vars(obj)
    names = tuple(name for name in state if name in _ARRAY_ATTRIBUTES or _is_array(state[name]))
    rest = _Static(tuple((name, value) for name, value in state.items() if name not in names))
    return [state[name] for name in names], (names, rest)


def _unflatten_object(cls: type) -> Any:
    def unflatten(aux: tuple[tuple[str, ...], _Static], children: Any) -> Any:
        names, rest = aux
        obj = cls.__new__(cls)
        vars(obj).update(rest.items)
        vars(obj).update(zip(names, children))
        return obj

    return unflatten


def register(cls: type) -> None:
    """Make ``cls`` (a ``ModelOutput``, ``Cache`` or cache layer type) a JAX pytree; repeat calls are no-ops."""
    with _lock:
        if cls in _registered:
            return
        if issubclass(cls, ModelOutput):
            jax.tree_util.register_pytree_node(
                cls, _flatten_output, lambda keys, children: cls(**dict(zip(keys, children)))
            )
            # Its field names serialize, so programs returning it can be kept on disk (programs.py).
            jax.export.register_pytree_node_serialization(
                cls,
                serialized_name=f"{cls.__module__}.{cls.__qualname__}",
                serialize_auxdata=lambda keys: json.dumps(keys).encode(),
                deserialize_auxdata=lambda data: tuple(json.loads(data)),
            )
        elif issubclass(cls, CACHE_TYPES):
            jax.tree_util.register_pytree_node(cls, _flatten_object, _unflatten_object(cls))
        else:
            raise TypeError(
                f"{cls.__name__} is neither a transformers ModelOutput nor a cache type"
            )
        _registered.add(cls)


def register_loaded() -> None:
    """Register every output and cache type transformers has imported so far."""
    stack: list[type] = [ModelOutput, *CACHE_TYPES]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in (
            ModelOutput,
            Cache,
            CacheLayerMixin,
            LinearAttentionCacheLayerMixin,
        ) and not getattr(cls, "__abstractmethods__", None):
            register(cls)


def to_jax(value: Any, tensor_to_array: Any) -> Any:
    """Turn a model's torch-side output into JAX values, registering the container types met on the way."""
    if isinstance(value, torch.Tensor):
        return tensor_to_array(value)
    if isinstance(value, ModelOutput):
        register(type(value))
        converted = {key: to_jax(item, tensor_to_array) for key, item in value.items()}
        return type(value)(**converted)
    if isinstance(value, CACHE_TYPES):
        register(type(value))
        clone = copy.copy(value)
        for name in _flatten_object(value)[1][0]:
            setattr(clone, name, to_jax(getattr(value, name), tensor_to_array))
        return clone
    if isinstance(value, (list, tuple)):
        return type(value)(to_jax(item, tensor_to_array) for item in value)
    if isinstance(value, dict):
        return {key: to_jax(item, tensor_to_array) for key, item in value.items()}
    return value
