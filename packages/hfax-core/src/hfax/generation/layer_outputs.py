"""The per-layer outputs ``generate`` returns when asked: ``output_hidden_states`` and ``output_attentions``
with ``return_dict_in_generate``, as transformers' ``Generate*Output`` holds them.

transformers keeps, per generated token, what the model's forward returned for it: step 0 is the prompt
(``hidden_states[0][layer]`` is ``[rows, prompt, hidden]``, ``attentions[0][layer]``
``[rows, heads, prompt, prompt]``), each later step the one token fed back (``[rows, 1, hidden]`` and
``[rows, heads, 1, keys]``, ``keys`` the prompt and the tokens so far). A compiled loop has static shapes,
so an engine keeps them in buffers laid out by this module, all in float32:

* ``prompt_hidden_states`` ``[layers + 1, rows, bucket, hidden]`` and ``prompt_attentions``
  ``[layers, rows, heads, bucket, bucket]``: the prefill's, over the prompt's whole bucket;
* ``hidden_states`` ``[capacity, layers + 1, rows, hidden]`` and ``attentions``
  ``[capacity, layers, rows, heads, bucket + capacity]``: decode step ``s`` (new token ``s`` fed back to
  choose token ``s + 1``) at index ``s - 1``, its attention over every slot of the cache.

The engine writes them with :func:`start` and :func:`write` (torch ops, traced inside its loop, like
:mod:`hfax.generation.tokens`); :func:`assemble` cuts them on the host into transformers' tuples: the
caller's prompt without hfax's bucket padding, each step's keys as many as transformers' cache holds then.
Beam search records the running rows as they ran, as transformers does (nothing is reordered).

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

#: The buffers' names, by the ``GenerationConfig`` field that asks for them.
ASKED_BY = {"hidden_states": "output_hidden_states", "attentions": "output_attentions"}


def stacked(layers: Any) -> Any:
    """A forward's per-layer outputs (a tuple of tensors) as one float32 tensor with the layers first;
    ``None`` when the attention function returned none (``"sdpa"``: ``None`` per layer, or no tuple)."""
    import torch

    if not layers or any(layer is None for layer in layers):
        return None
    return torch.stack([layer.to(torch.float32) for layer in layers])


def start(prompt: dict[str, Any], capacity: int) -> dict[str, Any]:
    """The buffers after prefill, from its ``prompt`` outputs (:func:`stacked`; ``None`` for attentions
    the model does not return): the prompt's kept, the decode steps' zeroed."""
    import torch

    buffers = {}
    for name, value in prompt.items():
        if value is None:
            continue
        buffers[f"prompt_{name}"] = value
        layers, rows = value.shape[0], value.shape[1]
        if name == "hidden_states":  # [layers + 1, rows, bucket, hidden]
            shape = (capacity, layers, rows, value.shape[3])
        else:  # attentions [layers, rows, heads, bucket, bucket]: keys over the bucket and the capacity
            shape = (capacity, layers, rows, value.shape[2], value.shape[4] + capacity)
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
        one = value[:, :, 0] if name == "hidden_states" else value[:, :, :, 0]
        index = (step - 1).to(torch.int64).reshape(1)
        written[name] = buffers[name].index_copy(0, index, one[None])
    return written


def assemble(
    state: dict[str, np.ndarray],
    asked: set[str],
    rows: int,
    width: int,
    bucket: int,
    steps: int,
    use_cache: bool,
) -> dict[str, tuple[tuple[Any, ...], ...]]:
    """transformers' ``hidden_states`` / ``attentions`` (those ``asked``) for ``steps`` new tokens of the
    first ``rows`` rows, from the buffers in ``state`` (host arrays); the caller's prompt is the last
    ``width`` of the ``bucket`` columns. Attentions the model does not return give an empty tuple per
    step, with transformers' warning."""
    result: dict[str, tuple[tuple[Any, ...], ...]] = {}
    first = bucket - width
    for name in sorted(asked):
        prompt = state.get(f"prompt_{name}")
        if prompt is None:
            warnings.warn(
                "this model's attention function returns no attention weights (transformers' sdpa does "
                "not, nor hfax's own attention in its place): load the model with "
                'attn_implementation="eager" to get output_attentions',
                stacklevel=4,
            )
            result[name] = tuple(() for _ in range(steps))
            continue
        decoded = state[name]
        if name == "hidden_states":
            per_step = [prompt[:, :rows, first:]] + [
                decoded[s - 1][:, :rows, None] for s in range(1, steps)
            ]
            if not use_cache:  # every position so far, at every step
                per_step = [np.concatenate(per_step[: s + 1], axis=2) for s in range(len(per_step))]
        else:
            per_step = [prompt[:, :rows, :, first:, first:]] + [
                decoded[s - 1][:, :rows, :, None, first : bucket + s] for s in range(1, steps)
            ]
            if not use_cache:
                per_step = [_square(per_step[: s + 1]) for s in range(len(per_step))]
        result[name] = tuple(tuple(layer for layer in step) for step in per_step)
    return result


def _square(parts: list[np.ndarray]) -> np.ndarray:
    """The attentions of every position so far, ``[layers, rows, heads, n, n]``: the prompt's block and
    each later query's row, keys after a query zero."""
    total = parts[0].shape[-1] + len(parts) - 1
    padded = [
        np.pad(part, [(0, 0)] * 4 + [(0, total - part.shape[-1])], constant_values=0.0)
        for part in parts
    ]
    return np.concatenate(padded, axis=3)
