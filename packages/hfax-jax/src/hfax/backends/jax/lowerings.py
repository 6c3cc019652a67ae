"""Lowerings hfax gives torchax for the ops whose default lowering hides attention heads from GSPMD.

torch decomposes a 4-D ``matmul`` (and torchax's reference ``scaled_dot_product_attention`` calls it) into
3-D batched matmuls over ``batch * heads``. Once batch and heads are merged, GSPMD cannot keep heads split
over the ``model`` axis and all-gathers q, k and v in every layer. Lowered straight to ``jnp.matmul``, the
head dimension stays a batch dimension of the dot, and tensor-parallel attention needs no collective: a
decoder layer costs the two all-reduces of its row-parallel projections. Results are unchanged.
"""

from __future__ import annotations

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


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``torch.matmul``, accumulating 16-bit floats in float32 (see :func:`linear`)."""
    dtype = jnp.result_type(a, b)
    return jnp.matmul(a, b, preferred_element_type=_accumulator(dtype)).astype(dtype)


def linear(input: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``torch.nn.functional.linear``, accumulating 16-bit floats in float32.

    The result is rounded to the inputs' type once, as XLA's own 16-bit dots do on every backend. Asked
    for a bfloat16 result, XLA:CPU instead converts both operands to float32 first: the weights too,
    costing more memory traffic than the product (in a loop the conversion is hoisted, but then a
    program's every call converts every weight). Asked for float32 accumulation it multiplies bfloat16
    weights as they are wherever its kernels can (two rows and more).
    """
    dtype = jnp.result_type(input, weight)
    output = jnp.einsum("...a,ba->...b", input, weight, preferred_element_type=_accumulator(dtype)).astype(dtype)
    return output if bias is None else output + bias


def embedding(input: jax.Array, weight: jax.Array, padding_idx: int | None = None, *args: Any, **kwargs: Any) -> jax.Array:
    """``torch.nn.functional.embedding`` (inference: ``padding_idx`` only matters to gradients).

    16-bit rows are gathered through an integer view: XLA widens a gather whose result is widened (as every
    decoder's first norm widens its input) by converting the whole table first, hoisted out of the decode
    loop but paid by every call: a float32 copy of the vocabulary, for a few rows.
    """
    if jnp.issubdtype(weight.dtype, jnp.floating) and jnp.finfo(weight.dtype).bits == 16:
        rows = jnp.take(jax.lax.bitcast_convert_type(weight, jnp.uint16), input, axis=0)
        return jax.lax.bitcast_convert_type(rows, weight.dtype)
    return jnp.take(weight, input, axis=0)


def _accumulator(dtype: Any) -> Any:
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32 else None


#: torch functions and the JAX functions hfax lowers them to.
LOWERINGS: dict[Any, Callable[..., jax.Array]] = {
    torch.matmul: matmul,
    torch.Tensor.matmul: matmul,
    torch.Tensor.__matmul__: matmul,
    torch.nn.functional.linear: linear,
    torch.nn.functional.embedding: embedding,
    torch.nn.functional.scaled_dot_product_attention: scaled_dot_product_attention,
}


def _attend_written(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """Attention over keys and values a slot-cache write returned, read around the write (``cache.attend``);
    ``None`` for any other call."""
    from hfax.backends.jax import cache

    if is_causal or dropout_p:
        return None
    return cache.attention(query, key, value, attn_mask, 1 / math.sqrt(query.shape[-1]) if scale is None else scale)


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
