"""Beam search as transformers 5 runs it (``GenerationMixin._beam_search``), with a traced step.

transformers' vectorized beam search keeps fixed-shape buffers already; its helpers index them with the
Python ``cur_len`` and branch on Python settings, so they cannot run inside a compiled loop as they are.
This is the same algorithm with the step as a tensor: each step keeps the ``keep`` best continuations
over all beams (``keep`` = (EOS tokens + 1) x beams, at least 2 x beams; beam sampling, ``do_sample``:
``keep`` drawn without replacement from the softmax of their scores, as transformers'
``torch.multinomial`` draws them, then ordered by score), the best ``num_beams`` of those
that did not end continue, and those that ended join the finished hypotheses when their length-penalized
score is among the ``num_beams`` best. The running rows are reordered every step; the engine reorders its
cache by the indices :func:`advance` returns.

State added to :mod:`hfax.generation.tokens`' (``B`` prompts, ``K`` beams, ``C`` new tokens):
``beam_scores`` ``[B, K]``, ``running_indices`` ``[B, K, C]``, and the finished hypotheses
``best_ids`` ``[B, K, C]``, ``best_scores`` ``[B, K]``, ``best_indices`` ``[B, K, C]``, ``best_done``
``[B, K]``, with ``improvable`` ``[B, 1]`` (transformers' ``is_early_stop_heuristic_unsatisfied``).
"""

from __future__ import annotations

from typing import Any

from hfax.generation import processors, search

#: transformers' stand-in for minus infinity in beam scores.
_NEG = -1.0e9


def start(batch: int, decoding: Any, device: Any) -> dict[str, Any]:
    import torch

    beams, capacity = decoding.num_beams, decoding.capacity
    scores = torch.zeros((batch, beams), dtype=torch.float32, device=device)
    scores = torch.where(torch.arange(beams, device=device)[None] > 0, _NEG, scores)
    indices = torch.full((batch, beams, capacity), -1, dtype=torch.int32, device=device)
    return {
        "beam_scores": scores,
        "running_indices": indices,
        "best_ids": torch.zeros((batch, beams, capacity), dtype=torch.int32, device=device),
        "best_scores": torch.full((batch, beams), _NEG, dtype=torch.float32, device=device),
        "best_indices": indices,
        "best_done": torch.zeros((batch, beams), dtype=torch.bool, device=device),
        "improvable": torch.ones((batch, 1), dtype=torch.bool, device=device),
    }


def _gather(tensor: Any, index: Any) -> Any:
    """``tensor[b, index[b, j], ...]`` for ``tensor`` ``[B, K, ...]`` and ``index`` ``[B, J]``."""
    import torch  # an import statement: dynamo (torch_xla's compiled step) cannot trace __import__

    while index.dim() < tensor.dim():
        index = index.unsqueeze(-1)
    return tensor.gather(1, index.expand(*index.shape[:2], *tensor.shape[2:]).to(torch.int64))


def _write_column(tensor: Any, column: Any, values: Any) -> Any:
    """``tensor[..., column] = values`` for a traced ``column``."""
    import torch

    at = torch.arange(tensor.shape[-1], device=tensor.device) == column
    return torch.where(at, values[..., None].to(tensor.dtype), tensor)


