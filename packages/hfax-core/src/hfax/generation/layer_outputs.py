"""The per-layer outputs ``generate`` returns when asked: ``output_hidden_states`` and ``output_attentions``
with ``return_dict_in_generate``, as transformers' ``Generate*Output`` holds them.

transformers keeps, per generated token, what the model's forward returned for it: step 0 is the prompt
(``hidden_states[0][layer]`` is ``[rows, prompt, hidden]``, ``attentions[0][layer]``
``[rows, heads, prompt, prompt]``), each later step the one token fed back (``[rows, 1, hidden]`` and
``[rows, heads, 1, keys]``, ``keys`` the prompt and the tokens so far). An encoder-decoder's result names
them ``decoder_hidden_states`` / ``decoder_attentions`` (its prompt is the decoder's), adds
``cross_attentions`` per step (``[rows, heads, queries, source]``) and, once, the encoder's
``encoder_hidden_states`` / ``encoder_attentions`` for each prompt (not repeated for beams, as
transformers runs the encoder before it repeats the rows). A compiled loop has static shapes, so an engine
keeps them in buffers laid out by this module, all in float32, named as the result's fields:

* ``prompt_<name>``: the prefill's, over the prompt's whole bucket (hidden states
  ``[layers + 1, rows, bucket, hidden]``, attentions ``[layers, rows, heads, bucket, keys]``; the
  encoder's over the source's bucket);
* ``<name>`` for the per-step ones: ``[capacity, layers + 1, rows, hidden]`` or
  ``[capacity, layers, rows, heads, keys]``, decode step ``s`` (new token ``s`` fed back to choose token
  ``s + 1``) at index ``s - 1``; a self-attention's keys are every slot of the cache (bucket + capacity),
  a cross-attention's the source's bucket.

The engine writes them with :func:`start` and :func:`write` (torch ops, traced inside its loop, like
:mod:`hfax.generation.tokens`); :func:`assemble` cuts them on the host into transformers' tuples: the
caller's prompt and source without hfax's bucket padding, each step's keys as many as transformers' cache
holds then. Beam search records the running rows as they ran, as transformers does (nothing is reordered).

With ``use_cache=False`` transformers runs the whole sequence at every step, so step ``s`` holds every
position so far (``[rows, prompt + s, hidden]``, attentions ``[rows, heads, prompt + s, prompt + s]``).
A causal model gives each position the same values whichever step computes it, so those come from the
same buffers: earlier positions as the steps that fed them computed them, keys after a query zero (its
causal mask).

The attentions are what the model's attention function returns: transformers' ``"eager"`` computes them,
while ``"sdpa"`` (and hfax's own attention, which replaces it) returns none; transformers' result then
holds an empty tuple for every step and warns, and so does hfax.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

#: The ``GenerationConfig`` field that asks for each kind of output (``tokens.Decoding``'s flags).
ASKED_BY = {"hidden_states": "output_hidden_states", "attentions": "output_attentions"}
#: What each result field is: a decoder's hidden states (``"hidden"``), its attentions over its own
#: keys (``"self"``) or the source's (``"cross"``), or the encoder's, recorded once (``"encoder"``).
KINDS = {
    "hidden_states": "hidden",
    "attentions": "self",
    "decoder_hidden_states": "hidden",
    "decoder_attentions": "self",
    "cross_attentions": "cross",
    "encoder_hidden_states": "encoder",
    "encoder_attentions": "encoder",
}
#: The result fields each flag asks for, decoder-only and encoder-decoder.
FIELDS = {
    False: {"hidden_states": ("hidden_states",), "attentions": ("attentions",)},
    True: {
        "hidden_states": ("encoder_hidden_states", "decoder_hidden_states"),
        "attentions": ("encoder_attentions", "decoder_attentions", "cross_attentions"),
    },
}


def asked(decoding: Any, encoder_decoder: bool) -> list[str]:
    """The result fields a decoding (``tokens.Decoding``) records."""
    return [
        field
        for flag, fields in FIELDS[encoder_decoder].items()
        if getattr(decoding, flag)
        for field in fields
    ]


def check_recordable(decoding: Any, feeds_one_token: bool, encoder: str | None = None) -> None:
    """Refuse, before compiling, per-layer outputs an engine cannot record: those of a model whose decode
    step is not one token fed through a cache (``feeds_one_token`` false: no cache, every step reads the
    whole sequence, or a token appended after it), or an encoder-decoder's where the engine says why not
    (``encoder``)."""
    if not any(getattr(decoding, name) for name in ASKED_BY):
        return
    if encoder is not None:
        raise NotImplementedError(
            "this backend's generate records output_hidden_states / output_attentions for decoder-only "
            f"models ({encoder}); use the JAX backend, or run the model's forward on the sequences "
            "generate returns"
        )
    if not feeds_one_token:
        raise NotImplementedError(
            "hfax's generate records output_hidden_states / output_attentions for models that decode one "
            "token at a time through a cache; this one reads the whole sequence at every step. Run the "
            "model's forward on the sequences generate returns to get them"
        )


def flags(decoding: Any, module: Any) -> dict[str, bool]:
    """The forward's keyword arguments that make it return what ``decoding`` records. Attentions are asked
    only of transformers' ``"eager"`` attention, the one that computes them: the others return none (and
    sdpa logs so from inside the traced step, which torch_xla's dynamo cannot trace)."""
    if not any(getattr(decoding, name) for name in ASKED_BY):
        return {}
    # The model's own config, not ``get_text_config()``: that may copy it, which a traced step (torch_xla's
    # dynamo) cannot; a composite config's implementation is its sub-configs' unless set apart.
    eager = getattr(module.config, "_attn_implementation", "eager") == "eager"
    return {
        field: True
        for name, field in ASKED_BY.items()
        if getattr(decoding, name) and (name != "attentions" or eager)
    }


