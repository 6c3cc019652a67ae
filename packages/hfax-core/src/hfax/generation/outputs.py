"""What ``generate`` hands back: the array type it was given, and transformers' output classes."""

from __future__ import annotations

from typing import Any

import numpy as np


def array_kind(value: Any) -> str:
    """``"torch"``, ``"jax"`` or ``"numpy"``: the type ``generate``'s result takes after ``input_ids``."""
    module = type(value).__module__
    if hasattr(value, "detach") and module.startswith("torch"):
        return "torch"
    if module.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


def convert(array: np.ndarray | None, kind: str, like: Any = None) -> Any:
    """``array`` as ``kind`` (a torch tensor on ``like``'s device when ``like`` is one), writable: the
    engine's host state is read-only and the result the caller's."""
    if array is None:
        return None
    array = np.ascontiguousarray(array)
    array = array if array.flags.writeable else array.copy()
    if kind == "torch":
        import torch

        tensor = torch.from_numpy(array)
        device = getattr(like, "device", None)
        return tensor.to(device) if device is not None and device.type != "cpu" else tensor
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.asarray(array)
    return array


def static_cache_asked(config: Any) -> bool:
    """Whether the call's ``cache_implementation`` is a static one (``"static"``, Gemma 3's ``"hybrid"``,
    ...), for which transformers' ``generate`` hands back a ``StaticCache``."""
    from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS

    return config.cache_implementation in ALL_STATIC_CACHE_IMPLEMENTATIONS


def static_cache_length(module: Any, config: Any, embedded: int = 0) -> int:
    """How long transformers makes the ``StaticCache`` of a call that asks for one: every token fed
    (``max_length - 1``, plus the ``embedded`` prompt positions that ``max_length`` does not count), or
    ``max_cache_len``, or the longest of the module's earlier static calls, if longer."""
    return max(
        int(config.max_length) - 1 + embedded,
        config.max_cache_len or 0,
        getattr(module, "_previous_max_cache_length", -1),
    )


def static_cache_slots(module: Any, config: Any, embedded: int = 0) -> list[int]:
    """The slots of each decoder layer of that ``StaticCache`` (a sliding layer keeps its window; ``-1``:
    a layer of no fixed length), as transformers' own ``StaticCache`` of the model's text config counts
    them: what its attentions span at every step (:func:`hfax.generation.layer_outputs.over_static_cache`)."""
    from transformers.cache_utils import StaticCache

    text = module.config.get_text_config(decoder=True)
    made = StaticCache(config=text, max_cache_len=static_cache_length(module, config, embedded))
    return [int(made.get_max_length(index)) for index in range(len(made.layers))]


def requested_cache(module: Any, config: Any, cache: Any, embedded: int = 0) -> Any:
    """The engine's ``cache`` (a ``DynamicCache``, or an ``EncoderDecoderCache`` of two) in the class
    transformers' ``generate`` would hand back: where the call asks for a static one
    (:func:`static_cache_asked`; the engine's then holds every slot of every layer), a ``StaticCache`` for
    the model's text config (its sliding layers keep their window's last tokens), as long as
    transformers makes it (every token fed: ``max_length - 1``, plus the ``embedded`` prompt positions
    that ``max_length`` does not count; or ``max_cache_len``, or the longest of the module's earlier static
    calls, if longer; the cross-attention's as long as the encoder's output), holding the same keys and
    values; otherwise ``cache`` itself."""
    if cache is None:
        return None
    import torch
    from transformers.cache_utils import EncoderDecoderCache, StaticCache

    if not static_cache_asked(config):
        return cache
    text = module.config.get_text_config(decoder=True)
    offloading = "offloaded" in config.cache_implementation
    length = static_cache_length(module, config, embedded)
    module._previous_max_cache_length = length  # as transformers' _prepare_static_cache keeps it

    def static(dynamic: Any, size: int) -> Any:
        made = StaticCache(config=text, max_cache_len=size, offloading=offloading)
        for index, layer in enumerate(dynamic.layers):
            # releases before 5.24 place the update by its cache_position; 5.24 appends it
            position = {"cache_position": torch.arange(layer.keys.shape[2])}
            made.update(layer.keys, layer.values, index, position)
        return made

    if isinstance(cache, EncoderDecoderCache):
        cross = cache.cross_attention_cache
        source = cross.layers[0].keys.shape[2] if cross.layers else 0
        return EncoderDecoderCache(
            static(cache.self_attention_cache, length), static(cross, source)
        )
    return static(cache, length)


def assemble(
    sequences: np.ndarray,
    kind: str,
    like: Any,
    encoder_decoder: bool,
    beams: bool,
    return_dict: bool,
    extras: dict[str, Any],
) -> Any:
    """The result as transformers returns it: the sequences alone, or its ``Generate*Output`` with
    ``extras`` (``scores``, ``logits``: per-step ``[rows, vocab]`` arrays; ``sequences_scores``,
    ``beam_indices``; ``hidden_states``, ``attentions``: per step, per layer) converted to ``kind``."""
    ids = convert(sequences.astype(np.int64), kind, like)
    if not return_dict:
        return ids
    from transformers.generation import utils

    name = f"Generate{'Beam' if beams else ''}{'EncoderDecoder' if encoder_decoder else 'DecoderOnly'}Output"
    fields: dict[str, Any] = {"sequences": ids}
    for key in ("scores", "logits"):
        if extras.get(key) is not None:
            fields[key] = tuple(convert(step, kind, like) for step in extras[key])
    for key in ("sequences_scores", "beam_indices"):
        if key in extras:
            fields[key] = convert(extras[key], kind, like)
    if extras.get("past_key_values") is not None:  # a transformers Cache, whatever the array kind
        fields["past_key_values"] = extras["past_key_values"]
    # Per layer (the encoder's), or per step and per layer (hfax.generation.layer_outputs).
    for key in ("encoder_hidden_states", "encoder_attentions"):
        if key in extras:
            fields[key] = tuple(convert(layer, kind, like) for layer in extras[key])
    for key in (
        "hidden_states", "attentions", "decoder_hidden_states", "decoder_attentions", "cross_attentions"
    ):  # fmt: skip
        if key in extras:
            fields[key] = tuple(
                tuple(convert(layer, kind, like) for layer in step) for step in extras[key]
            )
    return getattr(utils, name)(**fields)
