"""Where :class:`hfax.serve.scheduler.Scheduler` puts requests in the engine's columns: an idle engine's
clock goes back without copying the cache, and a move of busy rows goes as far left as they allow.

The engine here is a stand-in that keeps only the column bookkeeping (the real one,
``hfax.backends.jax.slots``, is tested against ``generate`` in hfax-jax and through ``hfax serve``)."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import numpy as np
import pytest

from hfax.generation.rows import Sampling
from hfax.generation.slots import Chunk
from hfax.serve.scheduler import AHEAD_SHARE, Scheduler, Sequence

BUCKET = 16


class ColumnsEngine:
    """A prompt takes a bucket of 16 columns, or 32 past 16 tokens; each of the leading rows a chunk runs
    emits token 7 until its ``max_new``; chunks are read in the order they were decoded, and a read moves
    the clock by its chunk's steps; ``shift``, ``move`` and ``restart`` are recorded, and so are the rows
    of each admit call and the ``allowed`` tokens of each admit and decode."""

    vocab = 40  # two words of allowed bits per row
    prefixes = 0  # no prefix store
    piece = 0  # every prompt prefilled whole
    lookup = 0  # no guessed tokens

    def __init__(self, slots: int, length: int, chunk: int) -> None:
        self.slots, self.length, self.chunk, self.clock = slots, length, chunk, 0
        self.allowed: list[tuple[str, int, np.ndarray | None]] = []
        self.left = np.zeros((slots,), int)
        self.shifts: list[int] = []
        self.restarts: list[int] = []
        self.moves: list[tuple[int, int]] = []
        self.rows_run: list[int] = []
        self.admitted_at: list[int] = []
        self.admits: list[list[int]] = []  # the rows of each admit call
        self.chunks: collections.deque = collections.deque()  # decoded, unread: (Chunk, columns)
        self.most_unread = 0

    @property
    def unread(self) -> int:
        return len(self.chunks)

    @property
    def ahead(self) -> int:
        return sum(columns for _, columns in self.chunks)

    def _unread_first(self) -> None:
        assert not self.chunks, "columns placed by the clock while a chunk is unread"

    def bucket(self, length: int) -> int:
        return BUCKET if length <= BUCKET else 2 * BUCKET

    def admit(self, requests) -> list[dict]:
        self._unread_first()
        size = max(self.bucket(len(request.ids)) for request in requests)
        most = max(request.max_new for request in requests)
        assert self.clock >= size and self.clock + most <= self.length, "columns outside the rows"
        self.admits.append([request.row for request in requests])
        choices = []
        for request in requests:
            self.allowed.append(("admit", 1, request.allowed))
            self.admitted_at.append(self.clock)
            self.left[request.row] = request.max_new - 1
            choices.append(
                {
                    "token": 7,
                    "logprob": 0.0,
                    "top_ids": np.zeros(5, int),
                    "top_logprobs": np.zeros(5),
                }
            )
        return choices

    def decode(self, steps: int, rows: int, allowed=None, guess=False) -> None:
        self.allowed.append(("decode", steps, allowed))
        self.rows_run.append(rows)
        count = np.where(np.arange(self.slots) < rows, np.minimum(self.left, steps), 0)
        self.left -= count
        self._chunk(count, int(count.max(initial=0)), self.chunk)

    def _chunk(self, count: np.ndarray, columns: int, width: int, moved=None) -> None:
        """Queue a chunk of ``count`` tokens a row (``width`` at most) that moves the clock ``columns``."""
        shape, top = (self.slots, width), (self.slots, width, 5)
        chunk = Chunk(np.full(shape, 7), np.zeros(shape), np.zeros(top, int), np.zeros(top),
                      count, self.left == 0, moved)  # fmt: skip
        self.chunks.append((chunk, columns))
        self.most_unread = max(self.most_unread, len(self.chunks))
        assert self.clock + self.ahead <= self.length, "a chunk past the end of the rows"

    def read(self) -> Chunk:
        chunk, columns = self.chunks.popleft()
        self.clock += columns
        return chunk

    def release(self, free: np.ndarray) -> None:
        self.left[free] = 0

    def shift(self, delta: int) -> None:
        self._unread_first()
        self.shifts.append(delta)
        self.clock += delta

    def move(self, source: int, target: int) -> None:
        self._unread_first()
        self.moves.append((source, target))
        self.left[target], self.left[source] = self.left[source], 0

    def restart(self, clock: int) -> None:
        self._unread_first()
        self.restarts.append(clock)
        self.clock = clock

    def counters(self) -> tuple[int, float]:
        return 0, 0.0


def _submit(
    scheduler: Scheduler, max_new: int
) -> tuple[list[int], threading.Event, threading.Event]:
    """A greedy request of ``max_new`` tokens: its tokens so far, and events set at its first and last."""
    tokens: list[int] = []
    first, done = threading.Event(), threading.Event()

    def deliver(event) -> None:
        tokens.extend(event.ids)
        first.set()
        if event.finish:
            done.set()

    scheduler.submit([Sequence([1, 2, 3], max_new, Sampling(temperature=0.0), deliver)])
    return tokens, first, done


def _ask(scheduler: Scheduler, max_new: int) -> list[int]:
    tokens, _, done = _submit(scheduler, max_new)
    assert done.wait(10)
    return tokens


@pytest.fixture
def scheduler():
    engine = ColumnsEngine(slots=2, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    yield scheduler
    scheduler.close()


def test_an_idle_engine_restarts_its_clock_instead_of_moving_the_cache(scheduler):
    """One request after another, each using most of the row: no cache copy, every token delivered."""
    for _ in range(4):
        assert _ask(scheduler, 40) == [7] * 40
    engine = scheduler.engine
    assert engine.shifts == [] and engine.restarts == [BUCKET] * 4
    assert engine.admitted_at == [BUCKET] * 4


def test_a_move_of_busy_rows_goes_as_far_left_as_they_allow(scheduler):
    """Rows holding columns from 10 on, the clock at 50: a request needing 20 columns after the clock
    moves every row 10 columns left (the most the rows allow; 6 would be the least that fits)."""
    engine = scheduler.engine
    engine.clock = 50
    scheduler._spans = {0: (10, 54)}
    assert scheduler._delta(BUCKET, 20) == -10
    assert scheduler._delta(BUCKET, 10) == 0  # fits as it is: nothing moves
    assert scheduler._delta(BUCKET, 30) is None  # cannot fit while row 0 runs


def test_the_last_busy_row_moves_down_into_a_row_freed_below_it():
    """Three requests in rows 0-2; rows 0 and 1 finish after the first chunk: row 2's request moves to
    row 0 and the chunks after run one row, and it still gets every token."""
    engine = ColumnsEngine(slots=4, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    finished: list[int] = []
    done = threading.Event()

    def deliver(i: int):
        def take(event) -> None:  # on the scheduler's thread
            got[i].extend(event.ids)
            if event.finish:
                finished.append(i)
                if len(finished) == len(got):
                    done.set()

        return take

    try:
        scheduler.submit(
            [Sequence([1], n, Sampling(0.0), deliver(i)) for i, n in enumerate((5, 5, 13))]
        )
        assert done.wait(10)
    finally:
        scheduler.close()
    assert [len(tokens) for tokens in got.values()] == [5, 5, 13]
    assert engine.moves == [(2, 0)]
    assert engine.rows_run == [3, 1, 1]


def test_a_steady_batch_starts_each_chunk_before_the_last_is_read():
    """A request of 20 tokens alone, on a stand-in whose reads wait for nothing (the host's share of a
    turn is nearly all of it): once two reads have measured that share, each chunk starts before the one
    before it is read (the device would run it while the host delivers), none once the unread chunk can
    end the request; every token arrives, and a request arriving meanwhile is admitted once every chunk
    is read (the stand-in refuses an admission while one is unread). Beside a device whose reads wait
    200 ms, every chunk is read before the next starts."""
    calls: list[str] = []

    class Recording(ColumnsEngine):
        def decode(self, steps: int, rows: int, allowed=None, guess=False) -> None:
            calls.append("decode")
            super().decode(steps, rows, allowed, guess)

        def read(self) -> Chunk:
            calls.append("read")
            return super().read()

    engine = Recording(slots=2, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    try:
        assert _ask(scheduler, 20) == [7] * 20
        assert calls == ["decode", "read"] * 2 + [
            "decode",
            "decode",
            "read",
            "decode",
            "read",
            "read",
        ]
        assert scheduler.host_share > 0.5
        tokens, first, done = _submit(scheduler, 40)
        assert first.wait(10)
        assert _ask(scheduler, 12) == [7] * 12  # admitted while the first one streams
        assert done.wait(10) and tokens == [7] * 40
        assert engine.most_unread == 2 and scheduler.counters.chunks_ahead >= 3
    finally:
        scheduler.close()

    class Slow(Recording):
        def read(self) -> Chunk:
            time.sleep(0.2)
            return super().read()

    calls.clear()
    engine = Slow(slots=2, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    try:
        assert _ask(scheduler, 20) == [7] * 20
    finally:
        scheduler.close()
    assert calls == ["decode", "read"] * 5 and scheduler.host_share < AHEAD_SHARE
    assert scheduler.counters.chunks_ahead == 0


def test_requests_arriving_together_are_prefilled_in_one_call_per_prompt_bucket():
    """Three requests queued while the worker waits (prompts of 20, 3 and 5 tokens) are admitted in one
    loop turn, the clock where the 32-column bucket of the longest fits: one engine call for the two
    16-column prompts, then one for the other (shortest first); a fourth, whose columns do not fit beside theirs, waits for a
    later call, and every request gets its tokens."""
    engine = ColumnsEngine(slots=4, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    got: dict[int, list[int]] = {i: [] for i in range(4)}
    finished: list[int] = []
    done = threading.Event()

    def deliver(i: int):
        def take(event) -> None:
            got[i].extend(event.ids)
            if event.finish:
                finished.append(i)
                if len(finished) == len(got):
                    done.set()

        return take

    jobs = [([1] * 20, 12), ([1] * 3, 10), ([1] * 5, 8), ([1] * 3, 40)]
    try:
        with scheduler._wake:  # the worker takes nothing until all four are queued
            for i, (ids, n) in enumerate(jobs):
                scheduler.submit([Sequence(ids, n, Sampling(0.0), deliver(i))])
        assert done.wait(10)
    finally:
        scheduler.close()
    assert [len(got[i]) for i in range(4)] == [n for _, n in jobs]
    assert engine.admits == [[1, 2], [0], [0]]
    assert engine.restarts[0] == 2 * BUCKET and engine.admitted_at[:3] == [2 * BUCKET] * 3


def test_requests_arriving_while_an_idle_engine_prefills_are_prefilled_before_its_first_chunk():
    """One request alone in an idle engine; three more arrive during its prefill: they are prefilled in
    the next call, before the first decode chunk (its stream has not waited for one yet), which runs all
    four rows. A request arriving while a row streams waits for the chunk between: the running streams
    get their tokens first."""
    calls: list[str] = []

    class Arrivals(ColumnsEngine):
        def admit(self, requests) -> list[dict]:
            calls.append(f"admit {len(requests)}")
            if arrivals:  # they come while this prefill runs
                scheduler.submit(arrivals.pop(0))
            return super().admit(requests)

        def decode(self, steps: int, rows: int, allowed=None, guess=False) -> None:
            calls.append(f"decode {rows}")
            super().decode(steps, rows, allowed, guess)

    engine = Arrivals(slots=8, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    finished: list[int] = []
    done = threading.Event()

    def deliver(i: int):
        def take(event) -> None:
            if event.finish:
                finished.append(i)
                if len(finished) == 6:
                    done.set()

        return take

    def sequence(i: int) -> Sequence:
        return Sequence([1, 2, 3], 12, Sampling(0.0), deliver(i))

    arrivals = [[sequence(1), sequence(2), sequence(3)], [sequence(4)], [sequence(5)]]
    try:
        scheduler.submit([sequence(0)])
        assert done.wait(10)
    finally:
        scheduler.close()
    # The fifth request came during the second admission, with the first request already streaming:
    # it waits for a chunk, and the sixth, arriving during its admission, for the next one.
    assert calls[:6] == ["admit 1", "admit 3", "decode 4", "admit 1", "decode 5", "admit 1"]


class Grammar:
    """A stand-in for :class:`hfax.serve.formats.Constraint`: allows token 7 alone, complete after
    ``length`` tokens."""

    def __init__(self, length: int) -> None:
        self.length, self.seen = length, 0

    def allow(self, bitmask: np.ndarray, row: int) -> None:
        bitmask[row] = 0
        bitmask[row, 0] = 1 << 7

    def consume(self, token: int) -> bool:
        assert token == 7
        self.seen += 1
        return self.seen >= self.length

    def error(self) -> str:
        return ""


def test_a_sequence_with_a_grammar_decodes_one_allowed_step_at_a_time_and_ends_with_it():
    """While a sequence with a grammar is busy every decode is one step, given its row's allowed tokens
    and every token for the other row; its grammar's end ends it with "stop" (its row released) before
    its max_new; alone, the sequence without one decodes in chunks again."""
    engine = ColumnsEngine(slots=2, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    events: dict[str, list] = {"grammar": [], "plain": []}
    done = threading.Event()

    def deliver(name: str):
        def take(event) -> None:
            events[name].append(event)
            if all(e and e[-1].finish for e in events.values()):
                done.set()

        return take

    try:
        scheduler.submit(
            [Sequence([1], 20, Sampling(0.0), deliver("grammar"), constraint=Grammar(3)),
             Sequence([1], 12, Sampling(0.0), deliver("plain"))]
        )  # fmt: skip
        assert done.wait(10)
    finally:
        scheduler.close()
    grammar = [token for event in events["grammar"] for token in event.ids]
    assert grammar == [7, 7, 7] and events["grammar"][-1].finish == "stop"
    assert sum(len(e.ids) for e in events["plain"]) == 12 and events["plain"][-1].finish == "length"
    first, second, third, *rest = engine.allowed
    assert first[0] == "admit" and first[2].tolist() == [1 << 7, 0]
    assert second[0] == "admit" and second[2] is None
    for kind, steps, allowed in (third, rest[0]):  # the grammar's two steps after its first token
        assert (kind, steps) == ("decode", 1)
        assert allowed.tolist() == [[1 << 7, 0], [-1, -1]]
    assert [(kind, steps, allowed) for kind, steps, allowed in rest[1:]] == [
        ("decode", 4, None)
    ] * len(rest[1:])
    assert rest[1:], "the plain sequence decoded in chunks again"


class PrefixEngine(ColumnsEngine):
    """:class:`ColumnsEngine` with a prefix store of two entries of up to 64 tokens: buckets are powers of
    two from 16; each admit call records its rows and reuses, each keep call its entries and counts."""

    prefixes, prefix_length = 2, 64

    def __init__(self, slots: int, length: int, chunk: int) -> None:
        super().__init__(slots, length, chunk)
        self.calls: list[tuple[str, list]] = []

    def bucket(self, length: int) -> int:
        return max(BUCKET, 1 << (length - 1).bit_length())

    def columns(self, length: int, reused: int = 0) -> int:
        return self.bucket(length - reused) + (self.bucket(reused) if reused else 0)

    def admit(self, requests) -> list[dict]:
        reused = [r.reuse.count if r.reuse else 0 for r in requests]
        held = self.bucket(max(reused)) if requests[0].reuse else 0
        size = self.bucket(max(len(r.ids) - n for r, n in zip(requests, reused)))
        assert self.clock >= held + size, "columns outside the rows"
        self.calls.append(
            ("admit", [(r.row, r.reuse and (r.reuse.entry, r.reuse.count)) for r in requests])
        )
        return super().admit([dataclasses.replace(r, ids=r.ids[:1]) for r in requests])

    def keep(self, kept) -> None:
        self.calls.append(("keep", [(k.row, k.entry, k.count) for k in kept]))


def test_prompts_sharing_a_prefix_reuse_it_in_the_turn_after_it_is_kept_or_the_same_one():
    """Three sequences taken in one turn, two sharing a 40-token prefix: the first of those two and the
    third prefilled whole in one call, their first 32 tokens kept (an entry each), then the second reusing
    32 in a call of its own. A later sequence beginning with the third's prompt reuses its entry, and a new
    prefix evicts the entry least recently used (the first's)."""
    engine = PrefixEngine(slots=4, length=128, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    shared, other = list(range(1, 41)), list(range(50, 90))
    done = threading.Semaphore(0)

    def sequence(ids):
        return Sequence(ids, 2, Sampling(0.0), lambda event: event.finish and done.release())

    try:
        scheduler.submit([sequence(shared + [3]), sequence(other + [4]), sequence(shared + [5, 6])])
        for _ in range(3):
            assert done.acquire(timeout=10)
        assert engine.calls == [
            ("admit", [(0, None), (1, None)]),
            ("keep", [(0, 0, 32), (1, 1, 32)]),
            ("admit", [(2, (0, 32))]),
        ]
        engine.calls.clear()
        for ids in (other + [7, 8], list(range(100, 140))):
            scheduler.submit([sequence(ids)])
            assert done.acquire(timeout=10)
        assert engine.calls == [
            ("admit", [(0, (1, 32))]),
            ("admit", [(0, None)]),
            ("keep", [(0, 0, 32)]),
        ]
        assert scheduler.counters.reused_tokens == 64 and scheduler.counters.kept_prefixes == 3
    finally:
        scheduler.close()


class PieceEngine(ColumnsEngine):
    """:class:`ColumnsEngine` that prefills prompts longer than 16 tokens in pieces of 16: ``calls``
    records each admit's rows, each prefill's ``(row, start, end)`` and each decode's rows, in order
    (the test's deliver callbacks add theirs); ``on_piece`` runs at each prefill call."""

    piece = 16

    def __init__(self, slots: int, length: int, chunk: int) -> None:
        super().__init__(slots, length, chunk)
        self.calls: list[tuple] = []
        self.on_piece = lambda pieces: None

    def admit(self, requests) -> list[dict]:
        self.calls.append(("admit", [r.row for r in requests]))
        return super().admit(requests)

    def prefill(self, pieces) -> list[dict | None]:
        self._unread_first()
        assert self.clock >= max(p.start for p in pieces) + self.piece, "columns outside the rows"
        self.calls.append(("prefill", [(p.admission.row, p.start, p.end) for p in pieces]))
        self.on_piece(pieces)
        chosen = []
        for p in pieces:
            if p.end < len(p.admission.ids):
                self.left[p.admission.row] = 0  # reserved: no tokens yet
                chosen.append(None)
            else:
                self.left[p.admission.row] = p.admission.max_new - 1
                chosen.append({"token": 7, "logprob": 0.0, "top_ids": np.zeros(5, int),
                               "top_logprobs": np.zeros(5)})  # fmt: skip
        return chosen

    def decode(self, steps: int, rows: int, allowed=None, guess=False) -> None:
        self.calls.append(("decode", rows))
        super().decode(steps, rows, allowed)


def _recording(engine: PieceEngine, name: str, done: threading.Semaphore, events: list):
    def deliver(event) -> None:  # on the scheduler's thread, between the engine's calls
        engine.calls.append((name, len(event.ids)))
        events.append(event)
        if event.finish:
            done.release()

    return deliver


def test_a_long_prompt_is_prefilled_a_piece_per_turn_while_a_running_row_streams():
    """A 40-token prompt beside a running sequence: its pieces (8 tokens, the rest of whole pieces, then
    16 and 16) run one per turn, a decode chunk between each, and the running sequence gets tokens after
    each; the long one gets its first token from its last piece, then its tokens. /metrics counts the
    pieces."""
    engine = PieceEngine(slots=2, length=128, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    done = threading.Semaphore(0)
    running: list = []
    long: list = []
    try:
        with scheduler._wake:  # both taken in one turn
            scheduler.submit(
                [
                    Sequence(
                        [1, 2, 3], 20, Sampling(0.0), _recording(engine, "running", done, running)
                    )
                ]
            )
            scheduler.submit([Sequence(list(range(1, 41)), 6, Sampling(0.0), _recording(engine, "long", done, long))])  # fmt: skip
        assert done.acquire(timeout=10) and done.acquire(timeout=10)
    finally:
        scheduler.close()
    assert engine.calls[:11] == [
        ("prefill", [(1, 0, 8)]), ("admit", [0]), ("running", 1), ("decode", 2), ("running", 4),
        ("prefill", [(1, 8, 24)]), ("decode", 2), ("running", 4),
        ("prefill", [(1, 24, 40)]), ("long", 1), ("decode", 2),
    ]  # fmt: skip
    assert sum(len(e.ids) for e in running) == 20 and sum(len(e.ids) for e in long) == 6
    assert running[-1].finish == long[-1].finish == "length"
    assert scheduler.counters.prefill_pieces == 3 and scheduler.counters.prompt_tokens == 43


def test_a_sequence_cancelled_between_its_pieces_frees_its_row():
    """Cancelled after its first piece, a long prompt's sequence gets "cancelled", runs no more pieces,
    and its row serves the next request."""
    engine = PieceEngine(slots=1, length=128, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    done = threading.Semaphore(0)
    events: list = []
    sequence = Sequence(
        list(range(1, 41)), 6, Sampling(0.0), _recording(engine, "long", done, events)
    )
    engine.on_piece = lambda pieces: scheduler.cancel(sequence)
    try:
        scheduler.submit([sequence])
        assert done.acquire(timeout=10)
        engine.on_piece = lambda pieces: None
        assert events[-1].finish == "cancelled" and not any(e.ids for e in events)
        assert [call for call in engine.calls if call[0] == "prefill"] == [("prefill", [(0, 0, 8)])]
        assert _ask(scheduler, 5) == [7] * 5
    finally:
        scheduler.close()
    assert scheduler.busy == 0


class PrefixPieceEngine(PrefixEngine):
    """:class:`PrefixEngine` that prefills prompts longer than 16 tokens in pieces of 16, as
    :class:`PieceEngine` does."""

    piece = 16
    prefill = PieceEngine.prefill

    def on_piece(self, pieces) -> None:
        pass


def test_a_prompt_in_pieces_reuses_no_prefix_and_is_kept_after_its_last_piece():
    """With prefix caching, a 41-token prompt goes in pieces (9, 16, 16) and its first 32 tokens are kept
    after its last piece; a prompt sharing 40 of them, whose 10 tokens after the stored 32 fit a piece,
    reuses them in one call; one whose 28 after them do not goes in pieces from its first token (and
    is kept, 48 tokens, in the other entry)."""
    engine = PrefixPieceEngine(slots=1, length=128, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    shared = list(range(1, 41))
    done = threading.Semaphore(0)
    try:
        for ids in (shared + [3], shared + [5, 6], shared + list(range(50, 70))):
            scheduler.submit(
                [Sequence(ids, 2, Sampling(0.0), lambda e: e.finish and done.release())]
            )
            assert done.acquire(timeout=10)
    finally:
        scheduler.close()
    assert engine.calls == [
        ("prefill", [(0, 0, 9)]), ("prefill", [(0, 9, 25)]), ("prefill", [(0, 25, 41)]),
        ("keep", [(0, 0, 32)]),
        ("admit", [(0, (0, 32))]),
        ("prefill", [(0, 0, 12)]), ("prefill", [(0, 12, 28)]), ("prefill", [(0, 28, 44)]),
        ("prefill", [(0, 44, 60)]), ("keep", [(0, 1, 48)]),
    ]  # fmt: skip
    assert scheduler.counters.reused_tokens == 32 and scheduler.counters.prefill_pieces == 7


class GuessingEngine(ColumnsEngine):
    """:class:`ColumnsEngine` with prompt lookup: a guessing chunk writes ``lookup + 1`` columns a step
    (as many steps as fit before the end), gives each of its rows two tokens a step, and reports each
    busy row rolled right by the columns of the guesses it did not keep; every decode's ``guess`` is
    recorded."""

    lookup = 3

    def __init__(self, slots: int, length: int, chunk: int) -> None:
        super().__init__(slots, length, chunk)
        self.guesses: list[bool] = []

    def decode(self, steps: int, rows: int, allowed=None, guess=False) -> None:
        self.guesses.append(guess)
        if not guess:
            return super().decode(steps, rows, allowed)
        width = self.lookup + 1
        busy = np.arange(self.slots) < rows
        clock = self.clock + self.ahead  # after the unread chunks
        run = min(
            steps, -(-int(self.left[busy].max(initial=0)) // 2), (self.length - clock) // width
        )
        assert run > 0, "a guessing chunk with no step that fits"
        count = np.where(busy, np.minimum(self.left, 2 * run), 0)
        moved = np.where(busy & (self.left > 0), run * width - count, 0)
        self.left -= count
        self.rows_run.append(rows)
        self._chunk(count, run * width, self.chunk * width, moved)


def test_guessing_chunks_move_rows_left_when_their_columns_run_out():
    """A greedy request alone guesses every chunk: each writes 16 columns for 8 tokens, its row rolls
    right, and once a chunk would run past the end every row moves left as far as its first column
    allows; all 40 tokens arrive. A sampled request, or more busy rows than ``lookup_rows``, decode
    plainly."""
    engine = GuessingEngine(slots=8, length=64, chunk=4)
    scheduler = Scheduler(engine, eos=[], max_queue=8)
    try:
        assert _ask(scheduler, 40) == [7] * 40
        assert set(engine.guesses) == {True} and engine.shifts == [-16, -16]
        engine.guesses.clear()
        done = threading.Event()
        scheduler.submit(
            [Sequence([1, 2], 20, Sampling(temperature=0.7), lambda e: e.finish and done.set())]
        )
        assert done.wait(10) and set(engine.guesses) == {False}
        engine.guesses.clear()
        finished: list[str] = []
        scheduler.submit(
            [
                Sequence(
                    [1, 2],
                    12,
                    Sampling(temperature=0.0),
                    lambda e: e.finish and finished.append(e.finish),
                )
                for _ in range(scheduler.lookup_rows + 1)
            ]
        )
        deadline = time.monotonic() + 10
        while len(finished) < scheduler.lookup_rows + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.guesses[0] is False and len(finished) == scheduler.lookup_rows + 1
    finally:
        scheduler.close()