def stacked(layers: Any) -> Any:
    """A forward's per-layer outputs (a tuple of tensors) as one float32 tensor with the layers first;
    ``None`` when the attention function returned none (``"sdpa"``: ``None`` per layer, or no tuple)."""
    import torch

    if not layers or any(layer is None for layer in layers):
        return None
    return torch.stack([layer.to(torch.float32) for layer in layers])


def start(prompt: dict[str, Any], capacity: int) -> dict[str, Any]:
    """The buffers after prefill, from its ``prompt`` outputs (:func:`stacked`, by result field; ``None``
    for attentions the model does not return): the prompt's kept, the decode steps' zeroed."""
    import torch

    buffers = {}
    for name, value in prompt.items():
        if value is None:
            continue
        buffers[f"prompt_{name}"] = value
        kind, layers, rows = KINDS[name], value.shape[0], value.shape[1]
        if kind == "encoder":
            continue
        if kind == "hidden":  # [layers + 1, rows, bucket, hidden]
            shape: tuple[int, ...] = (capacity, layers, rows, value.shape[3])
        else:  # [layers, rows, heads, bucket, keys]: a self-attention's keys, every slot of the cache
            keys = value.shape[3] + capacity if kind == "self" else value.shape[4]
            shape = (capacity, layers, rows, value.shape[2], keys)
        buffers[name] = torch.zeros(shape, dtype=torch.float32, device=value.device)
    return buffers


def write(buffers: dict[str, Any], outputs: dict[str, Any], step: Any) -> dict[str, Any]:
    """The buffers with decode step ``step`` (0-d, the new tokens so far: the one fed back is number
    ``step``) written from its forward's ``outputs`` (:func:`stacked`, one query position)."""
    import torch

    written = dict(buffers)
    for name, value in outputs.items():
        if name not in buffers:
            continue
        one = value[:, :, 0] if KINDS[name] == "hidden" else value[:, :, :, 0]
        index = (step - 1).to(torch.int64).reshape(1)
        written[name] = buffers[name].index_copy(0, index, one[None])
    return written


