"""A caller's cache read into the engine's own: which caches load, and which of the prompt's columns each
of their layers holds.

transformers' ``generate`` continues from a caller's ``Cache`` by reading it: its prefill feeds only the
tokens after the cached ones, which attend over the cache's keys and values. An engine with the
``"cache_input"`` feature does the same: :func:`held_layers` reads every layer's keys and values on the
host, :func:`placed` puts them at the prompt's cached columns in the engine's bucket, and the engine
writes them into its static cache before it prefills the tokens after them (:class:`Resume`). So a cache
over an image's tokens continues without the image, as in transformers.

Loaded (:func:`why_not_loaded` says why another is not): a model whose cache layers all hold keys and
values (transformers' full and sliding attention layers) and whose prompt is ids, with no other inputs
than those laid out like them (token types); the caller's cache made of transformers' dynamic or static
key/value layers. An encoder-decoder's decoder self-attention part is loaded so (its prompt is
``decoder_input_ids``, its source goes to the encoder); the cross-attention part the prefill computes
again from the source, and the driver checks the caller's, where filled, holds the same. A sliding layer of transformers' keeps only its window (its last
``sliding_window - 1`` tokens); they go to the columns they came from, the earlier ones stay empty, which
the sliding mask never reads. Anything else keeps the engine's other path: its prefill computes the cached
tokens again from the ids and the driver checks the cache holds them (:mod:`hfax.generation.driver`).
Tested by ``test_a_callers_cache_is_loaded_as_transformers_reads_it`` (tests/test_generate_features.py)
and ``test_a_cache_over_an_image_continues_without_the_image`` (packages/hfax-jax/tests).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hfax.generation import inputs as model_inputs
from hfax.generation import shapes

#: The cache layer types whose keys and values :func:`held_layers` reads (``get_layer_types_and_kwargs``).
LOADED_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class HeldLayer:
    """One layer's keys and values ``[rows, kv_heads, tokens, head_dim]`` (float32, which holds 16-bit
    values exactly), the tokens of consecutive columns from ``first``: of the caller's prompt as
    :func:`held_layers` reads them, of the engine's bucket once :func:`placed`."""

    keys: np.ndarray
    values: np.ndarray
    first: int


@dataclasses.dataclass(frozen=True)
class Resume:
    """What an engine with ``"cache_input"`` loads before its prefill: ``layers`` in the model's layer order,
    each over all of the bucket's columns from column 0 (zeros where it holds nothing), rows as the
    bucket's. The prefill feeds the bucket's last ``fed`` columns, a length bucket of the tokens after the
    cache: those from ``start`` on are new; before ``start`` the loaded keys and values stay as they are
    (the fed tokens there only fill the window). So the program's shapes are the prompt's bucket and
    ``fed``, whatever the cached length (``start`` is traced)."""

    start: int
    fed: int
    layers: tuple[HeldLayer, ...]


def why_not_loaded(
    module: Any,
    cache: Any,
    inputs: dict[str, np.ndarray],
    ids: np.ndarray,
    cached: int,
    embedded: bool,
    layer_outputs: bool,
) -> str:
    """Why the caller's ``cache`` of the prompt's first ``cached`` tokens is not loaded into the engine's
    (``""`` when it is): see the module's docstring. ``inputs`` are the call's other model inputs,
    ``embedded`` whether the prompt ``ids`` stand for ``inputs_embeds``, ``layer_outputs`` whether the call
    records hidden states or attentions (whose first step would be the tokens fed, transformers' shape,
    where the other path gives the whole prompt's).

    A model with multimodal rotary positions (``get_rope_index``) loads a cache over images when the call
    gives what places them (``image_grid_thw`` and the processor's ``mm_token_type_ids``, the pixels
    being in the cache), as transformers computes the prompt's positions from those alone; the tokens
    after the cache then hold no image."""
    from transformers import cache_utils

    from hfax.signatures import cache_parameter

    cache = getattr(cache, "self_attention_cache", cache)  # an encoder-decoder's decoder part
    if embedded:
        return "the prompt is inputs_embeds"
    if layer_outputs:
        return "the call records hidden states or attentions of the whole prompt"
    rope = model_inputs.rope_index(module) is not None
    grids = {name for name in inputs if rope and name.endswith("grid_thw")}  # they place positions
    aligned = model_inputs.row_aligned(inputs, ids.shape)
    others = sorted(
        name
        for name in inputs
        if (name not in aligned or name == "position_ids") and name not in grids
    )
    if others:
        return f"the call passes {', '.join(others)}"
    if rope and model_inputs.media_placeholders(module.config, ids):
        missing = model_inputs.rope_inputs_missing(module, inputs)
        if not grids or missing:
            return (
                "the model's positions are multimodal (get_rope_index), which the cached media "
                f"decide, and the call does not pass {', '.join(sorted(missing) or ['their grids'])}"
            )
        if model_inputs.media_placeholders(module.config, ids[:, cached:]):
            return "the tokens after the cached ones hold media placeholders"
    if not cache_parameter(module.forward):
        return "the model decodes without a cache"
    try:
        types, _ = cache_utils.get_layer_types_and_kwargs(
            module.config.get_text_config(decoder=True)
        )
    except Exception:  # noqa: BLE001 - configs without per-layer information
        return "the model's config does not say its cache layers"
    other = sorted(set(types) - set(LOADED_TYPES))
    if other:
        return f"the model has {other[0]} cache layers, not keys and values only"
    if len(cache.layers) != len(types):
        return f"it has {len(cache.layers)} layers and the model {len(types)}"
    kinds = sorted({type(layer).__name__ for layer in cache.layers} - set(_READERS))
    if kinds:
        return f"it holds {kinds[0]} layers"
    return ""


