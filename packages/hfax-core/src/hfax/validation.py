"""Checks of what users pass to a model's entry points, before anything compiles.

A compiled program does not bounds-check: an id outside the vocabulary reads another row of the
embedding (``-1`` wraps around) or NaNs, where PyTorch raises. So every entry point checks its ids here
first, with errors that name the argument and the fix. Token ids must be arrays (numpy, torch or JAX),
as transformers' models take tensors: a Python list is refused rather than guessed at.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The forward's arguments that hold token ids of the model's vocabulary.
ID_ARGUMENTS = ("input_ids", "decoder_input_ids")

#: The method a family plugin binds on a model whose forward checks its ``input_ids`` in Python, where its
#: compiled forward cannot: ``check(input_ids)`` gets them as a host (numpy) array before anything
#: compiles, and raises to refuse them. For example, in the plugin's ``hfax_patch_model``::
#:
#:     def check_eos_counts(model, input_ids):
#:         if (input_ids == model.config.eos_token_id).sum() == 0:
#:             raise ValueError("each row must hold an <eos> token")
#:
#:     patcher.bind(model, hfax.validation.CHECK_IDS, check_eos_counts)
CHECK_IDS = "hfax_check_ids"


def host_array(value: Any) -> np.ndarray:
    """A numpy view of a numpy, torch (any device) or JAX array."""
    if hasattr(value, "detach"):  # torch
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def check_ids(name: str, value: Any, vocab_size: int | None) -> None:
    """Token ids: an integer array of shape (batch, length), not empty, inside ``[0, vocab_size)``.

    Raises ``TypeError`` for a list or a bool or float array, ``ValueError`` for a wrong or empty shape and
    ``IndexError`` (as PyTorch's embedding does) for an id outside the vocabulary."""
    if not _is_array(value):
        raise TypeError(
            f"{name} must be an array (numpy, torch or JAX) of shape (batch, length), got a "
            f"{type(value).__name__}; wrap it, e.g. np.array([ids]), or use the tokenizer's "
            "return_tensors='np' / 'pt'"
        )
    try:
        ids = host_array(value)
    except Exception:  # noqa: BLE001 - a value traced by the caller's jax.jit / vmap / grad
        # Its values are unknown while tracing: its type and shape are checked, its range cannot be.
        ids = np.zeros(tuple(value.shape), np.dtype(value.dtype))
        vocab_size = None
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(
            f"{name} must hold integer token ids, got dtype {ids.dtype}; pass the ids the tokenizer made"
        )
    if ids.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, length), got shape {tuple(ids.shape)}")
    if ids.size == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(ids.shape)}); give at least one token per sequence"
        )
    if vocab_size is not None and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        raise IndexError(
            f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size}); "
            "check the tokenizer matches the model"
        )


def check_mask(value: Any, ids_shape: tuple[int, ...] | None) -> None:
    """An attention mask: an array of the ids' shape (or a 4-D mask of the same batch)."""
    if not _is_array(value):
        raise TypeError(
            f"attention_mask must be an array (numpy, torch or JAX), got a {type(value).__name__}"
        )
    shape = tuple(value.shape)
    if ids_shape is None:
        return
    if len(shape) == 4 and shape[0] == ids_shape[0]:
        return  # a custom 4-D mask (batch, heads, query, key): the model checks the rest
    if shape != ids_shape:
        raise ValueError(
            f"attention_mask has shape {shape} but input_ids has {ids_shape}; they must match "
            "(1 for tokens to attend to, 0 for padding)"
        )


def check_forward_inputs(
    inputs: dict[str, Any], vocab_size: int | None, module: Any = None
) -> None:
    """The forward's keyword arguments: token ids and the attention mask that goes with them, and what
    ``module`` (the PyTorch model) checks of its ids in Python, which its compiled forward cannot (the
    :data:`CHECK_IDS` method a family plugin bound on it)."""
    for name in ID_ARGUMENTS:
        if inputs.get(name) is not None:
            check_ids(name, inputs[name], vocab_size)
    if inputs.get("attention_mask") is not None:
        ids = inputs.get("input_ids")
        check_mask(inputs["attention_mask"], tuple(ids.shape) if ids is not None else None)
    check = getattr(module, CHECK_IDS, None)
    if check is not None and inputs.get("input_ids") is not None:
        try:
            ids = host_array(inputs["input_ids"])
        except Exception:  # noqa: BLE001 - traced by the caller's jax.jit: its values are unknown
            return
        check(ids)


def vocab_size(module: Any) -> int | None:
    """How many rows the model's input embedding has, or ``None`` when it has none."""
    try:
        embeddings = module.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return getattr(embeddings, "num_embeddings", None)
