"""The token state every backend's decode loop carries, and the one step that advances it.

Written in torch ops: the JAX backend runs them on torchax tensors inside its ``while_loop``, torch_xla
runs them in its compiled step. A backend's engine owns its model and cache; per step it hands the
logits here and gets back the state with the new token (and, for beam search, which rows its cache must
now hold).

The state is a dict of tensors: ``ids`` ``[rows, prompt + capacity]`` (the prompt's bucket, then the new
tokens), ``valid`` (which of those slots hold tokens of the sequence so far: the processors' history),
``step`` (0-d, new tokens so far), ``finished`` ``[rows]``, and when asked ``scores`` / ``logits``
``[rows, capacity, vocab]``. Beam search adds its bookkeeping (:mod:`hfax.generation.beams`).
A call whose tokens the host chooses (:mod:`hfax.generation.host_choice`) adds ``next_logits``
``[rows, vocab]``: the logits the newest token was chosen from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hfax.generation import beams, processors, search


@dataclasses.dataclass(frozen=True)
class Decoding:
    """The static structure of a request's decode loop (hashable: part of the compiled program's key).

    ``steps`` are the processors' ``(kind, shape)``; ``prompt`` and ``capacity`` the widths of the
    prompt's bucket and of the new tokens' buffer. ``hidden_states`` / ``attentions`` ask the engine to
    record the model's per-layer outputs (:mod:`hfax.generation.layer_outputs`); a program without them
    is the one it was before they existed. ``host_choice`` keeps each step's logits for the host, which
    replaces the token chosen here by its own (:mod:`hfax.generation.host_choice`).
    """

    steps: tuple[tuple[str, tuple[int, ...]], ...]
    do_sample: bool
    num_beams: int
    prompt: int
    capacity: int
    scores: bool = False
    logits: bool = False
    early_stopping: bool | str = False
    beams_to_keep: int = 0
    hidden_states: bool = False
    attentions: bool = False
    host_choice: bool = False


def host_arrays(request: Any) -> dict[str, Any]:
    """The traced settings of a request (numpy): the processors' arrays, EOS, filler, seed, widths."""
    return {
        "steps": [step.arrays for step in request.steps],
        "eos": processors.padded_ids(request.eos),
        "filler": np.int32(request.filler),
        "seed": np.int32(request.seed),
        "width": np.int32(request.width),
        "real_rows": np.int32(request.rows),
        "length_penalty": np.float32(request.config.length_penalty or 0.0),
        "max_length": np.int32(request.config.max_length),
    }


def start(
    prompt_ids: Any, prompt_valid: Any, logits: Any, decoding: Decoding, arrays: dict[str, Any]
) -> Any:
    """The state after the prompt: buffers made, first new token chosen from the prompt's ``logits``."""
    import torch

    rows, prompt = prompt_ids.shape
    device = prompt_ids.device
    filler = arrays["filler"].to(torch.int32)
    ids = torch.cat([prompt_ids.to(torch.int32), filler.expand(rows, decoding.capacity)], dim=1)
    valid = torch.cat(
        [prompt_valid, torch.zeros((rows, decoding.capacity), dtype=torch.bool, device=device)], 1
    )
    state = {
        "ids": ids,
        "valid": valid,
        "step": torch.zeros((), dtype=torch.int32, device=device),
        # Rows that only fill the batch's bucket start finished: they never hold the loop up.
        "finished": torch.arange(rows, device=device) >= arrays["real_rows"],
    }
    vocab = logits.shape[-1]
    for name in ("scores", "logits"):
        if getattr(decoding, name):
            state[name] = torch.zeros(
                (rows, decoding.capacity, vocab), dtype=torch.float32, device=device
            )
    if decoding.num_beams > 1:
        state.update(beams.start(rows // decoding.num_beams, decoding, device))
    return advance(state, logits, decoding, arrays)[0]


def last_tokens(state: dict[str, Any], decoding: Decoding) -> Any:
    """``[rows, 1]``: the token each row feeds the model next."""
    import torch

    column = (decoding.prompt + state["step"] - 1).to(torch.int64).reshape(1, 1)
    return state["ids"].gather(1, column.expand(state["ids"].shape[0], 1))


def running(state: dict[str, Any], limit: Any) -> Any:
    """0-d bool: whether the loop goes on (the limit is not reached and some row has not finished)."""
    return (state["step"] < limit) & ~state["finished"].all()


def _history(
    state: dict[str, Any], decoding: Decoding, arrays: dict[str, Any]
) -> processors.History:
    import torch

    end = decoding.prompt + state["step"]
    columns = torch.arange(state["ids"].shape[1], device=state["ids"].device)
    # transformers' input_ids: the caller's prompt, padding included, and the new tokens so far.
    present = (columns >= decoding.prompt - arrays["width"]) & (columns < end)
    return processors.History(
        ids=state["ids"],
        valid=state["valid"],
        end=end,
        length=arrays["width"] + state["step"],
        present=present[None].expand_as(state["valid"]),
    )


def advance(
    state: dict[str, Any], logits: Any, decoding: Decoding, arrays: dict[str, Any]
) -> tuple[Any, Any]:
    """Choose new token ``state["step"]`` of every row from its ``logits`` ``[rows, vocab]``.

    Returns the new state and, for beam search, the rows each row's cache must be copied from
    (``None`` otherwise).
    """
    import torch

    logits = logits.to(torch.float32)
    history = _history(state, decoding, arrays)
    if decoding.num_beams > 1:
        state, reorder, scores = beams.advance(state, logits, history, decoding, arrays)
        return _record_scores(state, scores, logits, decoding), reorder
    scores = processors.apply(decoding.steps, arrays["steps"], logits, history)
    rows = torch.arange(logits.shape[0], dtype=torch.int32, device=logits.device)
    token = search.pick(scores, decoding.do_sample, arrays["seed"], state["step"], rows)
    token = torch.where(state["finished"], arrays["filler"].to(token.dtype), token)
    state = record(state, token, decoding)
    state = _record_scores(state, scores, logits, decoding)
    if decoding.host_choice:  # a placeholder: the host chooses the token and which rows it finishes
        return {**state, "next_logits": logits}, None
    eos = arrays["eos"]
    hit = (token[:, None] == eos[None, :]).any(-1)
    return {**state, "finished": state["finished"] | hit}, None


def record(state: dict[str, Any], token: Any, decoding: Decoding) -> dict[str, Any]:
    """The state with ``token`` ``[rows]`` written as new token ``step``, and ``step`` advanced."""
    import torch

    column = decoding.prompt + state["step"]
    slots = torch.arange(state["ids"].shape[1], device=token.device)[None] == column
    ids = torch.where(slots, token[:, None].to(state["ids"].dtype), state["ids"])
    return {**state, "ids": ids, "valid": state["valid"] | slots, "step": state["step"] + 1}


def _record_scores(
    state: dict[str, Any], scores: Any, logits: Any, decoding: Decoding
) -> dict[str, Any]:
    import torch

    if not (decoding.scores or decoding.logits):
        return state
    at = (torch.arange(decoding.capacity, device=scores.device) == state["step"] - 1)[None, :, None]
    for name, value in (("scores", scores), ("logits", logits)):
        if getattr(decoding, name):
            state = {**state, name: torch.where(at, value[:, None, :], state[name])}
    return state
