"""Prefix caching: which prompt prefixes the engine's prefix store holds, and which each request reuses.

The engine (:class:`hfax.generation.slots.SlotEngine`) holds a few entries of a prompt's first tokens'
keys and values (:meth:`~hfax.generation.slots.SlotEngine.keep` copies them from the row a prompt was
prefilled into); :class:`Prefixes` is the host's index of them: each entry's tokens, least recently used
first. When a request is admitted, :meth:`Prefixes.plan` finds the entry sharing the longest prefix with
its prompt (compared token by token: a small store makes that cheaper than hashing) and, when its
prompt's tokens past that prefix fill a smaller bucket than the whole prompt, the request prefills only
those, attending to the stored ones. Its prompt, in whole :data:`BLOCK`-token blocks up to the store's
entry length, is then kept in the least recently used entry unless one holds it already: the next
request with the same system prompt, few-shot examples or context finds it.

Requests admitted together in one turn of the scheduler may share a prefix that no entry holds yet (two
clients sending one system prompt at once, or ``n`` choices of one prompt): the first is prefilled whole
and kept, the later ones reuse what it kept. Each :class:`Plan` says in which ``phase`` of the turn its
request runs: after the phase in which the entry it reads is written. An entry read or written in a turn
is not overwritten in that turn.

A reused prefix gives the tokens and log-probabilities the request gets without it (keys and values at a
position depend only on the tokens up to it, and the engine attends to them by position; see
:mod:`hfax.backends.jax.slots`). tests/test_serve_prefixes.py checks that through the openai client
against transformers' ``generate``.
"""

from __future__ import annotations

import dataclasses

from hfax.generation.slots import Reuse, SlotEngine

#: Tokens per block: a prompt is kept in whole blocks, and a prefix reused only when it spans one or more.
BLOCK = 16


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one request is admitted: the stored prefix it reuses (``reuse``; ``None``: prefilled whole),
    the entry it is kept in afterwards with how many of its first tokens (``keep``; ``None``: not kept),
    the ``phase`` of the turn it runs in, and the buckets of the stored columns it reads (``held``) and
    of the tokens it prefills (``rest``), which together take the :attr:`columns` before the engine's
    clock (:meth:`~hfax.generation.slots.SlotEngine.columns`)."""

    reuse: Reuse | None
    keep: tuple[int, int] | None
    phase: int
    held: int  # the stored prefix's bucket (0 without one)
    rest: int  # the bucket of the tokens prefilled

    @property
    def columns(self) -> int:
        return self.held + self.rest

    @property
    def group(self) -> tuple[int, int, int]:
        """Requests of one phase with the same stored bucket and rest's bucket prefill together."""
        return self.phase, self.held, self.rest


class Prefixes:
    """The host's index of ``engine``'s prefix store (see the module docstring)."""

    def __init__(self, engine: SlotEngine) -> None:
        self.engine = engine
        self.held: list[list[int]] = [[] for _ in range(engine.prefixes)]
        self._used = [0] * engine.prefixes  # when each entry was last read or written
        self._clock = 0
        self._written: dict[
            int, int
        ] = {}  # this turn: entry -> the phase after which it is written
        self._read: set[int] = set()  # this turn: entries requests read

    def turn(self) -> None:
        """Start planning a new turn of admissions (every keep of the last one has run)."""
        self._written, self._read = {}, set()

    def forget(self) -> None:
        """Hold nothing (after an engine failure, when what the entries hold is unknown)."""
        self.held = [[] for _ in self.held]
        self.turn()

    def plan(self, ids: list[int], reusing: bool = True) -> Plan:
        """How a request of prompt ``ids`` would be admitted now (nothing changes until :meth:`commit`);
        without ``reusing``, prefilled whole."""
        shared, entry = max(
            ((_common(held, ids), entry) for entry, held in enumerate(self.held)), default=(0, -1)
        )
        count = min(shared, len(ids) - 1)  # the last token is prefilled: its logits choose the next
        engine = self.engine
        reuse = None
        if reusing and count >= BLOCK and engine.bucket(len(ids) - count) < engine.bucket(len(ids)):
            reuse = Reuse(entry, count)
        phase = self._written[entry] + 1 if reuse and entry in self._written else 0
        kept = min(len(ids), engine.prefix_length) // BLOCK * BLOCK
        keep = None
        if kept >= BLOCK and shared < kept:
            taken = {*self._written, *self._read, *([entry] if reuse else [])}
            free = [e for e in range(len(self.held)) if e not in taken]
            if free:
                keep = (min(free, key=self._used.__getitem__), kept)
        held = engine.bucket(reuse.count) if reuse else 0
        return Plan(
            reuse, keep, phase, held, engine.bucket(len(ids) - (reuse.count if reuse else 0))
        )

    def commit(self, plan: Plan, ids: list[int]) -> None:
        """Record that the request of prompt ``ids`` is admitted as ``plan`` says."""
        self._clock += 1
        if plan.reuse is not None:
            self._read.add(plan.reuse.entry)
            self._used[plan.reuse.entry] = self._clock
        if plan.keep is not None:
            entry, count = plan.keep
            self.held[entry] = list(ids[:count])
            self._written[entry] = plan.phase
            self._used[entry] = self._clock


def _common(a: list[int], b: list[int]) -> int:
    """How many first tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