def assemble(
    state: dict[str, np.ndarray],
    fields: list[str],
    rows: int,
    width: int,
    bucket: int,
    steps: int,
    use_cache: bool,
    source: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """transformers' ``fields`` for ``steps`` new tokens of the first ``rows`` rows, from the buffers in
    ``state`` (host arrays); the caller's prompt is the last ``width`` of the ``bucket`` columns.
    ``source`` is an encoder-decoder's ``(length, expand)``: the caller's source length (``0``: the
    encoder's whole output, unpadded) and the rows per prompt (the encoder's outputs keep one). Attentions
    the model does not return give an empty tuple per step, with transformers' warning."""
    result: dict[str, Any] = {}
    first = bucket - width
    length, expand = source or (0, 1)
    cut = slice(None, length or None)
    for name in fields:
        prompt, kind = state.get(f"prompt_{name}"), KINDS[name]
        if prompt is None:
            warnings.warn(
                "this model's attention function returns no attention weights (transformers' sdpa does "
                "not, nor hfax's own attention in its place): load the model with "
                'attn_implementation="eager" to get output_attentions',
                stacklevel=4,
            )
            result[name] = () if kind == "encoder" else tuple(() for _ in range(steps))
            continue
        if kind == "encoder":  # one tuple of layers, one row per prompt
            rows_of_prompts = prompt[:, :rows:expand]
            if prompt.ndim == 4:  # hidden states [layers + 1, rows, source, hidden]
                result[name] = tuple(rows_of_prompts[:, :, cut])
            else:  # attentions [layers, rows, heads, source, source]
                result[name] = tuple(rows_of_prompts[:, :, :, cut, cut])
            continue
        decoded = state[name]
        if kind == "hidden":
            per_step = [prompt[:, :rows, first:]] + [
                decoded[s - 1][:, :rows, None] for s in range(1, steps)
            ]
            if not use_cache:  # every position so far, at every step
                per_step = [np.concatenate(per_step[: s + 1], axis=2) for s in range(steps)]
        elif kind == "self":
            per_step = [prompt[:, :rows, :, first:, first:bucket]] + [
                decoded[s - 1][:, :rows, :, None, first : bucket + s] for s in range(1, steps)
            ]
            if not use_cache:
                per_step = [_square(per_step[: s + 1]) for s in range(steps)]
        else:  # cross-attention: the source's keys at every step
            per_step = [prompt[:, :rows, :, first:, cut]] + [
                decoded[s - 1][:, :rows, :, None, cut] for s in range(1, steps)
            ]
            if not use_cache:
                per_step = [np.concatenate(per_step[: s + 1], axis=3) for s in range(steps)]
        result[name] = tuple(tuple(step) for step in per_step)
    return result


def over_static_cache(extras: dict[str, Any], slots: list[int]) -> None:
    """With ``cache_implementation="static"`` transformers' model attends over every slot of its
    ``StaticCache``, so each step's self-attentions have as many keys as the layer's cache has ``slots``
    (:func:`hfax.generation.outputs.static_cache_slots`), those not yet written zero: ``extras``'
    self-attentions are padded so, in place. A sliding layer whose window the sequence outgrew keeps its
    keys in a rolling order that these attentions (one column per position) do not have: that is an error
    naming what to ask instead."""
    for name in [name for name in extras if KINDS.get(name) == "self"]:
        steps = []
        for step in extras[name]:
            layers = []
            for index, attention in enumerate(step):
                held = slots[index] if index < len(slots) else -1
                if held == -1:  # a layer of no fixed length: its keys are the tokens so far
                    layers.append(attention)
                    continue
                if why := rolled_window(slots, attention.shape[-1]):
                    raise NotImplementedError(why)
                pad = [(0, 0)] * (attention.ndim - 1) + [(0, held - attention.shape[-1])]
                layers.append(np.pad(attention, pad, constant_values=0.0))
            steps.append(tuple(layers))
        extras[name] = tuple(steps)


def rolled_window(slots: list[int], positions: int) -> str:
    """Why attentions over a static cache of these ``slots`` (per decoder layer, ``-1``: no fixed length)
    cannot be laid out once ``positions`` tokens were fed (``""`` when they can): a sliding layer whose
    window they outgrew keeps its keys in a rolling order, where hfax's attentions have one column per
    position. The driver asks it before anything runs, for the call's last step (:func:`hfax.generation.
    settings.prepare`), and :func:`over_static_cache` of each step it pads."""
    for index, held in enumerate(slots):
        if held != -1 and positions > held:
            return (
                "output_attentions with a static cache_implementation: decoder layer "
                f"{index} keeps {held} slots, a rolling window that the {positions} positions fed "
                "outgrow, which hfax's attentions (one column per position) do not lay out as "
                "transformers' StaticCache does: leave cache_implementation unset, or ask for at most "
                f"{held} positions (prompt and new tokens but the last)"
            )
    return ""


def _square(parts: list[np.ndarray]) -> np.ndarray:
    """The attentions of every position so far, ``[layers, rows, heads, n, n]``: the prompt's block and
    each later query's row, keys after a query zero."""
    total = parts[0].shape[-1] + len(parts) - 1
    padded = [
        np.pad(part, [(0, 0)] * 4 + [(0, total - part.shape[-1])], constant_values=0.0)
        for part in parts
    ]
    return np.concatenate(padded, axis=3)
