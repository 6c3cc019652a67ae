"""Continuous batching: requests wait in a bounded queue, take a free row of the engine, leave when done.

One worker thread owns the engine (a :class:`hfax.generation.slots.SlotEngine`, which the backend's
:meth:`hfax.Backend.serving_engine` builds) and loops: release rows whose request finished or was
cancelled, prefill the waiting requests that fit into free rows (first in, first out; those of one
prompt bucket together, in one program of the engine), move the last busy rows down into
free rows below them, run one decode chunk over the leading rows that hold every request, hand each request
its new tokens. A turn that began with no row streaming (an idle engine meeting a burst) admits again
before its chunk while requests wait and rows are free: those that came during its prefills get their
first tokens without waiting for a chunk of the first ones' second. Requests reach it from the
server's event loop through :meth:`Scheduler.submit`; tokens go back through each :class:`Sequence`'s
``deliver`` callback, called on the worker thread.

The cache columns a request will use are known when it is admitted (its prompt's bucket before the
engine's clock, ``max_new`` after it), so admission checks they fit and
otherwise shifts every row, or waits until rows finish (see :mod:`hfax.backends.jax.slots` for the column
layout).

With prefix caching (an engine with a prefix store, :mod:`hfax.serve.prefixes`), each sequence is
planned as it is taken: the stored prefix it reuses (its columns are then the stored prefix's bucket and
the rest's), whether its prompt is kept after its prefill, and the phase of the turn it runs in; the
admissions of a turn run phase by phase, and each prefill call is followed by the copy of the prompts it
keeps into the store.

A prompt whose prefill would take more than the engine's ``piece`` tokens (``hfax serve
--prefill-chunk``) is prefilled in pieces (:meth:`hfax.generation.slots.SlotEngine.prefill`): its row is
taken when it is admitted, and each turn runs the next piece of every such row, in one engine call
before the turn's other prefills, then the decode chunk, so rows already decoding get tokens between
pieces. Its row produces no tokens until its last piece gives its first. Pieces come before new
admissions: a piece needs its prompt's tokens so far and itself before the clock and its ``max_new``
after it (the engine moves its tokens to end at the clock), and when no shift makes room the pieces,
and every sequence waiting behind them, wait for rows to finish. With prefix caching, a prompt whose
tokens after its stored prefix fill more than a piece goes in pieces from its first token (reusing
nothing), and what it keeps is planned at, and copied after, its last piece. Cancelled between pieces,
its row is freed like any other.

Prompt lookup: with an engine that guesses (``lookup`` above 0), a chunk over at most
:data:`LOOKUP_ROWS` leading rows, all greedy without penalties, a bias or a grammar and none prefilling,
guesses tokens (:meth:`_guesses`); it writes ``lookup + 1`` columns a step, so the rows move left first
when it would run past the end, and each row's columns move right by what the chunk reports
(``Chunk.moved``): its span with them, as wide as before. A row so moved may need columns past the end
for its ``max_new``; a plain chunk then moves every row left first (:meth:`_room`), and a new request
joins once a move makes room beside it.

Chunks in flight: while a turn would only decode the same rows again (nothing waits or is to be
scored, every leading row streams without a grammar: :meth:`Scheduler._steady`), the next chunk starts
before this one is read, and the device runs it while this thread hands out this one's tokens: beside
a device of millisecond steps (benchmarks/serve_host.py's stand-in) the host's work per chunk then
overlaps the device's instead of adding to it. Anything else a turn does (admitting, scoring, moving rows, a
cancelled row, a grammar's next step) first reads the chunk in flight: the host knows the clock and
the rows only as the last read chunk left them. A chunk is not started ahead where the rows would
have to move first, nor when the chunk in flight may end every row, nor while the host's own work is
under :data:`AHEAD_SHARE` of a decode turn (measured by the reads): beside a slow device, such as this
project's CPU, it gains little and costs a request arriving meanwhile a chunk's wait.

A sequence with a grammar (``response_format``, :class:`hfax.serve.formats.Constraint`) needs its tokens
allowed one at a time: while one is busy, each decode is a single step given every row's allowed tokens
(all of them for rows without a grammar, which so get the tokens they get alone, one per step), its
grammar advances with each token on this thread, and it ends with ``"stop"`` once the grammar is
complete. Without one busy, decoding runs in chunks as it always does.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from hfax.generation.rows import Sampling
from hfax.generation.slots import Admission, Kept, Piece, SlotEngine
from hfax.serve.prefixes import Plan, Prefixes

log = logging.getLogger("hfax.serve")

#: The most leading rows a chunk guesses tokens for by prompt lookup (when the engine guesses): on this
#: project's CPU a guessing step over 4 rows gives 1.3 times the tokens per second plain steps give, over
#: 16 rows half (docs/PERFORMANCE.md, "Prompt lookup").
LOOKUP_ROWS = 4

#: The least share of a decode turn the host's own work takes (between a read's return and the next
#: read, against the wait in the read) for a chunk to start before the last is read. Starting ahead saves
#: at most the host's time per chunk, and a request arriving meanwhile waits for one chunk more: on this
#: project's CPU, where a chunk of Gemma 3 270M takes 200-400 ms and the host 1-5 ms of it, starting
#: ahead cost benchmarks/serve.py 7-10% of its tokens per second at 4 and 16 clients; with a stand-in
#: device of 1 ms steps and rows of 1024 columns it gave 14% at 16 clients and 30% at 64
#: (docs/PERFORMANCE.md, "Chunks in flight and a burst's admission").
AHEAD_SHARE = 0.05


@dataclasses.dataclass
class Event:
    """New tokens of one sequence (``ids`` with their ``logprobs``, ``top_ids``, ``top_logprobs``), and
    ``finish``: ``None`` while it runs, then ``"stop"`` (an EOS token, or its grammar complete),
    ``"length"``, or ``"cancelled"``."""

    ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    finish: str | None = None


@dataclasses.dataclass(eq=False)
class Sequence:
    """One continuation being generated: a prompt, its limits and settings, and where its tokens go."""

    ids: list[int]
    max_new: int
    sampling: Sampling
    deliver: Callable[[Event], None]
    # A hfax.serve.formats.Constraint when response_format asks for a grammar.
    constraint: Any = None
    row: int = -1
    plan: Plan | None = None  # how it is admitted, when the engine keeps prefixes
    in_pieces: bool = False  # its prompt is prefilled a piece per turn (SlotEngine.prefill)
    prefilled: int = 0  # prompt tokens in its row so far, when in pieces
    generated: int = 0
    cancelled: bool = False
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    first_token: float | None = None

    @property
    def prefilling(self) -> bool:
        """Whether its row holds part of its prompt and no token yet: more pieces are to come."""
        return self.in_pieces and self.prefilled < len(self.ids)


def _keeps_guesses(sequence: Sequence) -> bool:
    """Whether prompt lookup's guesses can give ``sequence`` tokens: greedy, without a penalty, a bias or
    a grammar, and its prompt whole in its row (the engine keeps guesses only for such rows)."""
    sampling = sequence.sampling
    return (
        sampling.temperature == 0
        and not sampling.presence
        and not sampling.frequency
        and not sampling.bias
        and sequence.constraint is None
        and not sequence.prefilling
    )


class QueueFull(Exception):
    """The scheduler's queue holds ``max_queue`` waiting sequences already."""