def held_layers(module: Any, cache: Any, cached: int) -> tuple[HeldLayer, ...]:
    """Every layer's keys and values as the caller's ``cache`` holds them (not changed), with the prompt
    column of their first token; a ``ValueError`` before anything compiles where a layer does not hold
    the tokens the new ones attend to (all ``cached`` of them, or a sliding layer's last
    ``sliding_window - 1``) or its shapes are not the model's."""
    from transformers import cache_utils

    config = module.config.get_text_config(decoder=True)
    _, options = cache_utils.get_layer_types_and_kwargs(config)
    heads = getattr(config, "num_key_value_heads", None) or getattr(
        config, "num_attention_heads", None
    )
    held = []
    for index, (layer, option) in enumerate(zip(cache.layers, options)):
        if getattr(layer, "keys", None) is None:
            raise ValueError(
                f"past_key_values' layer {index} holds nothing where its cache holds {cached} tokens: "
                "pass a cache as transformers makes it (an earlier result's past_key_values)"
            )
        keys, values, count = _READERS[type(layer).__name__](layer)
        window = option.get("sliding_window")
        needed = cached if window is None else min(cached, window - 1)
        if count > cached or count < needed:
            raise ValueError(
                f"past_key_values' layer {index} holds {count} tokens where its cache holds {cached} "
                f"and the tokens after them attend to the last {needed}: pass a cache as transformers "
                "makes it (an earlier result's past_key_values, not one cut or mixed)"
            )
        if isinstance(heads, int) and keys.shape[1] != heads:
            raise ValueError(
                f"past_key_values' layer {index} has {keys.shape[1]} key/value heads and "
                f"{type(module).__name__} {heads}: pass a cache this model made"
            )
        held.append(HeldLayer(_host(keys), _host(values), cached - count))
    return tuple(held)


def placed(held: tuple[HeldLayer, ...], cached: int, width: int, prompt: int, rows: int) -> Resume:
    """``held`` moved into the engine's bucket: a caller's prompt of ``width`` columns ends at the
    bucket's ``prompt``, each layer laid over the bucket's columns; rows beyond the held ones (the bucket's
    filler) repeat row 0, as the filler ids do (:func:`hfax.generation.shapes.pad_prompts`). The columns
    fed are the length bucket of the ``width - cached`` new tokens (at most the whole bucket)."""
    shift = prompt - width

    def laid(array: np.ndarray, first: int) -> np.ndarray:
        extra = rows - array.shape[0]
        if extra:
            array = np.concatenate([array, np.repeat(array[:1], extra, 0)])
        before, after = first + shift, prompt - first - shift - array.shape[2]
        return np.pad(array, ((0, 0), (0, 0), (before, after), (0, 0)))

    layers = tuple(
        HeldLayer(laid(layer.keys, layer.first), laid(layer.values, layer.first), 0)
        for layer in held
    )
    fed = min(shapes.bucket(width - cached, shapes.MIN_LENGTH_BUCKET), prompt)
    return Resume(shift + cached, fed, layers)


def expanded(held: tuple[HeldLayer, ...], expand: int) -> tuple[HeldLayer, ...]:
    """Each row ``expand`` times in a row, as the prompt's rows for beams or returned sequences."""
    if expand == 1:
        return held
    return tuple(
        HeldLayer(np.repeat(h.keys, expand, 0), np.repeat(h.values, expand, 0), h.first)
        for h in held
    )


def _host(tensor: Any) -> np.ndarray:
    return tensor.detach().to("cpu").float().numpy().copy()


def _dynamic(layer: Any) -> tuple[Any, Any, int]:
    """A dynamic layer holds its latest tokens whole (a sliding one its window's)."""
    return layer.keys, layer.values, layer.keys.shape[2]


def _static(layer: Any) -> tuple[Any, Any, int]:
    """A static layer holds its first ``get_seq_length()`` slots; a static sliding one, once more tokens
    came than its slots, its latest tokens in all of them, in order."""
    count = min(int(layer.get_seq_length()), layer.keys.shape[2])
    return layer.keys[:, :, :count], layer.values[:, :, :count], count


#: How each of transformers' key/value cache layers is read, by class name: ``(keys, values, tokens)``.
_READERS = {
    "DynamicLayer": _dynamic,
    "DynamicSlidingWindowLayer": _dynamic,
    "StaticLayer": _static,
    "StaticSlidingWindowLayer": _static,
}
