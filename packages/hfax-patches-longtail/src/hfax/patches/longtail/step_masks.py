"""The mask over a static cache's slots, for decoders that apply none to a cached step (LED's one-token
steps: :mod:`hfax.patches.longtail.led`; FSMT's every cached step: :mod:`hfax.patches.longtail.fsmt`).

transformers' dynamic cache returns exactly the tokens so far, so attending to every key it returns is
right there. hfax's static cache returns all its slots, the ones not yet written (and a padded batch's
padding) among them, and attending to those changes the tokens. hfax passes the decoder a mask over the
slots (``[batch, 1, queries, slots]``, or 2-D with one flag per slot); the decoder's patched forward keeps
it, with the cache's count (:data:`SLOTS`), for its layers, which get it as an additive mask
(:func:`additive`).
"""

from __future__ import annotations

from typing import Any

#: The attribute of a decoder's self-attention modules that holds, during one decoder forward, the
#: decoder's mask over the cache's slots (2-D or 4-D) and how many slots the cache had written before it
#: (:func:`written`). An attribute rather than a context variable: torch_xla's dynamo bridge traces
#: attribute writes and not ``ContextVar.set``.
SLOTS = "_hfax_step_mask"


def written(cache: Any) -> Any:
    """How many slots of the decoder's self-attention ``cache`` hold tokens before this step (the slot the
    step's token fills): read before the first layer writes, or ``None`` without a cache."""
    if cache is None:
        return None
    cache = getattr(cache, "self_attention_cache", cache)  # an encoder-decoder's
    return cache.get_seq_length()


def additive(over_slots: Any, queries: int, dtype: Any) -> Any:
    """``(mask, written)``, a mask over a static cache's slots and :func:`written`, as an additive
    ``[batch, 1, queries, slots]`` mask of ``dtype``: a 4-D mask as it is (boolean or additive); a 2-D one
    (a flag per slot: not padding, whether written yet or not) for a one-token step, which sees the
    written slots and its own. ``None`` for anything else."""
    import torch

    slots, count = over_slots if over_slots is not None else (None, None)
    if slots is None or slots.dim() not in (2, 4):
        return None
    if slots.dim() == 2:
        if queries != 1 or count is None:
            return None
        filled = torch.arange(slots.shape[1], device=slots.device) <= count
        slots = (slots.bool() & filled)[:, None, None, :]
    if not slots.is_floating_point():  # True where a query may look
        slots = torch.where(slots.bool(), 0.0, torch.finfo(dtype).min)
    return slots.to(dtype)
