"""A ``generate`` call's model inputs beyond the prompt's ids: images, audio, their sizes and token types.

A processor's output goes to ``generate`` as it is (``model.generate(**processor(...))``): every keyword that
``forward`` names and that is not a generation setting is a model input. On the host they are numpy arrays;
the engine runs them through the model once, in prefill (an image's or an audio clip's encoder runs there),
and the decode loop is the text loop. Three things need more than passing them on, and transformers' own
methods do them here:

* a model with multimodal rotary positions (Qwen2-VL's ``get_rope_index``) gets its prompt's positions and
  each row's offset for the tokens after it computed on the host;
* an encoder-decoder whose images reach its encoder as embeddings (Florence-2: the encoder takes text
  embeddings only) has them merged at their placeholder tokens before its encoder runs (:func:`encode`);
* ``num_beams`` / ``num_return_sequences`` repeat the inputs that have one entry per prompt.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

#: Why ``generate`` does not take a cache other than a transformers ``Cache`` (:func:`callers_cache`).
CACHE_REFUSED = (
    "hfax's generate keeps its own cache on device and takes a caller's only as a transformers Cache "
    "(an earlier result's past_key_values)"
)

#: Forward inputs ``generate`` does not take, with why (the cache besides, by its type).
REFUSED_INPUTS = {
    "cache_position": "hfax's generate places tokens in its own cache",
    "encoder_outputs": "hfax's generate runs the encoder itself, in prefill; pass the encoder's inputs",
    "decoder_inputs_embeds": "hfax's generate starts from token ids",
    "labels": "generate computes no loss",
}


#: Generation settings transformers also hands back as model keyword arguments (its
#: ``_prepare_generation_config`` keeps them for ``forward``): read from the config, not inputs.
PASSED_ON_SETTINGS = frozenset({"output_attentions", "output_hidden_states"})


def callers_cache(module: Any, leftovers: dict[str, Any]) -> Any:
    """The cache the caller handed ``generate`` (under the name the model's forward gives it, or
    ``past_key_values``), taken out of ``leftovers``: a transformers ``Cache`` (an ``EncoderDecoderCache``
    for an encoder-decoder, another one for a decoder-only model), or ``None``; anything else is refused,
    naming why."""
    from transformers.cache_utils import Cache, EncoderDecoderCache

    from hfax.signatures import cache_parameter

    # transformers 5.24 names it ``cache`` and still takes ``past_key_values``, deprecated.
    names = {cache_parameter(module.forward), "past_key_values"} - {""}
    given = [
        value
        for value in (leftovers.pop(name, None) for name in sorted(names))
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(f"pass one cache, as {' or '.join(sorted(names))}, not several")
    cache = given[0] if given else None
    if cache is None:
        return None
    if not isinstance(cache, Cache):
        raise NotImplementedError(
            f"hfax's generate does not take a {type(cache).__name__} cache: {CACHE_REFUSED}"
        )
    encoder_decoder = bool(getattr(module.config, "is_encoder_decoder", False))
    if isinstance(cache, EncoderDecoderCache) != encoder_decoder:
        wanted = "an EncoderDecoderCache" if encoder_decoder else "a decoder-only model's cache"
        raise ValueError(
            f"{type(module).__name__} takes {wanted} (an earlier result's past_key_values), not a "
            f"{type(cache).__name__}"
        )
    return cache


def collect(module: Any, leftovers: dict[str, Any]) -> dict[str, np.ndarray]:
    """The model inputs among what transformers left over from the generation settings, as numpy arrays;
    anything else is an error naming it."""
    accepted = set(inspect.signature(module.forward).parameters)
    refused = REFUSED_INPUTS  # the cache is taken out before (callers_cache)
    found = {}
    for name in sorted(set(leftovers) - PASSED_ON_SETTINGS):
        value = leftovers[name]
        if name not in accepted:
            raise TypeError(
                f"generate() got an unexpected keyword argument {name!r}: it is neither a GenerationConfig "
                f"field nor an input of {type(module).__name__}.forward (hfax also takes streamer, seed, "
                "rng, generation_config and tokenizer)"
            )
        if name in refused and value is not None:
            raise NotImplementedError(f"hfax's generate does not take {name}: {refused[name]}")
        if value is not None:
            found[name] = host_array(name, value)
    return found


def host_array(name: str, value: Any) -> np.ndarray:
    """A model input (numpy, torch, JAX, nested lists) as a numpy array, or an error naming it."""
    if hasattr(value, "detach"):  # a torch tensor, on any device; numpy has no bfloat16 of torch's
        value = value.detach().cpu()
        value = value.float() if value.dtype.is_floating_point and value.itemsize < 4 else value
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype == object or not (
        np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)
    ):
        raise TypeError(
            f"generate's model input {name} must be an array of numbers (as a processor returns it), "
            f"got {type(value).__name__}"
        )
    return array.astype(np.int64) if np.issubdtype(array.dtype, np.integer) else array


def expand(inputs: dict[str, np.ndarray], batch: int, size: int) -> dict[str, np.ndarray]:
    """``inputs`` for ``size`` rows per row (beams, returned sequences): each input with one entry per row
    repeats it. An input of another length (Qwen2-VL's image patches, several images per prompt) would need
    its entries grouped by prompt, which transformers does on the encoder's output: it is refused."""
    for name, value in inputs.items():
        if value.shape[0] != batch:
            raise NotImplementedError(
                f"hfax's generate repeats model inputs for num_beams / num_return_sequences only when they "
                f"have one entry per prompt; {name} has {value.shape[0]} for {batch} prompts. Use "
                "num_beams=1 and num_return_sequences=1, or call generate once per prompt and image"
            )
    return {name: np.repeat(value, size, axis=0) for name, value in inputs.items()}


def row_aligned(inputs: dict[str, np.ndarray], shape: tuple[int, ...]) -> set[str]:
    """The inputs laid out like the prompt's ids (``token_type_ids``, ``mm_token_type_ids``: one value per
    token; ``inputs_embeds``: one vector per token), padded and bucketed with them."""
    return {
        name
        for name, value in inputs.items()
        if value.shape == tuple(shape) or (name == "inputs_embeds" and value.shape[:2] == shape)
    }


def rope_index(module: Any) -> Callable[..., Any] | None:
    """The model's ``get_rope_index`` (multimodal rotary positions: Qwen2-VL and its kin), or ``None``."""
    for owner in (module, getattr(module, "model", None)):
        function = getattr(owner, "get_rope_index", None)
        if callable(function):
            return function
    return None


#: Config fields naming the placeholder token of an image, a video or a clip in a multimodal prompt.
MEDIA_TOKENS = ("image_token_id", "video_token_id", "audio_token_id")


def media_placeholders(config: Any, ids: np.ndarray) -> list[str]:
    """The :data:`MEDIA_TOKENS` fields of ``config`` whose placeholder token ``ids`` hold."""
    return [
        name
        for name in MEDIA_TOKENS
        if isinstance(getattr(config, name, None), int) and (ids == getattr(config, name)).any()
    ]


def rope_inputs_missing(module: Any, inputs: dict[str, Any]) -> set[str]:
    """What the model's ``get_rope_index`` needs that ``inputs`` (with the ids and mask) lack: where any,
    transformers' generate gives the prompt its text positions (:func:`positions` does too)."""
    function = rope_index(module)
    if function is None:
        return set()
    required = {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    return required - {*inputs, "input_ids", "attention_mask"}


def positions(
    module: Any, ids: np.ndarray, mask: np.ndarray, inputs: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The prompt's multimodal positions ``[sections, rows, length]`` and each row's offset for the tokens
    after it (a new token's position is its index among the row's real tokens plus the offset), computed by
    the model's own ``get_rope_index`` on the bucketed prompt; ``None`` for a model without one or a prompt
    without images or videos (its positions are the plain ones)."""
    import torch

    function = rope_index(module)
    if function is None or not any(name.endswith("grid_thw") for name in inputs):
        return None
    accepted = inspect.signature(function).parameters
    if rope_inputs_missing(module, inputs):
        # transformers' generate too: without the processor's token types (mm_token_type_ids) it gives
        # the prompt its text positions (its _prepare_position_ids_for_generation)
        return None
    arguments = {
        name: torch.from_numpy(np.ascontiguousarray(value))
        for name, value in {**inputs, "input_ids": ids, "attention_mask": mask}.items()
        if name in accepted
    }
    arguments["attention_mask"] = arguments["attention_mask"].long()
    arguments["input_ids"] = arguments["input_ids"].long()
    with torch.no_grad():
        position_ids, deltas = function(**arguments)
    return position_ids.numpy().astype(np.int32), deltas.reshape(-1).numpy().astype(np.int32)


def with_positions(module: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """A forward's ``inputs`` with the multimodal positions of :func:`positions` added (host numpy), where
    the model has them and the caller gave none: the model computes them in Python, which a trace cannot."""
    grids = any(name.endswith("grid_thw") for name in inputs)
    if (
        not grids
        or rope_index(module) is None
        or "position_ids" in inputs
        or "input_ids" not in inputs
    ):
        return inputs
    arrays = {
        name: host_array(name, value)
        for name, value in inputs.items()
        if hasattr(value, "shape") and not isinstance(value, (bool, int, float))
    }
    ids = arrays["input_ids"]
    mask = arrays.get("attention_mask", np.ones_like(ids))
    found = positions(module, ids, mask, arrays)
    return inputs if found is None else {**inputs, "position_ids": found[0]}


def merges_images(module: Any) -> bool:
    """Whether ``module`` is an encoder-decoder whose encoder takes no ``pixel_values`` but which merges an
    image's features into the encoder's input embeddings itself (``get_image_features`` and
    ``get_placeholder_mask``, as Florence-2 does in its forward and in its ``generate``)."""
    encoder = module.get_encoder()
    return (
        "pixel_values" not in inspect.signature(encoder.forward).parameters
        and callable(getattr(module, "get_image_features", None))
        and callable(getattr(module, "get_placeholder_mask", None))
    )


def encode(module: Any, source: dict[str, Any]) -> Any:
    """An encoder-decoder's encoder run on its inputs by name (torch tensors), as transformers' ``generate``
    runs it: where the encoder takes no images (:func:`merges_images`), the image features replace the
    image tokens' embeddings first and the encoder reads the embeddings. The caller's ``inputs_embeds``
    (float32 from the host) reach it in the weights' dtype."""
    if "inputs_embeds" in source:
        source = {**source, "inputs_embeds": source["inputs_embeds"].to(module.dtype)}
    if "pixel_values" in source and merges_images(module):
        source = dict(source)
        ids, pixels = source.pop("input_ids"), source.pop("pixel_values")
        embeds = module.get_input_embeddings()(ids)
        features = module.get_image_features(pixel_values=pixels)
        features = getattr(features, "pooler_output", features).to(embeds.dtype)
        at_images = module.get_placeholder_mask(ids, inputs_embeds=embeds, image_features=features)
        source["inputs_embeds"] = embeds.masked_scatter(at_images, features)
    return module.get_encoder()(**source, return_dict=True)
