"""A language model's forward over token ids, padded into a bucket shape, and its logits cut back.

Evaluation harnesses (lm-evaluation-harness's ``HFLM`` scores every choice of a multiple-choice task with
``model(input_ids).logits``) call the forward with a new ``[batch, length]`` at nearly every call, and a
compiled forward is one program per shape. :func:`padded` pads such a call's ``input_ids`` on the right
into ``[power of two, bucket(length, 16)]`` (the buckets ``generate``'s prompts use) with an
``attention_mask`` that is 0 on the padding, and repeats the first row into the padded rows; :func:`cut`
takes the caller's ``[batch, length]`` back out of the logits. A decoder language model's logits at a real
position are those it gives the call unpadded: its attention is causal, so no real position sees a later
one, and the mask hides the padding from models that attend both ways. The coverage sweep's compiled
forward column (``tools/coverage.py``, jit) checks this against transformers for every causal
architecture, and ``tests/test_forward_buckets.py`` checks the shapes and values.

Only calls that give ``input_ids`` and at most an ``attention_mask`` (and flags that keep the output to
the logits) are padded; anything else runs at its own shape, and so does every call of a model whose family
says its logits change when padded on the right (``GenerationTraits.no_forward_padding``: CPM-Ant reads
the last non-zero ids as its tokens). A model whose padded output holds more than logits (router logits, a
loss, a cache) is run at the call's own shape again and not padded after that.

Backend-neutral: numpy only.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np

from hfax.generation.shapes import MIN_LENGTH_BUCKET, bucket
from hfax.generation.traits import answered_traits

#: Inputs a padded call may hold: token ids, their mask, and flags that leave the output its logits.
TAKEN = frozenset({"input_ids", "attention_mask", "use_cache", "return_dict"})


@dataclasses.dataclass(frozen=True)
class Padding:
    """The caller's ``rows`` and ``length`` inside a padded call."""

    rows: int
    length: int


def pads(module: Any, inputs: dict[str, Any]) -> bool:
    """Whether the call ``module(**inputs)`` is padded: a decoder language model (not an
    encoder-decoder) given 2-D token ids, an optional mask of their shape, no cache filled."""
    config = module.config
    if getattr(config, "is_encoder_decoder", False) or not module.can_generate():
        return False
    if not set(inputs) <= TAKEN or "input_ids" not in inputs:
        return False
    if inputs.get("use_cache") or inputs.get("return_dict") is False:
        return False
    if getattr(config, "output_router_logits", False):
        return False  # the auxiliary loss and router logits count the padding's tokens
    ids = _host(inputs["input_ids"])
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        return False
    mask = inputs.get("attention_mask")
    if mask is not None and tuple(np.shape(mask)) != ids.shape:
        return False
    return _family_pads(module)


#: Per model, whether its family lets its forward be padded (a model's traits do not change).
_FAMILY_PADS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _family_pads(module: Any) -> bool:
    """Whether no family says ``module``'s logits change when padded, asked of the plugins once per model
    (the forward is a hot path)."""
    if module not in _FAMILY_PADS:
        _FAMILY_PADS[module] = not answered_traits(module).no_forward_padding
    return _FAMILY_PADS[module]


def padded(inputs: dict[str, Any]) -> tuple[dict[str, Any], Padding]:
    """``inputs`` with host numpy ``input_ids`` and ``attention_mask`` padded as the module docstring
    says, and where the caller's call sits in them."""
    ids = _host(inputs["input_ids"])
    rows, length = ids.shape
    mask = inputs.get("attention_mask")
    mask = np.ones_like(ids) if mask is None else _host(mask).astype(ids.dtype)
    shape = (1 << max(rows - 1, 0).bit_length(), bucket(length, MIN_LENGTH_BUCKET))
    big_ids = np.zeros(shape, ids.dtype)
    big_mask = np.zeros(shape, ids.dtype)
    big_ids[:rows, :length], big_mask[:rows, :length] = ids, mask
    big_ids[rows:], big_mask[rows:] = big_ids[0], big_mask[0]
    return {**inputs, "input_ids": big_ids, "attention_mask": big_mask}, Padding(rows, length)


def cut(output: Any, padding: Padding) -> Any | None:
    """``output`` with its logits cut to the caller's rows and length, or ``None`` where it holds
    anything else (then the call runs again at its own shape)."""
    held = (
        [name for name, value in output.items() if value is not None]
        if hasattr(output, "items")
        else []
    )
    if held != ["logits"]:
        return None
    return type(output)(logits=output["logits"][: padding.rows, : padding.length])


def _host(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)
