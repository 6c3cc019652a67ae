"""Token choice for a continuous batch, where every row is a request of its own.

A serving engine (``hfax serve``) keeps a fixed number of rows in one compiled decode program and puts a
new request into whichever row is free, so each row carries its own sampling settings, seed and step as
traced ``[rows]`` arrays (:class:`Sampling`), never as part of the program. The arithmetic is
``generate``'s: the temperature and top-p twins of :mod:`hfax.generation.processors`, then the
counter-hash noise of :mod:`hfax.generation.search`. A request sampled in a batch therefore draws what
``generate`` draws alone with the same seed and ``top_k=0``: choice ``i`` of a request is row ``i`` of
``generate`` given ``n`` copies of its prompt.

OpenAI's ``presence_penalty``, ``frequency_penalty`` and ``logit_bias`` (:func:`adjust`) change the
logits a row's token is chosen from, before the choice; log-probabilities stay the model's own. A step
where no busy row has them skips the adjustment. A grammar (OpenAI's ``response_format``) narrows the
choice the same way, after them: :func:`allow` keeps only the tokens a row's packed bitmask lets it
choose, which the host computes each step.

Written in torch ops, like :mod:`hfax.generation.tokens`: the JAX backend traces them through torchax.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hfax.generation import processors, search

#: How many of the likeliest tokens each step reports with their log-probabilities (OpenAI allows 5 for
#: completions; more would cost every request a larger sort).
TOP_LOGPROBS = 5


#: At most this many tokens a request's ``logit_bias`` names: each row holds this many ``(token, bias)``
#: pairs, unused ones ``(0, 0.0)`` (a bias of 0 on token 0 changes nothing).
MAX_BIASED = 300


@dataclasses.dataclass(frozen=True)
class Sampling:
    """One request's sampling settings as :func:`choose` takes them (``temperature`` 0 is greedy), and
    OpenAI's adjustments of the logits before the choice (:func:`adjust`): ``presence`` and ``frequency``
    penalties, and ``bias``, ``(token, bias)`` pairs."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    choice: int = 0
    logprobs: bool = False
    presence: float = 0.0
    frequency: float = 0.0
    bias: tuple[tuple[int, float], ...] = ()

    def arrays(self) -> dict[str, np.ndarray]:
        """The settings as the arrays a row of :func:`choose`'s ``rows`` holds (0-d, and the bias's
        ``[MAX_BIASED]`` tokens and values)."""
        if len(self.bias) > MAX_BIASED:
            raise ValueError(f"at most {MAX_BIASED} biased tokens, got {len(self.bias)}")
        sample = self.temperature > 0
        biased = np.zeros((MAX_BIASED,), np.int32)
        values = np.zeros((MAX_BIASED,), np.float32)
        for at, (token, value) in enumerate(self.bias):
            biased[at], values[at] = token, value
        return {
            "sample": np.bool_(sample),
            # Greedy rows divide by 1: their sampled branch is computed (and discarded) without infinities.
            "temperature": np.float32(self.temperature if sample else 1.0),
            "top_p": np.float32(self.top_p),
            "seed": np.int32(self.seed & 0x7FFFFFFF),
            "choice": np.int32(self.choice),
            "logprobs": np.bool_(self.logprobs),
            "presence": np.float32(self.presence),
            "frequency": np.float32(self.frequency),
            "biased": biased,
            "bias": values,
        }


def adjusted(rows: dict[str, Any]) -> Any:
    """Which rows have a penalty or a bias for :func:`adjust` to apply (a ``[rows]`` bool tensor)."""
    penalized = (rows["presence"] != 0) | (rows["frequency"] != 0)
    return penalized | (rows["bias"] != 0).any(-1)


def adjusts(rows: dict[str, Any], busy: Any) -> Any:
    """Whether a ``busy`` row has a penalty or a bias for :func:`adjust` to apply (a 0-d bool tensor)."""
    return (adjusted(rows) & busy).any()


def adjust(logits: Any, rows: dict[str, Any]) -> Any:
    """OpenAI's adjustments of each row's ``logits`` ``[rows, vocab]`` before its token is chosen: the
    ``logit_bias`` added, and for each token the row generated ``c`` times so far (``rows["counts"]``,
    ``[rows, vocab]``), ``c * frequency + (c > 0) * presence`` subtracted. float32."""
    import torch

    logits = logits.to(torch.float32)
    logits = logits.scatter_add(1, rows["biased"].to(torch.int64), rows["bias"])
    counts = rows["counts"].to(torch.float32)
    presence = (counts > 0).to(torch.float32) * rows["presence"][:, None]
    return logits - counts * rows["frequency"][:, None] - presence


