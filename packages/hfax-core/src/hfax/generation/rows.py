"""Token choice for a continuous batch, where every row is a request of its own.

A serving engine (``hfax serve``) keeps a fixed number of rows in one compiled decode program and puts a
new request into whichever row is free, so each row carries its own sampling settings, seed and step as
traced ``[rows]`` arrays (:class:`Sampling`), never as part of the program. The arithmetic is
``generate``'s: the temperature and top-p twins of :mod:`hfax.generation.processors`, then the
counter-hash noise of :mod:`hfax.generation.search`. A request sampled in a batch therefore draws what
``generate`` draws alone with the same seed and ``top_k=0``: choice ``i`` of a request is row ``i`` of
``generate`` given ``n`` copies of its prompt.

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


@dataclasses.dataclass(frozen=True)
class Sampling:
    """One request's sampling settings as :func:`choose` takes them (``temperature`` 0 is greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    choice: int = 0
    logprobs: bool = False

    def arrays(self) -> dict[str, np.ndarray]:
        """The settings as the 0-d arrays a row of :func:`choose`'s ``rows`` holds."""
        sample = self.temperature > 0
        return {
            "sample": np.bool_(sample),
            # Greedy rows divide by 1: their sampled branch is computed (and discarded) without infinities.
            "temperature": np.float32(self.temperature if sample else 1.0),
            "top_p": np.float32(self.top_p),
            "seed": np.int32(self.seed & 0x7FFFFFFF),
            "choice": np.int32(self.choice),
            "logprobs": np.bool_(self.logprobs),
        }


def choose(logits: Any, rows: dict[str, Any], step: Any, work: Work) -> dict[str, Any]:
    """Each row's next token from its ``logits`` ``[rows, vocab]`` at new-token index ``step`` ``[rows]``.

    ``rows`` holds :meth:`Sampling.arrays` stacked to ``[rows]``; ``work`` says which parts any row needs
    (see :func:`work_needed`). Returns ``token`` ``[rows]`` (int32), its ``logprob`` under the model's own
    distribution, and the ``top_ids``/``top_logprobs`` ``[rows, k]`` of the :data:`TOP_LOGPROBS` likeliest
    tokens (zeros unless ``work.logprobs``).
    """
    import torch

    logits = logits.to(torch.float32)
    token = torch.argmax(logits, dim=-1).to(torch.int32)
    if work.sample:
        steps: tuple[tuple[str, tuple[int, ...]], ...] = (("temperature", ()),)
        settings = [{"value": rows["temperature"][:, None]}]
        if work.top_p:
            steps += (("top_p", (1,)),)
            settings.append({"value": rows["top_p"][:, None]})
        scores = processors.apply(steps, settings, logits, history=None)
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
