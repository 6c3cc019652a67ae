"""``hfax serve``: an OpenAI-compatible server with continuous batching, for any model a backend can serve.

    hfax serve -m MODEL --max-batch 8        then   POST http://127.0.0.1:8000/v1/chat/completions

:mod:`hfax.serve.scheduler` batches requests on the slot engine the backend declares
(:meth:`hfax.Backend.serving_engine`), :mod:`hfax.serve.requests` checks OpenAI's request fields,
:mod:`hfax.serve.app` is the HTTP API (Starlette and uvicorn), :mod:`hfax.serve.command` the command
line that :mod:`hfax.serve.plugin` adds to ``hfax``.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import numpy as np

from hfax.generation.rows import Sampling
from hfax.generation.slots import Admission, Piece, SlotEngine
from hfax.specs import Backend

log = logging.getLogger("hfax.serve")

#: Decode steps per chunk: how often new requests may join and tokens reach their clients. A row that
#: finishes mid-chunk idles until the chunk ends, and a request arriving meanwhile waits for the next one,
#: so shorter chunks keep more rows busy; each chunk costs host work, which a lone client feels in short
#: chunks (``benchmarks/serve.py`` measures it; docs/PERFORMANCE.md, "Serving").
CHUNK = 4

#: Prompt tokens per prefill piece when ``--prefill-chunk`` is not given. A prompt longer than a piece is
#: prefilled a piece per scheduler turn, a decode chunk between pieces, so a running stream waits for one
#: piece, not a whole prompt; each piece reads its row's earlier ones again and pads its first piece
#: into a whole one, so smaller pieces cost more in all. 256 keeps a piece's wait near a decode chunk's
#: on a CPU for a small model while adding little to a long prompt's first token; on an accelerator a
#: piece of 256 tokens still fills the matrix units (docs/PERFORMANCE.md, "hfax serve: prefill in pieces").
PIECE = 256

#: Tokens a decode step guesses per row by prompt lookup when ``--prompt-lookup`` is not given: a step
#: feeds each row its last token and this many guesses, the model checks them all in one forward, and a
#: row keeps the guesses its greedy choice agrees with (:func:`hfax.backends.jax.slots._speculate`). On a
#: device bound by reading its weights (a few rows) that forward costs about one token's, so every guess
#: kept is a token for free; a guess the model rejects costs its share of the forward. 3 gave the most
#: tokens per second for one client in docs/PERFORMANCE.md, "Prompt lookup".
LOOKUP = 3


def context_length(model: Any, requested: int | None) -> int:
    """The columns of each row: ``requested``, else the model's positions up to 1024 (each row holds its
    columns' keys and values, and a decode whose requests hold more than a short window reads them all)."""
    config = model.config.get_text_config(decoder=True)
    positions = getattr(config, "max_position_embeddings", None) or 1024
    if requested is None:
        return min(positions, 1024)
    if requested < 32 or requested > positions:
        raise ValueError(
            f"--max-len {requested}: choose from 32 to the model's {positions} positions"
        )
    return requested


def prefill_piece(requested: int | None, length: int) -> int:
    """The prompt tokens per prefill piece for rows of ``length`` columns: ``requested`` (0: every prompt
    prefilled whole), else :data:`PIECE` where rows hold more, else 0."""
    if requested is None:
        return PIECE if PIECE < length else 0
    if not 0 <= requested < length:
        raise ValueError(
            f"--prefill-chunk {requested}: give 0 (prefill every prompt whole) or fewer tokens than a "
            f"row's {length} (--max-len)"
        )
    return requested


