"""Lowerings hfax gives torchax for the ops whose default lowering hides attention heads from GSPMD.

torch decomposes a 4-D ``matmul`` (and torchax's reference ``scaled_dot_product_attention`` calls it) into
3-D batched matmuls over ``batch * heads``. Once batch and heads are merged, GSPMD cannot keep heads split
over the ``model`` axis and all-gathers q, k and v in every layer. Lowered straight to ``jnp.matmul``, the
head dimension stays a batch dimension of the dot, and tensor-parallel attention needs no collective: a
decoder layer costs the two all-reduces of its row-parallel projections. Results are unchanged.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch


def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    attn_mask: jax.Array | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> jax.Array:
    """``torch.nn.functional.scaled_dot_product_attention`` on ``[..., heads, length, head_dim]`` arrays."""
    if dropout_p:
        raise ValueError(f"hfax runs attention for inference only, got dropout_p={dropout_p}; call model.eval() first")
    if query.shape[-3] != key.shape[-3]:  # grouped-query attention: each key/value head serves a group of queries
        groups = query.shape[-3] // key.shape[-3]
        key, value = jnp.repeat(key, groups, axis=-3), jnp.repeat(value, groups, axis=-3)
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = jnp.matmul(query, jnp.swapaxes(key, -1, -2)).astype(jnp.float32) * scale
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else scores + attn_mask
    return jnp.matmul(jax.nn.softmax(scores, axis=-1).astype(value.dtype), value)


#: torch functions and the JAX functions hfax lowers them to.
LOWERINGS: dict[Any, Callable[..., jax.Array]] = {
    torch.matmul: jnp.matmul,
    torch.Tensor.matmul: jnp.matmul,
    torch.Tensor.__matmul__: jnp.matmul,
    torch.nn.functional.scaled_dot_product_attention: scaled_dot_product_attention,
}


def _attend_written(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """Attention over keys and values a slot-cache write returned, read around the write (``cache.attend``);
    ``None`` for any other call."""
    from hfax.backends.jax import cache
    from hfax.backends.jax.runtime import torchax

    keys, values = cache.written(key), cache.written(value)
    if keys is None or values is None or attn_mask is None or is_causal or dropout_p:
        return None
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    return torchax.interop.call_jax(functools.partial(cache.attend, scale=scale), query, keys, values, attn_mask)


#: torch functions whose lowering first tries one that needs the torch arguments themselves; ``None`` declines.
TORCH_LOWERINGS: dict[Any, Callable[..., Any]] = {torch.nn.functional.scaled_dot_product_attention: _attend_written}


def install(environment: Any) -> None:
    """Register :data:`LOWERINGS` in a torchax environment (idempotent)."""

    def lowered(function: Any, fn: Callable[..., jax.Array]) -> Callable[..., Any]:
        first = TORCH_LOWERINGS.get(function)

        def run(*args: Any, **kwargs: Any) -> Any:
            if first is not None and (result := first(*args, **kwargs)) is not None:
                return result
            args, kwargs = environment.t2j_iso((args, kwargs))
            return environment.j2t_iso(fn(*args, **kwargs))

        return run

    for function, fn in LOWERINGS.items():
        environment.override_op_definition(function, lowered(function, fn))
