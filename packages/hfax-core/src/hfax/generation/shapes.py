"""Shapes that keep the number of compiled programs small: buckets, padding, and the inputs' checks.

Backend-neutral: numpy and the model's config only. No torch or jax is imported here.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np

from hfax.generation.traits import generation_traits

#: Prompt lengths and new-token counts are padded to powers of two from here, so few programs serve all.
MIN_LENGTH_BUCKET = 16
#: How many tokens a streamer receives at a time (one host sync per chunk).
STREAM_CHUNK = 8


def bucket(n: int, minimum: int) -> int:
    """The smallest power-of-two multiple of ``minimum`` that holds ``n``."""
    size = minimum
    while size < n:
        size *= 2
    return size


def as_ids(name: str, value: Any) -> np.ndarray:
    """Token ids (numpy, torch, JAX, lists) as an int64 ``[batch, length]`` array, or a clear error. A
    mask (``attention_mask``, ``decoder_attention_mask``) may also be floats of 0 and 1, which
    transformers' generate takes too."""
    if hasattr(value, "detach"):  # a torch tensor, on any device
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {array.shape}")
    if array.dtype == np.bool_ and name == "input_ids":
        raise TypeError(f"{name} holds booleans; pass token ids from the tokenizer")
    if (
        array.size
        and not np.issubdtype(array.dtype, np.integer)
        and not np.issubdtype(array.dtype, np.bool_)
    ):
        if name.endswith("mask") and np.issubdtype(array.dtype, np.floating):
            if not np.isin(array, (0.0, 1.0)).all():
                raise ValueError(f"{name} must hold only 0 and 1, got other {array.dtype} values")
        else:
            raise TypeError(
                f"{name} must hold integers, got dtype {array.dtype}; pass token ids from the tokenizer"
            )
    return array.astype(np.int64)


def pad_prompts(
    ids: np.ndarray,
    mask: np.ndarray,
    pad_token_id: int,
    row_multiple: int = 1,
    *,
    length: int | None = None,
    left: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Pad a batch into its bucket: rows to a power of two (times ``row_multiple``), length to ``length`` or
    else a power-of-two multiple of :data:`MIN_LENGTH_BUCKET`, on the left (or the right: an encoder's input,
    whose positions count from its first token). Filler rows repeat row 0 and are discarded after."""
    batch, width = ids.shape
    batch_size = -(-bucket(batch, 1) // row_multiple) * row_multiple
    size = bucket(width, MIN_LENGTH_BUCKET) if length is None else length
    if size < width:
        raise ValueError(f"cannot pad {width} tokens into {size}")
    padded_ids = np.full((batch_size, size), pad_token_id, np.int32)
    padded_mask = np.zeros((batch_size, size), bool)
    columns = slice(size - width, size) if left else slice(0, width)
    padded_ids[:batch, columns], padded_mask[:batch, columns] = ids, mask
    padded_ids[batch:], padded_mask[batch:] = padded_ids[0], padded_mask[0]
    return padded_ids, padded_mask


def accepts(module: Any, argument: str) -> bool:
    """Whether a transformers model's ``forward`` names ``argument`` (``position_ids``, ``logits_to_keep``, ...).

    One reaching only ``**kwargs`` may be ignored: transformers' BART-style decoders take ``position_ids``
    there and count positions from the cache themselves.
    """
    return argument in inspect.signature(module.forward).parameters


#: Forward arguments of caches no hfax engine can stand in for (RWKV's state, XLNet's mems, Reformer's
#: buckets, XLM's dictionary): a model whose forward takes one of these and no transformers ``Cache``.
OTHER_CACHES = ("state", "mems", "use_mems", "cache", "past_buckets_states", "use_cache")


def cache_argument(module: Any, length: int = 0) -> str:
    """The name under which a transformers model's forward takes its cache, whatever the release calls it
    (:func:`hfax.signatures.cache_parameter`: ``past_key_values`` or ``cache_params`` on transformers 5.23,
    ``cache`` on 5.24), or ``""``: the model then reads the prompt and the tokens so far at every step, as
    transformers' ``generate(use_cache=False)`` does. So decodes a model without a cache, and one whose
    decode state a static cache of ``length`` slots cannot hold (:func:`no_static_cache`), which a warning
    says once: each new token then costs a forward over the whole sequence.

    A model that appends a token at every step (its family's
    :attr:`~hfax.generation.traits.GenerationTraits.appended`) re-reads the sequence as transformers'
    ``generate`` for it does. One with a cache of another kind (RWKV's state, XLNet's mems, Reformer's
    buckets) is refused: re-reading the sequence does not give their tokens (nor DeepSeek V4's, whose
    compressed layers the backends refuse). Tested by ``test_a_cache_of_another_kind_is_refused``
    (packages/hfax-jax/tests/test_generate_layers.py)."""
    from hfax.signatures import cache_parameter

    if generation_traits(module).appended is not None:
        return ""  # it re-reads the sequence, as transformers' generate for it does
    name = cache_parameter(module.forward)
    other = [
        argument for argument in OTHER_CACHES if accepts(module, argument) and argument != name
    ]
    if not name and other:
        raise NotImplementedError(
            f"{type(module).__name__} keeps a cache hfax's generate cannot drive (its forward takes {other[0]!r}, "
            "no transformers Cache); run its forward with hfax, or transformers' own generate on CPU"
        )
    reason = name and no_static_cache(module, length)
    if reason:
        warnings.warn(
            f"{type(module).__name__} decodes without a cache: {reason}. Each new token re-reads the whole "
            "sequence, as transformers' generate(use_cache=False) does; long outputs cost more",
            stacklevel=3,
        )
        return ""
    return name


def no_static_cache(module: Any, length: int) -> str:
    """Why no static cache of ``length`` slots can hold ``module``'s decode state; ``""`` when one can.
    Its family says why (:class:`~hfax.generation.traits.GenerationTraits`), or transformers does: a model
    that needs a cache class of its own."""
    traits = generation_traits(module)
    if traits.no_static_cache:
        return traits.no_static_cache
    supports = getattr(type(module), "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        return "it needs a cache class of its own, which transformers does not make static"
    window = traits.local_attention_window
    if window is not None and length > window:
        return (
            f"its local attention layers mask by a table that assumes the cache holds exactly the tokens so "
            f"far, right only within its window_size {window}, and this call needs {length} positions (the "
            f"prompt and the new tokens, each rounded up to a bucket)"
        )
    return ""