@dataclasses.dataclass
class Counters:
    """What ``/metrics`` reports."""

    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    busy_row_steps: int = 0
    shifts: int = 0
    reused_tokens: int = 0
    kept_prefixes: int = 0
    prefill_pieces: int = 0
    chunks_ahead: int = 0  # decode chunks started before the last one was read


class Scheduler:
    """Runs :class:`Sequence` objects on ``engine`` in a worker thread (see the module docstring)."""

    def __init__(
        self, engine: SlotEngine, eos: list[int], max_queue: int, lookup_rows: int = LOOKUP_ROWS
    ) -> None:
        self.engine, self.eos, self.max_queue = engine, set(eos), max_queue
        self.lookup_rows = lookup_rows
        self.counters = Counters()
        self.prefixes = Prefixes(engine) if engine.prefixes else None
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._scoring: collections.deque[tuple[list[int], Callable[[Any], None]]] = (
            collections.deque()
        )
        self._rows: list[Sequence | None] = [None] * engine.slots
        self._spans: dict[int, tuple[int, int]] = {}  # row -> its columns [first, end)
        self._wake = threading.Condition()
        self._closing = False
        # When the last read returned, in a turn that only decoded, and the host's share of such turns
        # (a moving average; None until two reads measure one): what _start_ahead weighs.
        self._read_returned: float | None = None
        self.host_share: float | None = None
        self._thread = threading.Thread(target=self._loop, name="hfax-serve-scheduler", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> int:
        return sum(sequence is not None for sequence in self._rows)

    def fits(self, prompt: int, max_new: int) -> bool:
        """Whether a prompt of ``prompt`` tokens and ``max_new`` new ones fit the engine's rows at all (in
        pieces, a prompt takes its own tokens' columns, not its bucket's)."""
        columns = prompt if self._in_pieces(prompt) else self.engine.bucket(prompt)
        return columns + max_new <= self.engine.length

    def _in_pieces(self, prefilled: int) -> bool:
        """Whether a prefill of ``prefilled`` prompt tokens goes in pieces: when it is longer than one."""
        return 0 < self.engine.piece < prefilled

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue ``sequences`` (one request's choices) together, or raise :class:`QueueFull`."""
        with self._wake:
            if self._closing or len(self._waiting) + len(sequences) > self.max_queue:
                self.counters.rejected += 1
                raise QueueFull
            self.counters.requests += 1
            self._waiting.extend(sequences)
            self._wake.notify()

    def score(self, ids: list[int], done: Callable[[Any], None]) -> None:
        """Score ``ids`` (the engine's :meth:`~hfax.generation.slots.SlotEngine.score`: an ``echo``'s
        prompt log-probabilities) on the worker thread before its next admission and chunk; ``done`` gets
        the :class:`~hfax.generation.slots.Scored`, or the exception, on that thread. Raises
        :class:`QueueFull` once the server is closing."""
        with self._wake:
            if self._closing:
                raise QueueFull
            self._scoring.append((ids, done))
            self._wake.notify()

    def cancel(self, sequence: Sequence) -> None:
        """Stop ``sequence``: it leaves the queue or its row before the next chunk (thread-safe)."""
        with self._wake:
            sequence.cancelled = True
            self._wake.notify()

    def close(self) -> None:
        """Cancel whatever waits or runs, and stop the worker."""
        with self._wake:
            self._closing = True
            for sequence in [*self._waiting, *filter(None, self._rows)]:
                sequence.cancelled = True
            self._wake.notify()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while True:
            with self._wake:
                self._drop_cancelled()
                while not (
                    self._closing
                    or self._waiting
                    or self.busy
                    or self._scoring
                    or self.engine.unread
                ):
                    self._wake.wait()
                if self._closing and not self.busy and not self._waiting and not self._scoring:
                    return
                streaming = self._streaming()
                # With a chunk unread (a steady turn started it) nothing is admitted: only a read tells
                # the host the clock.
                admitted, pieces = ([], []) if self.engine.unread else self._take_admissible()
                scoring, self._scoring = list(self._scoring), collections.deque()
            for ids, done in scoring:
                try:
                    scored: Any = self.engine.score(ids)
                except Exception as error:  # noqa: BLE001 - that request gets an error, the server serves on
                    log.exception("hfax serve: scoring a prompt failed")
                    scored = error
                done(scored)
            try:
                if self.engine.unread and not self._steady():
                    # This turn does more than decode: it takes the rows as the last chunk left them.
                    self._collect()
                    continue
                if admitted or pieces or scoring:
                    self._read_returned = None  # not a turn that only decodes: it measures nothing
                if admitted or pieces:
                    self._admit(admitted, pieces)
                if admitted and not streaming and self._admissible():
                    continue  # a burst: no stream waits for a chunk, the requests that came meanwhile do
                self._pack()
                if self._streaming():
                    self._decode()
            except Exception:  # noqa: BLE001 - the server keeps serving; these requests get an error
                log.exception(
                    "hfax serve: the engine failed; the requests it held end with an error"
                )
                self._fail([sequence for _, sequence in admitted] + list(filter(None, self._rows)))
                if self.prefixes is not None:
                    self.prefixes.forget()

    def _streaming(self) -> bool:
        """Whether a row is decoding: its request has its first token and waits for more."""
        return any(s is not None and not s.prefilling for s in self._rows)

    def _admissible(self) -> bool:
        """Whether a request waits and a row is free for it (whether it fits beside the others is for
        :meth:`_take_admissible` to find)."""
        with self._wake:
            return bool(self._waiting) and None in self._rows

    def _fail(self, sequences: list[Sequence]) -> None:
        with self._wake:
            for sequence in set(sequences):
                if sequence.row >= 0 and self._rows[sequence.row] is sequence:
                    self._rows[sequence.row] = None
                    self._spans.pop(sequence.row, None)
                sequence.deliver(Event([], [], [], [], finish="error"))

    def _drop_cancelled(self) -> None:
        for sequence in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(sequence)
            sequence.deliver(Event([], [], [], [], finish="cancelled"))
        free = np.zeros((self.engine.slots,), bool)
        for row, sequence in enumerate(self._rows):
            if sequence is not None and sequence.cancelled:
                free[row] = True
                self._finish(row, "cancelled")
        if free.any():
            self.engine.release(free)

    def _take_admissible(
        self,
    ) -> tuple[list[tuple[int, Sequence]], list[tuple[int, Sequence]]]:
        """Waiting sequences that get a free row now, first come first served, to be prefilled together
        (:meth:`_admit`), every prompt's bucket ending at the engine's clock, which is shifted (or
        restarted) once so that the longest bucket fits before it and the longest ``max_new`` after it;
        and the sequences whose next piece runs this turn (see :meth:`_pieces`), among them the new ones
        whose prompts go in pieces. The first sequence that does not fit beside those before it waits."""
        free = [row for row, sequence in enumerate(self._rows) if sequence is None]
        taken: list[Sequence] = []
        if self.prefixes is not None:
            self.prefixes.turn()
        pieces, size, most = self._pieces()
        if pieces and not self._fits(size, most):
            return [], []  # the pieces, and every sequence behind them, wait for rows to finish
        for sequence in self._waiting:
            if len(taken) == len(free):
                break
            needed = max(most, sequence.max_new)
            plan = None if self.prefixes is None else self.prefixes.plan(sequence.ids)
            if plan is not None and plan.reuse and not self._fits(max(size, plan.columns), needed):
                # A stored prefix's bucket beside the rest's can take more columns than the whole
                # prompt's: prefilled whole, it may fit where it would not reusing.
                plan = self.prefixes.plan(sequence.ids, reusing=False)  # type: ignore[union-attr]
            reused = plan.reuse.count if plan is not None and plan.reuse else 0
            in_pieces = self._in_pieces(len(sequence.ids) - reused)
            if in_pieces:
                # Its pieces start from its first token; what it keeps is planned at its last piece.
                plan, columns = None, self.engine.piece
            else:
                columns = self.engine.bucket(len(sequence.ids)) if plan is None else plan.columns
            bucket = max(size, columns)
            if not self._fits(bucket, needed):
                break
            if plan is not None:
                self.prefixes.commit(plan, sequence.ids)  # type: ignore[union-attr]
            sequence.plan, sequence.in_pieces, sequence.prefilled = plan, in_pieces, 0
            taken.append(sequence)
            size, most = bucket, needed
        if not taken and not pieces:
            return [], []
        if not self._spans and self.engine.clock != size:
            # No row holds anything: the clock goes back to where the bucket just fits, leaving every
            # later column to these requests and those joining them, without moving the cache.
            self.engine.restart(size)
        delta = self._delta(size, most)
        if delta:
            self._move_all(delta)
        clock = self.engine.clock
        admitted = []
        for row, sequence in zip(free, taken):
            self._waiting.popleft()
            self._rows[row], sequence.row = sequence, row
            if sequence.in_pieces:
                pieces.append((row, sequence))
                continue
            admitted.append((row, sequence))
            plan = sequence.plan
            bucket = self.engine.bucket(len(sequence.ids)) if plan is None else plan.columns
            self._spans[row] = (clock - bucket, clock + sequence.max_new)
        for row, sequence in pieces:  # after its piece, its tokens so far end at the clock
            self._spans[row] = (clock - self._piece_end(sequence), clock + sequence.max_new)
        return admitted, pieces

    def _pieces(self) -> tuple[list[tuple[int, Sequence]], int, int]:
        """The rows partly prefilled, whose next piece runs this turn, with the columns before the clock
        the one that needs most takes (its tokens so far and the piece's) and the most ``max_new`` among
        them; for a last piece, what its prompt keeps in the prefix store is planned now (it runs in
        the turn's first phase, so later ones may read the entry)."""
        pieces = [
            (row, sequence)
            for row, sequence in enumerate(self._rows)
            if sequence is not None and sequence.prefilling and not sequence.cancelled
        ]
        size = max((s.prefilled + self.engine.piece for _, s in pieces), default=0)
        most = max((s.max_new for _, s in pieces), default=0)
        for _, sequence in pieces:
            if self.prefixes is not None and self._piece_end(sequence) == len(sequence.ids):
                sequence.plan = self.prefixes.plan(sequence.ids, reusing=False)
                self.prefixes.commit(sequence.plan, sequence.ids)
        return pieces, size, most

    def _piece_end(self, sequence: Sequence) -> int:
        """Where the next piece of ``sequence``'s prompt ends: the first piece holds what whole pieces
        leave over (so that its padding comes first and the prompt's tokens follow each other), every
        later one ``piece`` tokens."""
        if sequence.prefilled:
            return sequence.prefilled + self.engine.piece
        return len(sequence.ids) - (len(sequence.ids) - 1) // self.engine.piece * self.engine.piece

    def _fits(self, bucket: int, max_new: int) -> bool:
        """Whether a prompt bucket and ``max_new`` columns after it fit now: in an idle engine, whose
        clock restarts, when they fit in a row; else when a move (:meth:`_delta`) makes room."""
        if not self._spans:
            return bucket + max_new <= self.engine.length
        return self._delta(bucket, max_new) is not None

    def _delta(self, bucket: int, max_new: int) -> int | None:
        """How far to move every row so that a prompt bucket fits before the clock and ``max_new`` columns
        after it (0 when it fits as it is); ``None`` when no move does while the current rows run. A move
        goes as far left as the rows allow: a move copies the whole cache, and the columns it frees after
        the clock put off the next one."""
        clock, length = self.engine.clock, self.engine.length
        low, high = bucket - clock, length - max_new - clock
        for first, end in self._spans.values():
            low, high = max(low, -first), min(high, length - end)
        if low > high:
            return None
        return 0 if low <= 0 <= high else low

    def _pack(self) -> None:
        """Move the last busy rows into the free rows below them. A decode chunk runs the leading rows up to
        the last busy one (a program per power of two of rows), so rows left busy high up by requests that
        finished below them would cost every step what a full batch costs."""
        while None in self._rows:
            free = self._rows.index(None)
            last = max((row for row, s in enumerate(self._rows) if s is not None), default=-1)
            if last < free:
                return
            if self.engine.unread:  # the chunk's tokens are the rows' as they were
                self._collect()
                continue
            self._read_returned = None
            self.engine.move(last, free)
            with self._wake:
                sequence = self._rows[last]
                self._rows[free], self._rows[last], sequence.row = sequence, None, free
                self._spans[free] = self._spans.pop(last)

    def _admit(
        self, admitted: list[tuple[int, Sequence]], pieces: list[tuple[int, Sequence]]
    ) -> None:
        """Prefill this turn's pieces in one engine call (:meth:`_piece`), then the admitted sequences into
        their rows: one engine call per prompt bucket among them,
        each call's first tokens delivered as it returns. A call pads its prompts into one bucket: prompts
        of a bucket go together, and a short prompt never pays for a long one's columns. The shortest
        bucket goes first: every sequence admitted waits for this turn's prefills before its second
        token anyway, and short prompts first make the mean wait for a first token the least
        (docs/PERFORMANCE.md, "batched admission"). With prefix caching a sequence's
        :class:`~hfax.serve.prefixes.Plan` decides: the phase of the turn first, then the buckets of the
        stored prefix and of the rest; after each call, the prompts to keep are copied into the store."""
        if pieces:
            self._piece(pieces)
            self._keep([(row, s) for row, s in pieces if not s.prefilling])
        groups: dict[tuple[int, int, int], list[tuple[int, Sequence]]] = {}
        for row, sequence in admitted:
            plan = sequence.plan
            key = (0, 0, self.engine.bucket(len(sequence.ids))) if plan is None else plan.group
            groups.setdefault(key, []).append((row, sequence))
        for _, group in sorted(groups.items()):
            self._prefill(group)
            self._keep(group)

    def _keep(self, prefilled: list[tuple[int, Sequence]]) -> None:
        """Copy the prompts of ``prefilled`` that their plans keep into the prefix store."""
        kept = [
            Kept(row, *sequence.plan.keep)
            for row, sequence in prefilled
            if sequence.plan is not None and sequence.plan.keep is not None
        ]
        if kept:
            self.engine.keep(kept)
            self.counters.kept_prefixes += len(kept)

    def _piece(self, pieces: list[tuple[int, Sequence]]) -> None:
        """Prefill the next piece of each of ``pieces`` in one engine call, and deliver the first token
        of each prompt it ends."""
        calls = []
        for row, sequence in pieces:
            end = self._piece_end(sequence)
            allowed = None
            if sequence.constraint is not None and end == len(sequence.ids):
                allowed = self._allowed([sequence], 1)[0]
            admission = Admission(row, sequence.ids, sequence.sampling, sequence.max_new, allowed)
            calls.append(Piece(admission, sequence.prefilled, end))
        choices = self.engine.prefill(calls)
        self.counters.prefill_pieces += len(calls)
        for (_, sequence), call in zip(pieces, calls):
            sequence.prefilled = call.end
        self._started(
            [(row, s) for (row, s), chosen in zip(pieces, choices) if chosen is not None],
            [chosen for chosen in choices if chosen is not None],
        )

    def _prefill(self, admitted: list[tuple[int, Sequence]]) -> None:
        """Prefill ``admitted`` in one engine call, and deliver each first token."""
        requests = [
            Admission(
                row,
                sequence.ids,
                sequence.sampling,
                sequence.max_new,
                None if sequence.constraint is None else self._allowed([sequence], 1)[0],
                None if sequence.plan is None else sequence.plan.reuse,
            )
            for row, sequence in admitted
        ]
        self._started(admitted, self.engine.admit(requests))

    def _started(self, admitted: list[tuple[int, Sequence]], choices: list[dict[str, Any]]) -> None:
        """Deliver each admitted sequence's first token, its prompt now whole in its row."""
        now = time.perf_counter()
        ended = []
        for (row, sequence), chosen in zip(admitted, choices):
            self.counters.prompt_tokens += len(sequence.ids)
            if sequence.plan is not None and sequence.plan.reuse is not None:
                self.counters.reused_tokens += sequence.plan.reuse.count
            sequence.first_token = now
            token = int(chosen["token"])
            finish = self._finish_reason(token, 1, sequence)
            if finish != "stop" and self._completes(sequence, [token]):
                finish = "stop"
            self._send(
                sequence,
                [token],
                [float(chosen["logprob"])],
                [chosen["top_ids"].tolist()],
                [chosen["top_logprobs"].tolist()],
                finish,
            )
            if finish is not None:
                with self._wake:
                    self._finish(row, finish)
                ended.append(row)
        if ended:
            self.engine.release(self._mask(ended))

    def _decode(self) -> None:
        """Run a decode chunk over the leading rows and deliver its tokens. While the turn after would
        only decode again (:meth:`_steady`), the next chunk starts before this one is read, so that the
        device runs it while this thread hands out this one's tokens (:meth:`_start_ahead`)."""
        if not self.engine.unread:
            self._start()
        if self._steady():
            self._start_ahead()
        self._collect()

    def _start(self) -> None:
        """Start a chunk over the leading rows, the rows moved first where its columns need it: one
        step given every row's allowed tokens while a row has a grammar, else a chunk, guessing or not
        (:meth:`_guesses`)."""
        last = max(row for row, sequence in enumerate(self._rows) if sequence is not None)
        if any(sequence is not None and sequence.constraint is not None for sequence in self._rows):
            self._room(1)
            self.engine.decode(1, last + 1, allowed=self._allowed(self._rows, self.engine.slots))
        else:
            guess = self._guesses(last + 1)
            self.engine.decode(self.engine.chunk, last + 1, guess=guess)

    def _steady(self) -> bool:
        """Whether the next turn would only decode the same rows again: no request waits, no prompt is
        to be scored, the server is not closing, and every leading row holds a request that streams,
        uncancelled and without a grammar (whose allowed tokens follow from the last chunk's). A chunk
        can then start before the last one is read."""
        with self._wake:
            if self._closing or self._waiting or self._scoring:
                return False
            busy = [row for row, sequence in enumerate(self._rows) if sequence is not None]
            return bool(busy) and all(
                s is not None and not s.cancelled and not s.prefilling and s.constraint is None
                for s in self._rows[: busy[-1] + 1]
            )

    def _start_ahead(self) -> None:
        """Start the next chunk while the last is unread (:meth:`_steady` holds), as :meth:`_start`
        would once it is read, where that needs no move of the rows: the host knows the clock only up to
        what the unread chunk writes. Nothing starts when that chunk may end every row (each row's
        ``max_new`` reached within the tokens it can give), nor while the host's share of a decode turn
        is under :data:`AHEAD_SHARE` (a device slow beside the host gains little and costs arrivals a
        chunk's wait)."""
        if self.host_share is None or self.host_share < AHEAD_SHARE:
            return
        engine = self.engine
        last = max(row for row, sequence in enumerate(self._rows) if sequence is not None)
        busy = [s for s in self._rows if s is not None]
        guess = self._may_guess(last + 1)
        width = engine.lookup + 1 if guess else 1
        if engine.clock + engine.ahead + engine.chunk * width > engine.length:
            return  # the rows may have to move first: the next turn decides, once the chunk is read
        if all(s.max_new - s.generated <= engine.ahead for s in busy):
            return
        engine.decode(engine.chunk, last + 1, guess=guess)
        self.counters.chunks_ahead += 1

    def _collect(self) -> None:
        """Read the oldest unread chunk and deliver its tokens: rows that finished are freed. Measures the
        host's share of the turn since the last read (:data:`AHEAD_SHARE`)."""
        called = time.perf_counter()
        chunk = self.engine.read()
        returned = time.perf_counter()
        if self._read_returned is not None:
            host, wait = called - self._read_returned, returned - called
            share = host / max(host + wait, 1e-9)
            last = self.host_share
            self.host_share = share if last is None else 0.75 * last + 0.25 * share
        self._read_returned = returned
        if chunk.moved is not None:  # prompt lookup rolled rows right: their columns with them
            self._spans = {
                row: (first + int(chunk.moved[row]), end + int(chunk.moved[row]))
                for row, (first, end) in self._spans.items()
            }
        count = np.asarray(chunk.count)
        self.counters.decode_steps += int(count.max(initial=0))
        self.counters.busy_row_steps += int(count.sum())
        completed = []
        with self._wake:
            for row, sequence in enumerate(self._rows):
                if sequence is None or sequence.cancelled or sequence.prefilling:
                    continue
                n = int(count[row])
                ids = chunk.tokens[row, :n].tolist()
                finish = None
                if chunk.finished[row]:
                    finish = self._finish_reason(ids[-1] if ids else -1, 0, sequence) or "length"
                if finish != "stop" and self._completes(sequence, ids):
                    finish = "stop"
                    completed.append(row)
                self._send(
                    sequence,
                    ids,
                    chunk.logprobs[row, :n].tolist(),
                    chunk.top_ids[row, :n].tolist(),
                    chunk.top_logprobs[row, :n].tolist(),
                    finish,
                )
                if finish is not None:
                    self._finish(row, finish)
        if completed:  # the engine still counts these rows busy: their grammar ended them, not EOS
            self.engine.release(self._mask(completed))

    def _may_guess(self, rows: int) -> bool:
        """Whether a chunk over the leading ``rows`` is worth guessing tokens for by prompt lookup: the
        engine guesses, ``rows`` are at most ``lookup_rows`` (a step's forward over ``lookup + 1`` tokens
        a row costs about one token's while rows are few, and more than it gives when they are many),
        and every busy row keeps the guesses its model agrees with (:func:`_keeps_guesses`: a row that
        cannot would pay for guesses it never takes)."""
        busy = [s for s in self._rows if s is not None]
        return (
            bool(self.engine.lookup)
            and rows <= self.lookup_rows
            and all(_keeps_guesses(s) for s in busy)
        )

    def _guesses(self, rows: int) -> bool:
        """Whether this chunk guesses tokens by prompt lookup (:meth:`SlotEngine.decode` with ``guess``),
        making room for it first: when :meth:`_may_guess`. A guessing chunk writes ``lookup + 1`` columns
        a step, so the rows move left first when the chunk would run past the end (as far as their first
        columns allow); when not one step fits after that, the chunk decodes plainly."""
        engine = self.engine
        width = engine.lookup + 1
        if not self._may_guess(rows):
            self._room(engine.chunk)
            return False
        if engine.clock + engine.chunk * width > engine.length and self._spans:
            delta = max(
                engine.length - engine.chunk * width - engine.clock,
                -min(first for first, _ in self._spans.values()),
            )
            if delta < 0:
                self._move_all(delta)
        if engine.clock + width <= engine.length:
            return True
        self._room(engine.chunk)
        return False

    def _room(self, steps: int) -> None:
        """Move every row left when a row needs columns past the end (after prompt lookup rolled it right,
        its ``max_new`` may no longer fit) and the clock is within ``steps`` of it."""
        engine = self.engine
        if not self._spans or engine.clock + steps <= engine.length:
            return
        if max(end for _, end in self._spans.values()) <= engine.length:
            return  # every row finishes before the clock would pass the end
        delta = max(
            engine.length - steps - engine.clock, -min(first for first, _ in self._spans.values())
        )
        if delta < 0:
            self._move_all(delta)

    def _move_all(self, delta: int) -> None:
        """Move every row's columns, the clock and the host's record of their spans by ``delta``."""
        self.engine.shift(delta)
        self.counters.shifts += 1
        self._spans = {r: (a + delta, b + delta) for r, (a, b) in self._spans.items()}

    def _allowed(self, sequences: list[Sequence | None], rows: int) -> np.ndarray:
        """The tokens each of ``rows`` rows may choose next, as the engine takes them: int32 words, one
        bit per token; every bit of a row set unless its sequence (``sequences[row]``) has a grammar."""
        allowed = np.full((rows, (self.engine.vocab + 31) // 32), -1, np.int32)
        for row, sequence in enumerate(sequences[:rows]):
            if sequence is not None and sequence.constraint is not None:
                sequence.constraint.allow(allowed, row)
        return allowed

    def _completes(self, sequence: Sequence, ids: list[int]) -> bool:
        """Whether ``ids``, the sequence's new tokens, complete its grammar (never without one)."""
        constraint = sequence.constraint
        if constraint is None:
            return False
        complete = False
        for token in ids:  # one: a sequence with a grammar decodes one step at a time
            complete = constraint.consume(token)
        if constraint.error():
            log.warning("hfax serve: a response_format grammar failed: %s", constraint.error())
        return complete

    def _finish_reason(self, token: int, new: int, sequence: Sequence) -> str | None:
        if token in self.eos:
            return "stop"
        if sequence.generated + new >= sequence.max_new:
            return "length"
        return None

    def _send(
        self,
        sequence: Sequence,
        ids: list[int],
        logprobs: list[float],
        top_ids: Any,
        top_logprobs: Any,
        finish: str | None,
    ) -> None:
        """Deliver new tokens; an EOS token ends the sequence and is not part of its text."""
        sequence.generated += len(ids)
        if finish == "stop" and ids and ids[-1] in self.eos:
            ids, logprobs, top_ids, top_logprobs = (
                ids[:-1],
                logprobs[:-1],
                top_ids[:-1],
                top_logprobs[:-1],
            )
        self.counters.generated_tokens += len(ids)
        sequence.deliver(Event(ids, logprobs, top_ids, top_logprobs, finish))

    def _finish(self, row: int, reason: str) -> None:
        sequence = self._rows[row]
        self._rows[row] = None
        self._spans.pop(row, None)
        if sequence is None:
            return
        if reason == "cancelled":
            sequence.deliver(Event([], [], [], [], finish="cancelled"))
        elapsed = time.perf_counter() - sequence.submitted
        ttft = (sequence.first_token or time.perf_counter()) - sequence.submitted
        decoding = elapsed - ttft
        rate = (sequence.generated - 1) / decoding if decoding > 0 and sequence.generated > 1 else 0
        log.info(
            "row %d %s: %d prompt tokens, %d generated, TTFT %.3f s, %.1f tokens/s",
            row,
            reason,
            len(sequence.ids),
            sequence.generated,
            ttft,
            rate,
        )

    def _mask(self, rows: list[int]) -> np.ndarray:
        free = np.zeros((self.engine.slots,), bool)
        free[rows] = True
        return free
