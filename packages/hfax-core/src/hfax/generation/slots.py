"""What a continuous-batching engine is: a fixed number of rows decoded together, which requests join and
leave between decode chunks.

A backend that serves implements :class:`SlotEngine` (the JAX backend's is
:class:`hfax.backends.jax.slots.SlotEngine`) and hands it out through
:meth:`hfax.specs.Backend.serving_engine`; the scheduler of ``hfax serve`` (distribution hfax-serve)
drives it. The contract lives here, backend-neutral, so that a backend implements it without depending on
the server and the server drives it without naming a backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from hfax.generation.rows import Sampling


@dataclasses.dataclass
class Chunk:
    """What one decode chunk produced (host arrays): per row, ``count`` new tokens in ``tokens[:, :count]``
    with their ``logprobs`` and ``top_ids``/``top_logprobs``, and whether the row has ``finished`` (an EOS
    token or its limit)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    count: np.ndarray
    finished: np.ndarray
    # How many columns right each row's tokens moved in the chunk (prompt lookup hides the columns of
    # guesses the model did not take and rolls the row: the host's record of its columns follows).
    moved: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Reuse:
    """The first ``count`` tokens of a prompt, whose keys and values entry ``entry`` of the engine's prefix
    store holds (:meth:`SlotEngine.keep` put them there): only the tokens after them are prefilled."""

    entry: int
    count: int


@dataclasses.dataclass(frozen=True)
class Admission:
    """One request for :meth:`SlotEngine.admit`: its prompt ``ids`` to prefill into the free ``row``, its
    ``sampling`` settings and ``max_new`` limit, ``allowed``, the tokens its first token may be (a
    packed bitmask, int32 ``[ceil(vocab / 32)]``, :func:`hfax.generation.rows.allow`), ``None`` for any,
    and ``reuse``, the prompt's first tokens as the prefix store holds them (``None``: prefill them all)."""

    row: int
    ids: list[int]
    sampling: Sampling
    max_new: int
    allowed: np.ndarray | None = None
    reuse: Reuse | None = None


@dataclasses.dataclass(frozen=True)
class Piece:
    """For :meth:`SlotEngine.prefill`: tokens ``start`` to ``end`` of ``admission``'s prompt, prefilled into
    its row after the ``start`` tokens that the prompt's earlier pieces put there. Only a prompt's first
    piece may hold fewer than the engine's ``piece`` tokens; the piece that ends the prompt chooses its
    first token."""

    admission: Admission
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class Kept:
    """For :meth:`SlotEngine.keep`: the keys and values of the first ``count`` prompt tokens of the request
    in ``row``, to be held by entry ``entry`` of the prefix store."""

    row: int
    entry: int
    count: int


@dataclasses.dataclass
class Scored:
    """A prompt's own log-probabilities (host arrays): for each token after the first, ``logprobs`` the
    log-probability the model gave it after the tokens before it, and ``top_ids``/``top_logprobs`` the
    likeliest tokens there (:data:`hfax.generation.rows.TOP_LOGPROBS` of them, best first)."""

    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray


class SlotEngine(Protocol):
    """What a backend gives the scheduler: a fixed number of rows decoded together.

    A row may be constrained by a grammar (OpenAI's ``response_format``): its next token must be one that
    the host allows, and the host knows which only after the token before it. :meth:`admit` (per
    :class:`Admission`) and :meth:`decode` take those tokens as ``allowed``, a packed bitmask
    (:func:`hfax.generation.rows.allow`), and :meth:`decode` then runs one step; without ``allowed`` they run
    as they would without grammars.

    Prefix caching: an engine may hold a store of ``prefixes`` entries of up to ``prefix_length`` tokens'
    keys and values each (none when ``prefixes`` is 0, and ``prefix_refusal`` then says why if the
    model is the reason). :meth:`keep` copies a prompt's first tokens there from its row; a later
    :class:`Admission` with a :class:`Reuse` of them prefills only the rest of its prompt, attending to
    the stored ones, and gets the tokens it gets without. Which entry holds which tokens is the
    caller's to track.

    Prefilling in pieces: an engine with ``piece`` above 0 prefills a long prompt one :class:`Piece` at a
    time (:meth:`prefill`), between decode chunks, so that rows already decoding keep streaming. Its row
    produces no tokens until its last piece, which chooses its first token; the tokens are those it gets
    prefilled whole (``piece`` is 0, and ``piece_refusal`` says why, for a model where they would not
    be).

    Chunks in flight: :meth:`decode` may start a chunk before the last one is read (it runs after it),
    and :meth:`read` returns them oldest first. While a chunk is unread the host's ``clock`` is the last
    read chunk's, and ``ahead`` the most columns the unread ones move it; what places columns by the
    clock (admit, prefill, keep, shift, move, restart) needs every chunk read first."""

    slots: int
    length: int
    chunk: int
    clock: int
    vocab: int  # the width of the logits a token is chosen from (what ``allowed`` has one bit per)
    prefixes: int  # entries of the prefix store
    prefix_length: int  # tokens an entry holds at most
    prefix_refusal: str  # why the model gets no prefix store ("" if it may have one)
    piece: int  # prompt tokens a piece holds at most (0: every prompt prefilled whole)
    piece_refusal: str  # why the model's prompts are prefilled whole ("" if they may go in pieces)
    lookup: (
        int  # tokens a guessing decode step guesses per row by prompt lookup (0: it never guesses)
    )
    unread: int  # chunks decoded and not read yet
    ahead: int  # the most columns the unread chunks move the clock

    def bucket(self, length: int) -> int:
        """The columns a prompt of ``length`` tokens takes (its padded bucket)."""

    def columns(self, length: int, reused: int = 0) -> int:
        """The columns before the clock that a prompt of ``length`` tokens takes when its first ``reused``
        come from the prefix store (0: none do; then its :meth:`bucket`)."""

    def admit(self, requests: Sequence[Admission]) -> list[dict[str, Any]]:
        """Prefill each request's ``ids`` into its row, every prompt ending at the clock, in one program
        (requests that reuse stored prefixes, all of them or none); each request's first token's
        choice, on the host, in order (a dict of ``token``, ``logprob``, ``top_ids``,
        ``top_logprobs``)."""

    def prefill(self, pieces: Sequence[Piece]) -> list[dict[str, Any] | None]:
        """Prefill each :class:`Piece` into its row, every piece ending at the clock, in one program (a
        prompt's pieces in order, one per call); for each piece that ends its prompt its first token's
        choice, as :meth:`admit` returns it, and ``None`` for the others."""

    def keep(self, kept: Sequence[Kept]) -> None:
        """Copy each :class:`Kept`'s prompt tokens from its row into its entry of the prefix store (one
        program): rows admitted since the last :meth:`shift` that moved their prompts out."""

    def score(self, ids: list[int]) -> Scored:
        """``ids``' own log-probabilities (what ``echo`` with ``logprobs`` answers), in a forward of their
        own that leaves every row as it is."""

    def decode(
        self, steps: int, rows: int, allowed: np.ndarray | None = None, guess: bool = False
    ) -> None:
        """Start up to ``steps`` decode steps over the first ``rows`` rows (the others are free). With
        ``allowed`` (int32 ``[slots, ceil(vocab / 32)]``, every bit set in a row without a grammar),
        ``steps`` must be 1: each row's token is chosen among the tokens its bits allow. With ``guess``
        (an engine with ``lookup`` above 0), each step also feeds every row ``lookup`` tokens guessed by
        prompt lookup and gives it those its greedy choice agrees with, then its own: a greedy row
        without a penalty or a bias gets the tokens it gets without guesses, up to ``lookup + 1`` a
        step; every other row one token a step, as without. Such a step writes ``lookup + 1`` columns
        and rolls each row right by the columns of the guesses it did not keep (``Chunk.moved``)."""

    def read(self) -> Chunk:
        """The oldest unread chunk's tokens per row; waits for the device. The clock is then its."""

    def release(self, free: np.ndarray) -> None:
        """Mark rows finished so that no decode step waits for them."""

    def shift(self, delta: int) -> None:
        """Move every row's columns (and the clock) by ``delta``."""

    def move(self, source: int, target: int) -> None:
        """Move the request in row ``source`` into the free row ``target``; ``source`` is free after it."""

    def restart(self, clock: int) -> None:
        """Put the clock at ``clock`` while every row is free: nothing is copied."""

    def counters(self) -> tuple[int, float]:
        """Programs compiled and seconds spent compiling so far in this process."""