def allow(adjusted: Any, allowed: Any) -> Any:
    """``adjusted`` logits ``[rows, vocab]`` with every token a row may not choose at ``-inf``.

    ``allowed`` ``[rows, ceil(vocab / 32)]`` (int32) is the packed bitmask llguidance fills: token ``t``
    may be chosen when bit ``t % 32`` of word ``t // 32`` is set, so a row of ``-1`` words allows every
    token and leaves its logits as they are (a row without a grammar chooses what it chooses without
    one). Only the choice reads the result: log-probabilities stay the model's own. Each row must allow
    at least one token (a grammar always allows one, EOS at its end)."""
    import torch

    tokens = torch.arange(adjusted.shape[-1], device=adjusted.device)
    # An arithmetic shift reads bit 31 too: a set sign bit shifted down is -1, whose lowest bit is 1.
    bits = (allowed[:, tokens // 32] >> (tokens % 32)) & 1
    return adjusted.masked_fill(bits == 0, float("-inf"))


def choose(
    logits: Any, rows: dict[str, Any], step: Any, work: Work, adjusted: Any = None
) -> dict[str, Any]:
    """Each row's next token from its ``logits`` ``[rows, vocab]`` at new-token index ``step`` ``[rows]``.

    ``rows`` holds :meth:`Sampling.arrays` stacked to ``[rows]``; ``work`` says which parts any row needs
    (see :func:`work_needed`). The token is chosen from ``adjusted`` (:func:`adjust`'s logits) when given.
    Returns ``token`` ``[rows]`` (int32), its ``logprob`` under the model's own distribution (before any
    adjustment, as vLLM reports it), and the ``top_ids``/``top_logprobs`` ``[rows, k]`` of the
    :data:`TOP_LOGPROBS` likeliest tokens under it (zeros unless ``work.logprobs``).
    """
    import torch

    logits = logits.to(torch.float32)
    chosen_from = logits if adjusted is None else adjusted.to(torch.float32)
    token = torch.argmax(chosen_from, dim=-1).to(torch.int32)
    if work.sample:
        steps: tuple[tuple[str, tuple[int, ...]], ...] = (("temperature", ()),)
        settings = [{"value": rows["temperature"][:, None]}]
        if work.top_p:
            steps += (("top_p", (1,)),)
            settings.append({"value": rows["top_p"][:, None]})
        scores = processors.apply(steps, settings, chosen_from, history=None)
        noise = search.gumbel(
            rows["seed"][:, None], step[:, None], rows["choice"], logits.shape[-1]
        )
        sampled = torch.argmax(scores + noise, dim=-1).to(torch.int32)
        token = torch.where(rows["sample"], sampled, token)
    k = min(TOP_LOGPROBS, logits.shape[-1])
    if not work.logprobs:
        zeros = torch.zeros((logits.shape[0], k), device=logits.device)
        return {
            "token": token,
            "logprob": zeros[:, 0],
            "top_ids": zeros.to(torch.int32),
            "top_logprobs": zeros,
        }
    logprobs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logprobs, k, dim=-1)
    return {
        "token": token,
        "logprob": logprobs.gather(1, token[:, None].to(torch.int64))[:, 0],
        "top_ids": top.indices.to(torch.int32),
        "top_logprobs": top.values,
    }


@dataclasses.dataclass(frozen=True)
class Work:
    """Which parts of :func:`choose` run: sampling, its top-p cutoff, log-probabilities (each costs every
    row passes over the vocabulary, the top-p cutoff 32 of them)."""

    sample: bool
    top_p: bool
    logprobs: bool


#: Every :class:`Work`, in the order :func:`work_needed` numbers them. A row's ``top_p`` of 1 keeps every
#: token, so it needs no cutoff: transformers adds no top-p warper then either, and OpenAI's default request
#: (temperature 1, top_p 1) samples.
WORKS = tuple(
    Work(sample, top_p, logprobs)
    for sample, top_p in ((False, False), (True, False), (True, True))
    for logprobs in (False, True)
)


def work_needed(rows: dict[str, Any], busy: Any) -> Any:
    """The index in :data:`WORKS` of what the ``busy`` rows need (a 0-d int32 tensor), so that a batch
    of greedy requests costs what greedy decoding costs, and sampling cuts top-p only for a row with a
    ``top_p`` under 1."""
    import torch

    sample = rows["sample"] & busy
    top_p = (sample & (rows["top_p"] < 1)).any().to(torch.int32)
    kind = sample.any().to(torch.int32) + top_p
    return kind * 2 + (rows["logprobs"] & busy).any().to(torch.int32)