def advance(
    state: dict[str, Any], logits: Any, history: Any, decoding: Any, arrays: dict[str, Any]
) -> tuple[Any, Any, Any]:
    """One beam-search step over ``logits`` ``[B * K, vocab]``; returns the state, the cache's new row
    order ``[B * K]`` and the processed log-probabilities (transformers' ``scores``)."""
    import torch

    beams, prompt = decoding.num_beams, decoding.prompt
    rows, vocab = logits.shape
    batch = rows // beams
    keep = decoding.beams_to_keep
    step = state["step"]
    length = arrays["width"] + step  # transformers' cur_len before this token
    log_probs = processors.apply(
        decoding.steps, arrays["steps"], torch.log_softmax(logits, dim=-1), history
    )
    total = (log_probs.view(batch, beams, vocab) + state["beam_scores"][:, :, None]).view(batch, -1)
    if decoding.do_sample:  # Gumbel-top-k: `keep` draws without replacement, each ~ softmax(total)
        rows_index = torch.arange(batch, dtype=torch.int32, device=logits.device)
        noise = search.gumbel(arrays["seed"], step, rows_index, beams * vocab)
        top = torch.topk(total + noise, k=keep).indices
        top_scores, order = total.gather(1, top).sort(dim=-1, descending=True)
        top = top.gather(1, order)
    else:
        top_scores, top = torch.topk(total, k=keep)
    origin = (top // vocab).to(torch.int32)  # which beam each continuation extends
    token = (top % vocab).to(torch.int32)
    ids = _write_column(_gather(state["ids"].view(batch, beams, -1), origin), prompt + step, token)
    offset = (torch.arange(batch, device=logits.device, dtype=torch.int32) * beams)[:, None]
    indices = _write_column(_gather(state["running_indices"], origin), step, origin + offset)

    eos = arrays["eos"]
    ended = (token[..., None] == eos).any(-1) | (length + 1 >= arrays["max_length"])
    # The best `beams` continuations that did not end run on.
    running_scores = top_scores + ended.to(torch.float32) * _NEG
    chosen = torch.topk(running_scores, k=beams).indices
    new_ids = _gather(ids, chosen).reshape(rows, -1)
    beam_scores = _gather(running_scores, chosen)
    running_indices = _gather(indices, chosen)

    # Those that ended, among the first `beams`, join the finished hypotheses if good enough.
    first = (torch.arange(keep, device=logits.device) < beams)[None]
    just_ended = ended & first
    penalized = top_scores / ((step + 1).to(torch.float32) ** arrays["length_penalty"])
    full = state["best_done"].all(-1, keepdim=True) & (decoding.early_stopping is True)
    penalized = penalized + full.to(torch.float32) * _NEG
    penalized = penalized + (~state["improvable"]).to(torch.float32) * _NEG
    penalized = penalized + (~just_ended).to(torch.float32) * _NEG
    merged_scores = torch.cat([state["best_scores"], penalized], 1)
    best = torch.topk(merged_scores, k=beams).indices
    new_tokens = ids[..., prompt:]
    best_ids = _gather(torch.cat([state["best_ids"], new_tokens], 1), best)
    best_scores = _gather(merged_scores, best)
    best_indices = _gather(torch.cat([state["best_indices"], indices], 1), best)
    best_done = _gather(torch.cat([state["best_done"], just_ended], 1), best)

    improvable = _still_improvable(
        state["improvable"], beam_scores, best_scores, best_done, step + 1, decoding, arrays
    )
    done = ~improvable[:, 0] | (best_done.all(-1) & (decoding.early_stopping is True)) | ended.all()
    reorder = running_indices[..., :].gather(
        2, step.to(torch.int64).reshape(1, 1, 1).expand(batch, beams, 1)
    )
    valid = (
        state["valid"]
        | (torch.arange(state["valid"].shape[1], device=logits.device) == prompt + step)[None]
    )
    new_state = {
        **state,
        "ids": new_ids,
        "valid": valid,
        "step": step + 1,
        "finished": done[:, None].expand(batch, beams).reshape(rows),
        "beam_scores": beam_scores,
        "running_indices": running_indices,
        "best_ids": best_ids,
        "best_scores": best_scores,
        "best_indices": best_indices,
        "best_done": best_done,
        "improvable": improvable,
    }
    return new_state, reorder.reshape(rows), log_probs


def _still_improvable(
    improvable: Any,
    running: Any,
    best: Any,
    done: Any,
    generated: Any,
    decoding: Any,
    arrays: dict[str, Any],
) -> Any:
    """transformers' ``_check_early_stop_heuristic``: can a running beam still beat the worst finished one?"""
    import torch

    penalty = arrays["length_penalty"]
    generated = generated.to(torch.float32)
    if decoding.early_stopping == "never":
        longest = (arrays["max_length"] - arrays["width"]).to(torch.float32)
        generated = torch.where(penalty > 0, longest, generated)
    best_possible = running[:, :1] / generated**penalty
    worst = torch.where(done, best.min(dim=1, keepdim=True).values, torch.full_like(best, _NEG))
    return improvable & (best_possible > worst).any(-1, keepdim=True)