def engine(
    backend: Backend,
    model: Any,
    slots: int,
    length: int,
    chunk: int = CHUNK,
    prefixes: int = 0,
    piece: int = 0,
    lookup: int = 0,
) -> SlotEngine:
    """``backend``'s slot engine for ``model`` (:meth:`hfax.Backend.serving_engine`) with a store of
    ``prefixes`` prompt prefixes and prompts longer than ``piece`` tokens prefilled in pieces, its
    programs compiled by throwaway requests: for every power of two of busy rows a decode program (over
    the engine's short window of columns, if it has one, and over whole rows), a
    prefill of that many one-token prompts admitted together (requests arriving together, or one
    request's ``n`` choices, then compile nothing until a longer prompt comes), and a prefill of that
    many pieces (long prompts then compile nothing); with ``lookup`` guesses a step, the decodes that
    guess (prompt lookup) for every power of two of rows up to the scheduler's ``LOOKUP_ROWS``."""
    from hfax.serve.scheduler import LOOKUP_ROWS

    slot_engine = backend.serving_engine(
        model,
        slots=slots,
        length=length,
        chunk=chunk,
        prefixes=prefixes,
        piece=piece,
        lookup=lookup,
    )
    guessing = LOOKUP_ROWS if slot_engine.lookup else 0
    slot_engine.restart(slot_engine.bucket(1))
    rows = 1
    while rows < 2 * slots:
        busy = min(rows, slots)
        slot_engine.admit([Admission(row, [0], Sampling(), 2) for row in range(busy)])
        slot_engine.decode(1, busy)
        slot_engine.read()
        if busy <= guessing:
            slot_engine.admit([Admission(row, [0], Sampling(0.0), 2) for row in range(busy)])
            slot_engine.decode(1, busy, guess=True)
            slot_engine.read()
        rows *= 2
    if slot_engine.piece:
        slot_engine.restart(slot_engine.piece)
        rows = 1
        while rows < 2 * slots:
            pieces = [
                Piece(Admission(row, [0], Sampling(), 2), 0, 1) for row in range(min(rows, slots))
            ]
            slot_engine.prefill(pieces)
            rows *= 2
    slot_engine.move(0, 0)
    slot_engine.release(np.ones((slots,), bool))
    rows = 1
    while rows < 2 * slots:  # with no row busy: a decode over whole rows, which runs no step
        slot_engine.decode(1, min(rows, slots))
        slot_engine.read()
        if min(rows, slots) <= guessing:
            slot_engine.decode(1, min(rows, slots), guess=True)
            slot_engine.read()
        rows *= 2
    slot_engine.shift(0)
    slot_engine.restart(0)  # and the warm-up's columns hidden
    return slot_engine


def run(
    backend: Backend,
    model: Any,
    tokenizer: Any,
    name: str,
    *,
    host: str,
    port: int,
    max_batch: int,
    max_queue: int,
    max_len: int | None,
    drain: float,
    prefixes: int = 0,
    prefill_chunk: int | None = None,
    lookup: int = LOOKUP,
) -> None:
    """Serve ``model``, which ``backend`` built, on ``host:port`` until interrupted; in-flight requests get
    ``drain`` seconds to end; prompts' prefixes are kept in a store of ``prefixes`` entries for requests
    that begin with them (:mod:`hfax.serve.prefixes`); prompts longer than ``prefill_chunk`` tokens
    (:func:`prefill_piece`) are prefilled in pieces between decode chunks; while few rows are busy and
    all of them greedy, each decode step guesses ``lookup`` tokens a row by prompt lookup (0: none)."""
    import uvicorn

    from hfax.serve import tools
    from hfax.serve.app import Server, build
    from hfax.serve.scheduler import Scheduler

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    length = context_length(model, max_len)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    piece = prefill_piece(prefill_chunk, length)
    slot_engine = engine(
        backend, model, max_batch, length, prefixes=prefixes, piece=piece, lookup=lookup
    )
    if prefixes and slot_engine.prefix_refusal:
        log.warning("hfax serve: prefix caching is off: %s", slot_engine.prefix_refusal)
    if piece and slot_engine.piece_refusal:
        log.warning("hfax serve: prompts are prefilled whole: %s", slot_engine.piece_refusal)
    scheduler = Scheduler(slot_engine, eos, max_queue)
    template = tools.response_template(tokenizer, model.config)
    server = Server(scheduler, tokenizer, name, length, template)
    server.formats.prepare()
    if template is None:
        log.info('hfax serve: tool_choice "auto" is refused: no response template for this model')
    config = uvicorn.Config(
        build(server), host=host, port=port, timeout_graceful_shutdown=drain, log_level="info"
    )
    # uvicorn drains on SIGINT or SIGTERM, then raises the signal again for the process: a stop asked for
    # is a clean exit here.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        uvicorn.Server(config).run()
    except (KeyboardInterrupt, Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


class Stopped(Exception):
    """SIGTERM, after uvicorn's graceful shutdown."""


def _stopped(signum: int, frame: Any) -> None:
    raise Stopped
