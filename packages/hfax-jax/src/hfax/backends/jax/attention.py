"""Attention computed by ``jax.nn.dot_product_attention``, registered with transformers as ``"hfax_jax"``.

Why: transformers' default, ``"sdpa"``, hands masks to ``torch.nn.functional.scaled_dot_product_attention``
as booleans, whose JAX lowering (torchax's, and hfax's own in ``lowerings.py``) sets a masked-out score
to ``-inf``. A query that may see no key (every
padding position of a left-padded batch) then gets a softmax of ``-inf`` only: NaN, which flows through
the padding keys of the next layer into every real token of that row. PyTorch gives finite values there.
Here masks are additive and finite (transformers' ``eager_mask``, or hfax's own in ``generate``), logits
and softmax are float32, and grouped key/value heads are attended without repeating them. A query that
may see no key gets zeros, which is what PyTorch's ``scaled_dot_product_attention`` gives it (an additive
mask alone would average every value there): a left-padded batch's padding positions then hold what
transformers' sdpa computes, and a loss that reads their logits (the first real token's label is
predicted from the last padding position) is transformers'. Keys and values
fresh from hfax's slot cache are read around the cache write (:func:`around_write_attention`), which lets the
decode loop update the cache in place.

transformers picks a model's attention function by name (``config._attn_implementation``) from its
``AttentionInterface`` registry. A family plugin switches the models it has tested to this one with
:func:`switch`, on the model's own config through the :class:`~hfax.Patcher`; other models keep theirs.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import torch

from hfax.backends.jax import cache
from hfax.backends.jax.runtime import torchax

#: The name models are switched to (``config._attn_implementation``).
NAME = "hfax_jax"


def _attend(
    query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None, **options: Any
) -> jax.Array:
    """``query [B, N, T, H]`` and ``key``/``value`` ``[B, K, S, H]`` (transformers' layout) -> ``[B, T, N, H]``."""
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # jax's layout: [B, T, heads, H]
    if mask is None:
        return jax.nn.dot_product_attention(q, k, v, **options)
    if mask.dtype == jnp.bool_:
        mask = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
    output = jax.nn.dot_product_attention(
        q, k, v, bias=mask.astype(jnp.float32), scale=options["scale"]
    )
    return jnp.where(jnp.swapaxes(_sees_a_key(mask), 1, 2), output, 0)


def _sees_a_key(mask: jax.Array) -> jax.Array:
    """``[B, 1 or N, T, 1]``: whether each query of an additive ``mask`` may see any key (torch's sdpa
    gives zeros to one that may not)."""
    return jnp.any(mask > jnp.finfo(jnp.float32).min / 2, axis=-1, keepdims=True)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract, computed in JAX on torchax tensors.

    ``attention_mask`` is an additive (or boolean) ``[B, 1 or N, T, S]`` mask; without one, causality and
    ``sliding_window`` are applied here, as ``sdpa`` would.
    """
    if dropout:
        raise ValueError(
            f"hfax_jax attention runs inference only, got dropout={dropout}; call model.eval() first"
        )
    if kwargs.get("softcap") is not None:
        raise ValueError(
            "hfax_jax attention has no logit soft-capping; keep this model on eager attention"
        )
    options: dict[str, Any] = {"scale": scaling if scaling is not None else query.shape[-1] ** -0.5}
    around_write = around_write_attention(
        query, key, value, attention_mask, options["scale"], sliding_window
    )
    if around_write is not None:
        return around_write.transpose(1, 2), None
    if sliding_window and attention_mask is not None and query.shape[2] == 1:
        key, value, attention_mask = _window_of_one_slot(key, value, attention_mask, sliding_window)
    if attention_mask is None:
        causal = (
            is_causal if is_causal is not None else getattr(module, "is_causal", True)
        ) and query.shape[2] > 1
        options["is_causal"] = causal
        if causal and sliding_window:
            options["local_window_size"] = (
                sliding_window - 1,
                0,
            )  # transformers' window counts the query itself
    output = torchax.interop.call_jax(
        lambda q, k, v, m: _attend(q, k, v, m, **options), query, key, value, attention_mask
    )
    return output, None


def register() -> None:
    """Register ``"hfax_jax"`` with transformers' attention and mask registries (idempotent).

    Its mask function is transformers' ``eager_mask``, which always materialises an additive mask, so a
    forward outside hfax's ``generate`` still gets causal, sliding-window and padding masking.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, eager_mask)


def switch(model: torch.nn.Module, patcher: Any) -> None:
    """Attend through ``"hfax_jax"`` where ``model``'s decoder uses transformers' default, ``"sdpa"``.

    An attention the user chose (``attn_implementation="eager"``) is kept. Only for models whose attention
    modules follow the attention-function contract with nothing model-specific beside it (no soft-capping,
    sinks or position biases): a family plugin vouches for that with a parity test. Recorded by
    ``patcher``, undone by ``hfax.unpatch``.
    """
    config = (
        model.config.get_text_config()
    )  # the decoder's (Gemma 3's text_config in a multimodal model)
    if config._attn_implementation != "sdpa":
        return
    register()
    # Set beneath the `_attn_implementation` property, whose setter would also switch every sub-config
    # (a vision tower's attention, which this does not vouch for).
    patcher.setattr(config, "_attn_implementation_internal", NAME)


def around_write_attention(
    query: torch.Tensor, key: Any, value: Any, mask: Any, scale: float, window: int | None = None
) -> torch.Tensor | None:
    """:func:`attend` for torchax tensors, when ``key`` and ``value`` are what a ``SlotLayer`` returned and a mask
    is given; ``None`` otherwise (the caller attends over ``key`` and ``value`` as they are). ``window``
    is the layer's sliding window (``None``: full attention)."""
    keys, values = cache.written(key), cache.written(value)
    if keys is None or values is None or mask is None:
        return None
    return torchax.interop.call_jax(
        functools.partial(attend, scale=scale, window=window), query, keys, values, mask
    )


def attend(
    query: jax.Array,
    keys: cache.Written,
    values: cache.Written,
    mask: jax.Array,
    scale: float,
    window: int | None = None,
) -> jax.Array:
    """Attention of ``query`` over a slot cache write, reading no buffer the write produced.

    ``query`` is ``[batch, heads, q, head_dim]`` (a multiple of the key/value heads, grouped as transformers'
    ``repeat_kv`` groups them); ``keys``/``values`` hold JAX arrays; ``mask`` is additive and broadcasts to
    ``[batch, heads, q, length]``. The slots being written are read from the new states, the others from
    the buffers as they were. Returns ``[batch, heads, q, head_dim]``.

    A decode step (one slot written) of a layer with a sliding ``window`` shorter than the buffers reads
    only the ``window`` slots that end at the written one (:func:`_last_slots`): its mask hides every
    other slot (transformers' window, ``masks.build``'s: a query sees the keys less than ``window`` slots
    before it), so long rows cost a sliding layer what its window costs.
    """
    one_step = keys.states.shape[2] == 1 and keys.before is not None
    if one_step and window is not None and window < mask.shape[-1]:
        keys, values, mask = _last_slots(keys, values, mask, window)
    batch, heads, length_q, dim = query.shape
    new_keys, new_values, slot = keys.states, values.states, keys.slot
    kv_heads, written = new_keys.shape[1], new_keys.shape[2]
    groups = heads // kv_heads
    # Grouped heads share their key/value head: attend with [batch, kv_heads, groups * q] queries, no repeat.
    q = query.reshape(batch, kv_heads, groups * length_q, dim)
    if mask.dtype == jnp.bool_:
        mask = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
    sees = jnp.broadcast_to(_sees_a_key(mask), (batch, heads, length_q, 1))
    mask = jnp.broadcast_to(mask, (batch, heads, length_q, mask.shape[-1])).reshape(
        batch, kv_heads, groups * length_q, -1
    )
    scores = [
        jnp.einsum("bkqd,bknd->bkqn", q, new_keys, preferred_element_type=jnp.float32) * scale
        + jax.lax.dynamic_slice_in_dim(mask, slot, written, axis=-1)
    ]
    if keys.before is not None:
        slots = jnp.arange(mask.shape[-1])
        stale = (slots >= slot) & (
            slots < slot + written
        )  # what the buffers held there is being replaced
        old = (
            jnp.einsum("bkqd,bkdl->bkql", q, keys.before, preferred_element_type=jnp.float32)
            * scale
        )
        scores.insert(0, jnp.where(stale, jnp.finfo(jnp.float32).min, old + mask))
    weights = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(new_values.dtype)
    output = jnp.einsum(
        "bkqn,bknd->bkqd", weights[..., -written:], new_values, preferred_element_type=jnp.float32
    )
    if values.before is not None:
        output += jnp.einsum(
            "bkql,bkld->bkqd",
            weights[..., :-written],
            values.before,
            preferred_element_type=jnp.float32,
        )
    output = output.astype(query.dtype).reshape(batch, heads, length_q, dim)
    return jnp.where(sees, output, 0)


def _window_of_one_slot(key: Any, value: Any, mask: Any, window: int) -> tuple[Any, Any, Any]:
    """``key``/``value`` buffers (``[batch, kv_heads, length, head_dim]``) that a ``SlotLayer`` returned
    with one slot written (not in place: on a mesh, or beside layers that are not attention), and the
    one query's ``mask``, cut to the ``window`` slots that end at that slot, as :func:`_last_slots` cuts
    them in place; unchanged when the buffers are no such write or hold no more than the window."""
    slot = cache.one_slot(key)
    if slot is None or window >= key.shape[2] or mask.shape[-1] != key.shape[2]:
        return key, value, mask

    def cut(k: jax.Array, v: jax.Array, m: jax.Array, at: jax.Array) -> Any:
        part = _window_ending_at(at, window, k.shape[2])[1]
        return part(k, axis=2), part(v, axis=2), part(m, axis=-1)

    return torchax.interop.call_jax(cut, key, value, mask, slot)


def _window_ending_at(slot: Any, window: int, length: int) -> tuple[Any, Any]:
    """The first of the ``window`` slots (of ``length``) that end at ``slot``, from slot 0 while fewer
    precede it, and a slicer of them along an ``axis``: the cut both window paths make."""
    start = jnp.clip(slot - window + 1, 0, length - window)
    return start, functools.partial(
        jax.lax.dynamic_slice_in_dim, start_index=start, slice_size=window
    )


def _last_slots(
    keys: cache.Written, values: cache.Written, mask: jax.Array, window: int
) -> tuple[cache.Written, cache.Written, jax.Array]:
    """The write of one slot with its buffers and ``mask`` cut to the ``window`` slots that end at it (from
    slot 0 while fewer precede it); the slot is then counted from the cut's start. Keys are stored
    ``[batch, kv_heads, head_dim, length]`` here, values ``[batch, kv_heads, length, head_dim]``."""
    start, cut = _window_ending_at(keys.slot, window, mask.shape[-1])
    keys = cache.Written(cut(keys.before, axis=3), keys.states, keys.slot - start)
    values = cache.Written(cut(values.before, axis=2), values.states, values.slot - start)
    return keys, values, cut(mask, axis=-1)
