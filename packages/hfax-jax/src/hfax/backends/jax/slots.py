"""Continuous batching on the JAX backend: a fixed number of rows ("slots") in one compiled decode program.

    engine = SlotEngine(model, slots=8, length=1024, chunk=8)
    engine.admit([Admission(row, ids, sampling, max_new), ...])
                                                      prefill prompts into their rows together   (one program)
    engine.decode(steps)                              up to ``steps`` tokens in every busy row    (one program)
    engine.decode(1, allowed=bitmask)                 one token per busy row, among those allowed (one program)
    engine.read()                                     the oldest unread chunk's tokens, per row, on the host
                                                      (a decode may start before the last is read)
    engine.release(rows) / engine.shift(delta)        free rows / move every row's cache        (one program)
    engine.move(source, target)                       one request to another row                  (one program)
    engine.restart(clock)                             every row free: move the clock only         (one program)
    engine.keep([Kept(row, entry, count), ...])       a prompt's first tokens into the prefix store (one program)
    engine.admit([Admission(..., reuse=Reuse(entry, count)), ...])
                                                      prefill prompts after their stored prefixes (one program)
    engine.prefill([Piece(admission, start, end), ...])
                                                      the next piece of long prompts, between decode chunks
                                                                                                  (one program)

The cache holds ``length`` columns per row. All rows write the token they feed at the same column, the
``clock``, which advances by one per decode step, so one step is exactly the forward of
:meth:`hfax.backends.jax.generation.Forward.decoder` that ``generate``'s decode runs (one traced write slot, in-place
cache updates). Requests admitted together at clock ``t`` are one forward over ``[k, bucket]``, their
prompts left-padded into the bucket of the longest, each written into its row at columns ``[t - bucket,
t)``; its tokens then follow at ``t, t + 1, ...``. Its positions are its own (passed
explicitly) and ``valid`` hides every column of the row that holds another request's leftovers, so the
tokens are those it gets alone: keys and queries stay one column apart per position, as sliding windows
need. When the clock would run past the end for a new request, :meth:`SlotEngine.shift` moves every row
left (or right) by the same amount, one copy of the cache.

Per-row sampling settings, seeds, steps and token limits are traced arrays (:mod:`hfax.generation.rows`),
so a stream of requests compiles one prefill per prompt bucket and power of two of requests admitted
together (``k`` is padded with rows that are computed and written nowhere), one decode per power of two of
busy rows and window (below), and one each of shift, move, restart, release and start.

Decode windows. A decode runs over the leading rows only, and over the fewest columns of
:attr:`SlotEngine.windows` (a short window, :func:`short_window`, then whole rows) that hold every column
its unfinished rows hold and the columns its steps write: :func:`_leading` copies those columns out, runs
the steps, and writes them back. Why the tokens are those of whole rows: every column outside the window
holds nothing an unfinished row's query sees (``valid`` hides it), and inside it the distance between
two columns is unchanged, so sliding windows and chunked attention see what they see over whole rows. The
host knows each row's prompt columns (recorded for prefix caching, moved by shifts and moves) and which
rows may be unfinished (admitted, or given their last piece; dropped once a read shows them finished or
they are released).
packages/hfax-jax/tests/test_slots.py
(``test_decodes_over_a_short_window_of_columns_get_their_generate_tokens``) checks it.

Chunks in flight. A decode program returns its chunk's tokens, each row's ``finished`` and the clock as
arrays of their own beside the state (:func:`_report`): the next program takes the state and donates it,
so a chunk can be read after the next one has started, and :meth:`SlotEngine.read` returns the chunks
oldest first. The host's clock is the last read chunk's; :attr:`SlotEngine.ahead`, the most columns the
unread chunks write, is what a decode's window counts from it (they only roll rows right, so the host's
record of a row's first column is at or before the row's). What places columns by the clock (admit,
prefill, keep, shift, move, restart) is refused until every chunk is read.
``test_chunks_decoded_before_the_last_is_read_get_their_generate_tokens`` checks it.

Prefix caching. With ``prefixes`` entries the engine holds a store beside the cache: per layer, arrays
shaped as the cache's but ``[prefixes, ..., prefix_length, ...]``. :meth:`SlotEngine.keep` gathers the
first ``count`` prompt tokens' keys and values of a row into an entry, left-aligned (entry column ``p``
holds position ``p``), from the columns the engine recorded at admission (moved by shifts and moves). An
admission that reuses ``count`` tokens of an entry prefills only the rest of its prompt
(:func:`reuse_program`): one forward over the rest, left-padded into its bucket, at positions ``count,
count + 1, ...``, into a small cache whose first ``held`` columns (the bucket of the longest reused
prefix) hold the entry's, rolled right so that its ``count`` tokens end just before the rest's first
token; those ``held + bucket`` columns are then written into the row ending at the clock, exactly as a
whole prompt's bucket is. Why the tokens are those the prompt gets prefilled whole: a key or value at
position ``p`` depends only on the tokens up to ``p`` (causal attention), so the stored ones are the
ones a whole prefill computes, up to rounding; positions are passed explicitly, ``valid`` hides every
other column, and the prompt's tokens sit in consecutive columns ending at the clock, as in a whole
prefill, so sliding windows and chunked attention counted in columns see what they see there (the
stored tokens rolled among the rest's padding columns stay as loaded: ``kept``). Models whose window
is counted from a forward's first query get no store (:func:`split_refusal`; ``hfax serve`` then
prefills every prompt whole), and recurrent models are not served at all. Programs: the admission,
keep and store programs of requests without a reused prefix are unchanged; a reusing prefill compiles
per pair of buckets (stored, rest) and power of two of requests when first needed, and a keep (every
entry's row of it, padding or not) per bucket of tokens kept, all when the engine is made.
packages/hfax-jax/tests/test_slots.py (``test_prompts_reusing_a_stored_prefix_get_their_generate_tokens``,
Llama and Gemma 3 with a window of 4; a Llama 4 with chunks of 4) and tests/test_serve.py (through the openai client, against
transformers; a Mistral with a window of 5 through the scheduler) check it.

Prefilling in pieces. With ``piece`` above 0 a long prompt can be prefilled a :class:`Piece` at a time
(:meth:`SlotEngine.prefill`, :func:`piece_program`), with decode chunks of the other rows between pieces,
so that they keep streaming while it prefills. The short piece goes first (what whole pieces leave
over, left-padded into ``piece`` columns), every later one holds ``piece`` tokens. Each piece is
written into columns ``[clock - piece, clock)`` of its row at its own positions, after the row's earlier
tokens have been moved (a roll of that row alone) to end just before it: so the prompt's tokens always
sit in consecutive columns ending at the clock, as a prompt prefilled whole does, and after its last
piece the row is one a whole prefill would have made, up to which columns hold padding. The columns
the decode steps between pieces wrote into the reserved row (every row writes at the clock) end up
past the clock or under the next piece, and ``valid`` hides them. The row stays finished (it produces
no token) until its last piece, which chooses its first token. Why the tokens are those of a whole
prefill: keys and values at a position depend only on the tokens up to it, each query sees exactly its
prompt's earlier tokens, and every column distance between two of them is their position distance, so
sliding windows and chunked attention see what they see in a whole prefill (the tiny Gemma 3 of
packages/hfax-jax/tests/test_slots.py, window 4, checks it). Only a window counted back from the first
query of a forward (``Span.cached_only``) would see otherwise; such a model's prompts are prefilled
whole (:func:`split_refusal`, the rule prefix caching answers to as well). Programs: one per power of
two of pieces prefilled together, each piece padded into ``piece`` columns, and ``hfax serve`` compiles
them all when the engine is made (:func:`hfax.serve.engine`), so a long prompt compiles nothing while
serving; with a first token ``allowed`` (a grammar) its own program per power of two, when first
needed. packages/hfax-jax/tests/test_slots.py
(``test_a_long_prompt_prefilled_in_pieces_beside_a_decoding_row_gets_its_generate_tokens``) and
tests/test_serve.py (``test_a_long_prompt_prefilled_in_pieces_answers_as_transformers``) check it.

Prompt lookup. An engine made with ``lookup`` above 0 also decodes in guessing chunks
(``decode(..., guess=True)``, :func:`_speculate`): each step feeds every row its last token and
``lookup`` guesses (:func:`lookup`: what followed the first earlier occurrence of its last few tokens in
``history``, each row's tokens by position, which admissions write and every decode step extends) at
the next positions, in one forward over ``lookup + 1`` columns from the clock; a greedy row without a
penalty or a bias keeps the guesses its choice agrees with and its own token after them, every other
row its one token, chosen as a plain step chooses it. The clock moves ``lookup + 1`` columns a step;
a row that kept fewer guesses hides the columns of the others and rolls right by their number (the
chunk's ``moved``, which the host adds to its record of the row's columns), so its tokens end at the
clock in consecutive columns, as plain steps leave them: sliding windows and chunks counted in columns
see what they see there. Every decode's output holds a guessing chunk's tokens, so one state shape
serves both kinds and nothing compiles twice. Programs: a guessing decode per power of two of rows and
window, and one that writes admitted prompts into ``history``.
packages/hfax-jax/tests/test_slots.py
(``test_decodes_guessing_by_prompt_lookup_get_their_generate_tokens``, Llama and Gemma 3 with a window
of 4) and tests/test_serve.py check it.

A row with a grammar (OpenAI's ``response_format``) needs the tokens it may choose next, which the host
knows only once the token before it is back. While such a row is busy the scheduler asks for one step at
a time with ``allowed``, a packed bitmask ``[slots, ceil(vocab / 32)]`` that is an input of programs of
their own (``serve_step``, and ``serve_admit`` given ``allowed`` for first tokens), which apply it after
the penalties (:func:`rows.allow`); the programs without it are the ones above, unchanged, so requests
without a grammar pay nothing while no grammar runs. The grammar programs compile when the first request
with a grammar needs them (one step program per power of two of busy rows, one prefill per prompt bucket
and power of two of requests).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hfax import masks
from hfax.backends.jax import cache as slot_cache
from hfax.backends.jax import decode_layout, mesh, monitor
from hfax.backends.jax.generation import (
    Forward,
    Static,
    Window,
    _on_torch,
    _state_sharding,
    _wait,
)
from hfax.generation import processors, rows, tokens
from hfax.generation.shapes import (
    MIN_LENGTH_BUCKET,
    accepts,
    bucket,
    cache_argument,
    no_static_cache,
)
from hfax.generation.slots import Admission, Chunk, Kept, Piece, Scored


def check_servable(model: Any, length: int) -> None:
    """Refuse a model the slot engine cannot run in rows of ``length`` slots, naming what it lacks, before
    anything compiles."""
    name = type(model.module).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        raise NotImplementedError(
            f"hfax serve runs decoder-only models; {name} is an encoder-decoder"
        )
    reason = no_static_cache(model.module, length)
    if reason:
        raise NotImplementedError(
            f"hfax serve needs a static cache, and {name} cannot have one: {reason}"
        )
    if not cache_argument(model.module) or not accepts(model.module, "position_ids"):
        raise NotImplementedError(
            f"hfax serve needs a model whose forward takes a transformers Cache and position_ids; {name} does not"
        )
    kinds = {kind for kind, _ in slot_cache.layer_types(model.config) or ()}
    if kinds - set(slot_cache.ATTENTION_TYPES):
        raise NotImplementedError(
            f"hfax serve runs models whose layers are all attention; {name} has {sorted(kinds)} layers "
            "(use model.generate for it)"
        )
    if masks.form(model.config, model.module).two_d:
        raise NotImplementedError(
            f"{name} builds its own attention masks, which hfax serve cannot give per row"
        )


def _static(model: Any, prompt: int, chunk: int) -> Static:
    return Static(
        decoding=tokens.Decoding(
            steps=(), do_sample=False, num_beams=1, prompt=prompt, capacity=chunk
        ),
        layer_types=slot_cache.layer_types(model.config),
        mask_form=masks.form(model.config, model.module),
        cache_argument=cache_argument(model.module),
        pass_positions=True,
        logits_to_keep=accepts(model.module, "logits_to_keep"),
    )


@dataclasses.dataclass(frozen=True)
class SlotStatic:
    """The static part of the admit and decode programs: the forward's, and how the weights and cache
    are held."""

    step: Static
    layout: decode_layout.DecodeLayout
    rows: int = 0  # decode: how many leading rows it runs
    columns: int = 0  # decode: how many columns of them, from a traced start (0: all)
    held: int = 0  # a prefill reusing stored prefixes: the columns of each entry it reads
    # decode: tokens each step guesses per row by prompt lookup (:func:`_speculate`)
    drafts: int = 0
    # the engine's guesses a step: every decode's output holds a guessing chunk's tokens, and every
    # decode step extends each row's ``history`` (0: no decode touches it)
    lookup: int = 0

    @property
    def capacity(self) -> int:
        """The tokens a decode chunk can give a row: a guessing step's guesses and its own token per step,
        for every decode of the engine (one shape of the state's output, so that no program compiles
        twice for a state that a guessing decode or a plain one left)."""
        return self.step.decoding.capacity * (self.lookup + 1)


def slot_layout(model: Any, slots: int) -> decode_layout.DecodeLayout:
    """How the engine holds its weights and cache: as ``generate``'s decode loops do
    (:func:`hfax.backends.jax.decode_layout.choose`), without the transposed weight copy: on CPU the slot
    loop runs slower with it (its busy rows vary from chunk to chunk), and it would add those weights'
    memory."""
    static = _static(model, 0, 1)
    layout = decode_layout.choose(
        model, layer_types=static.layer_types, encoder_decoder=False, rows=slots, steps=0
    )
    return dataclasses.replace(layout, transposed=frozenset())


def _slot_axes(model: Any, static: Static) -> dict[str, int]:
    """The column axis of every per-column array of a layer's state (keys are stored transposed in place)."""
    in_place = decode_layout.in_place_cache(model, static.layer_types, encoder_decoder=False)
    return {**slot_cache.SLOT_AXES, "keys": 3} if in_place else slot_cache.SLOT_AXES


def _row_arrays(slots: int) -> dict[str, np.ndarray]:
    """Every row's settings and counters, ``[slots, ...]``; the token counts are added by
    :func:`start_program`, which knows the vocabulary."""
    sampling = rows.Sampling().arrays()
    counters = {"last": np.int32(0), "position": np.int32(0), "step": np.int32(0)}
    per_row = {**sampling, **counters, "limit": np.int32(0), "finished": np.bool_(True)}
    return {
        name: np.ascontiguousarray(np.broadcast_to(value, (slots, *np.shape(value))))
        for name, value in per_row.items()
    }


def start_program(
    model: Any, params: Any, valid: Any, table: Any, static: Static
) -> dict[str, Any]:
    """Every row free, its buffers made by one forward of a filler token through a cache of the full
    length; each row's count of every token it generated (``counts``, ``[slots, vocab]``, for the
    penalties of :func:`rows.adjust`) zero, and its tokens by position (``history``, ``[slots, length]``,
    what prompt lookup searches: :func:`lookup`) zero."""
    slots = valid.shape[0]
    ids = jnp.zeros((slots, 1), jnp.int32)
    layout = slot_layout(model, slots)
    window = Window(ids, ids, valid, jnp.zeros((1,), jnp.int32))
    logits, states, _ = Forward(model, static, layout, params).decoder(window, None)
    table = {
        **table,
        "counts": jnp.zeros((slots, logits.shape[-1]), jnp.int32),
        "history": jnp.zeros(valid.shape, jnp.int32),
    }
    return {"states": states, "valid": valid, "clock": jnp.int32(0), "rows": table}


def _output(slots: int, chunk: int) -> dict[str, Any]:
    top = rows.TOP_LOGPROBS
    return {
        "tokens": jnp.zeros((slots, chunk), jnp.int32),
        "logprobs": jnp.zeros((slots, chunk), jnp.float32),
        "top_ids": jnp.zeros((slots, chunk, top), jnp.int32),
        "top_logprobs": jnp.zeros((slots, chunk, top), jnp.float32),
        "count": jnp.zeros((slots,), jnp.int32),
        "moved": jnp.zeros((slots,), jnp.int32),
    }


def _choose(
    logits: Any, settings: dict[str, Any], step: Any, busy: Any, allowed: Any = None
) -> dict[str, Any]:
    """:func:`rows.choose` doing only the work the ``busy`` rows need (one branch per :data:`rows.WORKS`),
    from logits :func:`rows.adjust` adjusted only when a busy row has a penalty or a bias, then narrowed
    to the tokens ``allowed`` (a packed bitmask, :func:`rows.allow`) when given."""
    needed = _on_torch(rows.work_needed, settings, busy)
    adjusted = jax.lax.cond(
        _on_torch(rows.adjusts, settings, busy),
        lambda: _on_torch(rows.adjust, logits, settings),
        lambda: logits.astype(jnp.float32),
    )
    if allowed is not None:
        adjusted = _on_torch(rows.allow, adjusted, allowed)
    branches = [
        lambda logits, adjusted, settings, step, work=work: _on_torch(
            lambda *args: rows.choose(*args[:3], work, args[3]), logits, settings, step, adjusted
        )
        for work in rows.WORKS
    ]
    return jax.lax.switch(needed, branches, logits, adjusted, settings, step)


def _counted(counts: Any, token: Any, live: Any) -> Any:
    """``counts`` ``[rows, vocab]`` with each ``live`` row's ``token`` counted once more."""
    return counts.at[jnp.arange(counts.shape[0]), token].add(live.astype(counts.dtype))


def _is_eos(token: Any, eos: Any) -> Any:
    return (token[:, None] == eos[None, :]).any(-1)


def admit_program(
    model: Any,
    params: Any,
    state: dict[str, Any],
    ids: Any,
    mask: Any,
    row: Any,
    settings: dict[str, Any],
    eos: Any,
    allowed: Any,
    static: SlotStatic,
) -> tuple[Any, Any]:
    """Prefill ``ids``/``mask`` (``[k, bucket]``, left-padded) into rows ``row`` (``[k]``) ending at the
    clock, in one forward, and choose each one's first token with its own ``settings`` (``[k, ...]``);
    returns the state and those tokens' :func:`rows.choose` output (``[k, ...]``). A row index of
    ``slots`` or more is padding: it is computed and written nowhere. With ``allowed`` (``[k,
    ceil(vocab / 32)]``, :func:`rows.allow`'s bitmask) each first token is chosen among the tokens its row
    allows; with ``None`` the program has no such input (requests without a grammar pay nothing)."""
    positions = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 1)
    window = Window(ids, positions, mask, jnp.arange(ids.shape[1]))
    counted = jnp.sum(mask, axis=1, dtype=jnp.int32)
    return _prefilled(
        model, params, state, window, None, counted, row, settings, eos, allowed, static
    )


def reuse_program(
    model: Any,
    params: Any,
    state: dict[str, Any],
    store: Any,
    entry: Any,
    reused: Any,
    ids: Any,
    mask: Any,
    row: Any,
    settings: dict[str, Any],
    eos: Any,
    allowed: Any,
    static: SlotStatic,
) -> tuple[Any, Any]:
    """:func:`admit_program` for prompts whose first ``reused`` tokens (``[k]``) entry ``entry`` (``[k]``)
    of the prefix ``store`` holds, before the rest of each prompt, ``ids``/``mask`` (``[k, bucket]``,
    left-padded, at positions ``reused, reused + 1, ...``). One forward over the rest attends to a cache
    of ``static.held + bucket`` columns holding each entry's first ``held`` columns, rolled so that its
    ``reused`` tokens end just before the rest's first: the prompt's tokens sit in consecutive columns
    ending at the clock, as a prompt prefilled whole does, so column distances are position distances
    for sliding windows and chunks. Stored tokens that land among the rest's padding columns stay as
    loaded (``kept``). Those columns are then written into each row ending at the clock."""
    held, prompt = static.held, ids.shape[1]
    width = held + prompt
    axes = _slot_axes(model, static.step)
    # Each prompt's first column after its stored prefix, and its first column: how far right its
    # entry's columns move.
    end = width - jnp.sum(mask, axis=1, dtype=jnp.int32)
    first = end - reused

    def stored(name: str, value: Any) -> Any:
        """Each request's entry's first ``held`` columns with ``prompt`` empty ones after, rolled
        ``first`` columns right."""
        axis = axes[name]
        taken = jax.lax.slice_in_dim(
            jnp.take(value, entry, axis=0, mode="clip"), 0, held, axis=axis
        )
        padding = [(0, 0)] * taken.ndim
        padding[axis] = (0, prompt)
        return jax.vmap(lambda x, d: jnp.roll(x, d, axis=axis - 1))(jnp.pad(taken, padding), first)

    before = [{name: stored(name, value) for name, value in layer.items()} for layer in store]
    columns = jnp.arange(width)[None, :]
    visible = ((columns >= first[:, None]) & (columns < end[:, None])) | (
        jnp.concatenate([jnp.zeros((ids.shape[0], held), bool), mask], axis=1)
    )
    positions = jnp.where(mask, reused[:, None] + jnp.cumsum(mask, axis=1) - 1, 1)
    window = Window(ids, positions, visible, held + jnp.arange(prompt), held)
    counted = reused + jnp.sum(mask, axis=1, dtype=jnp.int32)
    return _prefilled(
        model,
        params,
        state,
        window,
        before,
        counted,
        row,
        settings,
        eos,
        allowed,
        static,
        kept=~mask,
    )


def piece_program(
    model: Any,
    params: Any,
    state: dict[str, Any],
    ids: Any,
    mask: Any,
    row: Any,
    done: Any,
    end: Any,
    last: Any,
    settings: dict[str, Any],
    eos: Any,
    allowed: Any,
    static: SlotStatic,
) -> tuple[Any, Any]:
    """The next piece of ``k`` prompts prefilled in pieces: ``ids``/``mask`` (``[k, piece]``, left-padded;
    only a prompt's first piece is short) at positions ``done, done + 1, ...``, where ``done`` (``[k]``)
    counts the prompt tokens each row ``row`` holds already, the last of them at column ``end - 1``.
    Those earlier tokens move (with their visibility) to end at column ``clock - piece``, the piece
    attends to them and to itself and is written into ``[clock - piece, clock)``, so the prompt's tokens
    sit in consecutive columns ending at the clock, as a prompt prefilled whole does; the columns decode
    steps wrote into the row meanwhile end up past the clock or under the piece, hidden. Rows whose piece
    is ``last`` choose their first token with their ``settings`` and decode from then on; the others
    stay finished (their row reserved, producing nothing). Returns the state and every row's
    :func:`rows.choose` output (``[k, ...]``; read only for the ``last`` ones)."""
    piece = ids.shape[1]
    count, length = state["valid"].shape
    first = state["clock"] - piece
    axes = _slot_axes(model, static.step)
    delta = jnp.where(done > 0, first - end, 0)  # how far each row's earlier tokens move

    def moved(value: Any, axis: int) -> Any:
        """Rows ``row`` of ``value``, each rolled ``delta`` columns along ``axis``."""
        taken = jnp.take(value, row, axis=0, mode="clip")
        return jax.vmap(lambda x, d: jnp.roll(x, d, axis=axis - 1))(taken, delta)

    for layer in state["states"]:
        for name in layer:
            if name not in axes:
                raise NotImplementedError(
                    f"hfax serve cannot place a layer state {name!r} into a row"
                )
    states = [
        {name: moved(value, axes[name]) for name, value in layer.items()}
        for layer in state["states"]
    ]
    source = jnp.arange(length)[None, :] - delta[:, None]  # where each column's contents come from
    earlier = (
        moved(state["valid"], 1)
        & (source >= 0)
        & (source < length)
        & (jnp.arange(length)[None, :] < first)
        & (done[:, None] > 0)
    )
    own = jax.lax.dynamic_update_slice(jnp.zeros(earlier.shape, bool), mask, (0, first))
    visible = earlier | own
    positions = jnp.where(mask, done[:, None] + jnp.cumsum(mask, axis=1) - 1, 1)
    window = Window(ids, positions, visible, first + jnp.arange(piece), first)
    forward = Forward(model, static.step, static.layout, params)
    logits, written, _ = forward.decoder(window, states)
    states = [
        {name: big[name].at[row].set(value.astype(big[name].dtype), mode="drop")
         for name, value in layer.items()}
        for big, layer in zip(state["states"], written)
    ]  # fmt: skip
    valid = state["valid"].at[row].set(visible, mode="drop")
    counted = done + jnp.sum(mask, axis=1, dtype=jnp.int32)
    starting = jnp.where(last, row, count)  # rows still prefilling keep their (finished) settings
    table, chosen = _started(state["rows"], logits, counted, starting, settings, eos, allowed)
    return {**state, "states": states, "valid": valid, "rows": table}, chosen


def _prefilled(
    model: Any,
    params: Any,
    state: dict[str, Any],
    window: Window,
    before: Any,
    counted: Any,
    row: Any,
    settings: dict[str, Any],
    eos: Any,
    allowed: Any,
    static: SlotStatic,
    kept: Any = None,
) -> tuple[Any, Any]:
    """The forward over ``window`` into a cache of its columns holding ``before`` (``None``: empty; its
    ``kept`` columns of the window, ``[k, window]``, left as they are), its columns written into rows
    ``row`` ending at the clock, each row's ``counted`` tokens so far and first token chosen (see
    :func:`admit_program`)."""
    forward = Forward(model, static.step, static.layout, params)
    logits, small, _ = forward.decoder(window, before, kept=kept)
    width = window.valid.shape[1]
    first = state["clock"] - width
    axes = _slot_axes(model, static.step)

    def put(name: str, big: Any, new: Any) -> Any:
        """``new`` (``[k, ...]``) into columns ``[first, clock)`` of each of its rows of ``big``: the
        columns of every row taken out, those rows replaced (padding rows dropped), put back."""
        if name not in axes:
            raise NotImplementedError(f"hfax serve cannot place a layer state {name!r} into a row")
        columns = jax.lax.dynamic_slice_in_dim(big, first, width, axes[name])
        columns = columns.at[row].set(new.astype(big.dtype), mode="drop")
        return jax.lax.dynamic_update_slice_in_dim(big, columns, first, axes[name])

    states = [
        {name: put(name, big[name], value) for name, value in layer.items()}
        for big, layer in zip(state["states"], small)
    ]
    count, length = state["valid"].shape
    rows_valid = jax.lax.dynamic_update_slice(
        jnp.zeros((row.shape[0], length), bool), window.valid, (0, first)
    )
    valid = state["valid"].at[row].set(rows_valid, mode="drop")
    table, chosen = _started(state["rows"], logits, counted, row, settings, eos, allowed)
    return {**state, "states": states, "valid": valid, "rows": table}, chosen


def _started(
    table: dict[str, Any],
    logits: Any,
    counted: Any,
    row: Any,
    settings: dict[str, Any],
    eos: Any,
    allowed: Any,
) -> tuple[dict[str, Any], Any]:
    """Each prompt's first token chosen from its last position's ``logits`` (``[k, vocab]``) with its own
    ``settings``, and the row table with rows ``row`` (``[k]``; ``slots`` or more: padding, written
    nowhere) set to decode after their ``counted`` prompt tokens."""
    count = table["finished"].shape[0]
    live = row < count
    none = jnp.zeros((row.shape[0], logits.shape[-1]), jnp.int32)  # nothing generated yet
    zero = jnp.zeros((row.shape[0],), jnp.int32)
    chosen = _choose(logits, {**settings, "counts": none}, zero, live, allowed)
    token = chosen["token"]
    per_row = {
        **settings,
        "counts": _counted(none, token, live),
        "last": token,
        "position": counted,
        "step": zero + 1,
        "finished": _is_eos(token, eos) | (settings["limit"] <= 1),
    }
    table = {
        **table,
        **{name: table[name].at[row].set(value, mode="drop") for name, value in per_row.items()},
    }
    return table, chosen


def keep_program(
    model: Any,
    state: dict[str, Any],
    store: Any,
    row: Any,
    entry: Any,
    columns: Any,
    static: Static,
) -> Any:
    """The prefix ``store`` with entry ``entry[i]``'s first ``columns.shape[1]`` columns copied from
    columns ``columns[i]`` (``[k, n]``, one per prompt position) of row ``row[i]``; an entry index past
    the store's is padding, written nowhere."""
    axes = _slot_axes(model, static)
    taken = columns.shape[1]

    def kept(name: str, value: Any, big: Any) -> Any:
        axis = axes[name]
        copied = jax.vmap(lambda r, c: jnp.take(big[r], c, axis=axis - 1))(row, columns)
        where = (entry, *[slice(None)] * (axis - 1), slice(0, taken))
        return value.at[where].set(copied, mode="drop")

    return [
        {name: kept(name, value, big[name]) for name, value in layer.items()}
        for layer, big in zip(store, state["states"])
    ]


def store_program(model: Any, state: dict[str, Any], sizes: Any, static: Static) -> Any:
    """An empty prefix store: every layer state of ``state`` with ``sizes.shape`` (entries, columns) in
    place of its rows and columns, split over the mesh as the cache is."""
    axes = _slot_axes(model, static)
    entries, columns = sizes.shape

    def empty(name: str, value: Any) -> Any:
        shape = list(value.shape)
        shape[0], shape[axes[name]] = entries, columns
        zeros = jnp.zeros(shape, value.dtype)
        if model.mesh is None:
            return zeros
        return jax.lax.with_sharding_constraint(zeros, _state_sharding(model.mesh, tuple(shape)))

    return [
        {name: empty(name, value) for name, value in layer.items()} for layer in state["states"]
    ]


def split_refusal(model: Any) -> str:
    """Why a prompt of ``model`` cannot be prefilled in more than one forward and get the tokens it gets
    prefilled whole (``""`` when it can): in pieces (:func:`piece_program`) or after a stored prefix
    (:func:`reuse_program`). Both keep a prompt's tokens in consecutive columns ending at the clock, so
    windows and chunks counted in columns see what they see in a whole prefill; but a forward starts
    mid-prompt, which a window counted back from a forward's first query (``Span.cached_only``) sees.
    The same rule answers for prefix caching (``prefix_refusal``) and prefilling in pieces
    (``piece_refusal``)."""
    form = masks.form(model.config, model.module)
    started = [kind for kind, span in form.spans if span.cached_only and span.window is not None]
    if started:
        return (
            f"{type(model.module).__name__}'s {', '.join(started)} layers count their window back from "
            "the first token of each forward, so a prompt split over forwards sees other tokens than one "
            "prefilled whole"
        )
    return ""


def score_program(
    model: Any, params: Any, ids: Any, mask: Any, static: SlotStatic
) -> tuple[Any, Any, Any]:
    """The log-probabilities of ``ids`` (``[1, bucket]``, left-padded as :func:`admit_program`'s) in a
    forward of their own: at each position the next token's, and the :data:`rows.TOP_LOGPROBS` likeliest
    tokens with theirs (``[bucket - 1]`` and ``[bucket - 1, TOP_LOGPROBS]``; the padding's are read by no
    one)."""
    prompt = ids.shape[1]
    positions = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 1)
    forward = Forward(model, static.step, static.layout, params)
    logits, _, _ = forward.decoder(
        Window(ids, positions, mask, jnp.arange(prompt)), None, every=True
    )
    log_probs = jax.nn.log_softmax(logits[0, :-1], axis=-1)
    chosen = jnp.take_along_axis(log_probs, ids[0, 1:, None].astype(jnp.int32), axis=-1)[:, 0]
    top_logprobs, top_ids = jax.lax.top_k(log_probs, rows.TOP_LOGPROBS)
    return chosen, top_ids, top_logprobs


def decode_program(
    model: Any,
    params: Any,
    state: dict[str, Any],
    steps: Any,
    eos: Any,
    start: Any,
    static: SlotStatic,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Up to ``steps`` new tokens in every unfinished row among the first ``static.rows`` (the rest are
    free), in one loop over those rows only, and over their ``static.columns`` columns from ``start`` on
    (:func:`_leading`): a batch with few requests, or short ones, costs what few rows, or the columns
    they hold, cost. Returns the state and the chunk's :func:`_report`."""
    return _report(_leading(model, params, state, steps, eos, None, start, static))


def step_program(
    model: Any, params: Any, state: dict[str, Any], eos: Any, allowed: Any, static: SlotStatic
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One new token in every unfinished row among the first ``static.rows``, each chosen among the
    tokens its row of ``allowed`` (``[slots, ceil(vocab / 32)]``, :func:`rows.allow`'s bitmask) lets it
    choose: :func:`decode_program`'s step for a batch in which a row has a grammar (over every column)."""
    return _report(_leading(model, params, state, jnp.int32(1), eos, allowed, jnp.int32(0), static))


def _report(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A decode's state without its chunk's output, and that output with each row's ``finished`` and the
    ``clock`` after the chunk: arrays of their own, outside the state that the next program takes (and
    donates), so that a chunk can be read after the next one has started (:meth:`SlotEngine.read`)."""
    state = dict(state)
    out = state.pop("out")
    return state, {**out, "finished": state["rows"]["finished"], "clock": state["clock"]}


def _leading(
    model: Any,
    params: Any,
    state: dict[str, Any],
    steps: Any,
    eos: Any,
    allowed: Any,
    start: Any,
    static: SlotStatic,
) -> dict[str, Any]:
    """:func:`_decode` over the first ``static.rows`` rows only (and their rows of ``allowed``), and over
    the ``static.columns`` columns from ``start`` on (0: every column), the rest of the state left as it
    is. Every column an unfinished row holds, and those the steps write, must lie in that window: a
    query then attends to the keys it attends to over the whole row (the others are hidden by ``valid``),
    at the same column distances, so sliding windows see what they see over the whole row."""
    slots, length = state["valid"].shape
    rows, columns = static.rows, static.columns or length
    if rows == slots and columns == length:
        return _decode(model, params, state, steps, eos, allowed, static)
    if allowed is not None:
        allowed = allowed[:rows]
    axes = {**_slot_axes(model, static.step), "valid": 1}

    def cut(name: str, value: Any) -> Any:
        value = value[:rows]
        if name in axes and columns < length:
            value = jax.lax.dynamic_slice_in_dim(value, start, columns, axis=axes[name])
        return value

    def put(name: str, whole: Any, part: Any) -> Any:
        at = [jnp.int32(0)] * whole.ndim
        if name in axes and columns < length:
            at[axes[name]] = start
        return jax.lax.dynamic_update_slice(whole, part, at)

    head = {
        "states": [{name: cut(name, v) for name, v in layer.items()} for layer in state["states"]],
        "valid": cut("valid", state["valid"]),
        "rows": jax.tree.map(lambda x: x[:rows], state["rows"]),
        "clock": state["clock"] - start,
    }
    head = _decode(model, params, head, steps, eos, allowed, static)
    out = _output(slots, static.capacity)
    states = [
        {name: put(name, v, head["states"][i][name]) for name, v in layer.items()}
        for i, layer in enumerate(state["states"])
    ]
    merged = {
        "states": states,
        "valid": put("valid", state["valid"], head["valid"]),
        "rows": jax.tree.map(functools.partial(put, ""), state["rows"], head["rows"]),
        "out": jax.tree.map(functools.partial(put, ""), out, head["out"]),
    }
    return {**state, **merged, "clock": head["clock"] + start}


#: The fewest columns :func:`short_window` gives a decode.
MIN_WINDOW = 128


def short_window(length: int) -> int:
    """The columns a decode runs over, by default, while its unfinished rows hold few enough tokens: a
    quarter of a row of ``length`` columns, from :data:`MIN_WINDOW` on (0: every decode runs over the
    whole row). Every step attends to each column it runs over and the decode copies them in and out,
    so a short window costs less while requests are short. Each window is a decode program per power of
    two of rows, so one short window (not a ladder of them) doubles the decode programs compiled when the
    engine is made; under ``MIN_WINDOW`` columns the copy costs about what the window saves."""
    return length // 4 if length // 4 >= MIN_WINDOW else 0


#: The parts of the state that hold one entry per row.
ROW_PARTS = ("states", "valid", "rows")


def _decode(
    model: Any,
    params: Any,
    state: dict[str, Any],
    steps: Any,
    eos: Any,
    allowed: Any,
    static: SlotStatic,
) -> dict[str, Any]:
    if static.drafts:
        return _speculate(model, params, state, steps, eos, static)
    slots, length = state["valid"].shape
    chunk = static.step.decoding.capacity

    def running(carry: tuple[Any, Any, Any]) -> Any:
        state, i, _ = carry
        busy = jnp.any(~state["rows"]["finished"])
        return (i < jnp.minimum(steps, chunk)) & busy & (state["clock"] < length)

    def advance(carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        state, i, params = carry
        table, clock = state["rows"], state["clock"]
        valid = jax.lax.dynamic_update_slice(state["valid"], jnp.ones((slots, 1), bool), (0, clock))
        ids, positions = table["last"][:, None], table["position"][:, None]
        forward = Forward(model, static.step, static.layout, params)
        window = Window(ids, positions, valid, clock[None], clock)
        logits, states, _ = forward.decoder(window, state["states"], masked=static.step.attends)
        live = ~table["finished"]
        chosen = _choose(logits, table, table["step"], live, allowed)
        token = jnp.where(live, chosen["token"], table["last"])
        out = state["out"]
        written = {
            name: jnp.where(_at(live, i, out[name].shape), value[:, None], out[name])
            for name, value in (
                ("tokens", token),
                ("logprobs", chosen["logprob"]),
                ("top_ids", chosen["top_ids"]),
                ("top_logprobs", chosen["top_logprobs"]),
            )
        }
        step = table["step"] + live
        done = live & (_is_eos(token, eos) | (step >= table["limit"]))
        if static.lookup:  # what guessing chunks after this one search
            table = {
                **table,
                "history": _recorded(
                    table["history"], table["position"], table["last"][:, None], live[:, None]
                ),
            }
        table = {
            **table,
            "counts": _counted(table["counts"], token, live),
            "last": token,
            "position": table["position"] + live,
            "step": step,
            "finished": table["finished"] | done,
        }
        out = {**out, **written, "count": out["count"] + live}
        new = {**state, "states": states, "valid": valid, "clock": clock + 1, "rows": table}
        # As in generate's loop: weights carried past a barrier are no loop invariants (DecodeLayout).
        carried = jax.lax.optimization_barrier(params) if static.layout.carries_weights else params
        return {**new, "out": out}, i + 1, carried

    state = {**state, "out": _output(slots, static.capacity)}  # this chunk's tokens only
    state, _, _ = jax.lax.while_loop(running, advance, (state, jnp.int32(0), params))
    return state


def _at(live: Any, i: Any, shape: tuple[int, ...]) -> Any:
    """A mask of ``shape`` (``[rows, chunk, ...]``) true at chunk column ``i`` of the ``live`` rows."""
    column = jnp.arange(shape[1]) == i
    hit = live[:, None] & column[None]
    return hit.reshape(hit.shape + (1,) * (len(shape) - 2))


def _recorded(history: Any, start: Any, tokens: Any, mask: Any) -> Any:
    """``history`` (``[rows, length]``, each row's tokens by position) with each row's ``tokens``
    (``[rows, n]``) written at positions ``start, start + 1, ...`` where ``mask``."""
    at = start[:, None] + jnp.arange(tokens.shape[1])[None]
    at = jnp.where(mask, at, history.shape[1])  # past the end: written nowhere
    return history.at[jnp.arange(history.shape[0])[:, None], at].set(tokens, mode="drop")


#: The longest run of a row's last tokens that prompt lookup looks for earlier in the row (then shorter
#: runs, down to one token), as transformers' ``prompt_lookup_num_tokens`` looks for its ``max_matching_ngram_size``.
LOOKUP_NGRAM = 3


def lookup(history: Any, position: Any, drafts: int) -> Any:
    """Each row's guess of the ``drafts`` tokens after position ``position`` (``[rows]``) by prompt lookup:
    the tokens that followed the first earlier occurrence of its last :data:`LOOKUP_NGRAM` tokens (or
    fewer, the longest run that occurred) in its ``history`` (``[rows, length]``, tokens by position, the
    one at ``position`` included). A run found just before the end repeats what followed it (a row
    repeating a phrase guesses the phrase again); a row whose last token never occurred before guesses it
    repeated. Only the guess depends on this: every guessed token is checked by the model before it is
    given (:func:`_speculate`)."""
    count, length = history.shape
    columns = jnp.arange(length)[None, :]
    after = jnp.zeros((count,), jnp.int32)  # where the continuation of the run found starts
    found = jnp.zeros((count,), bool)
    for n in range(1, LOOKUP_NGRAM + 1):  # a longer run found replaces a shorter one
        match = (columns <= position[:, None] - n) & (position[:, None] >= n - 1)
        for j in range(n):
            token = jnp.take_along_axis(
                history, jnp.clip(position - n + 1 + j, 0, length - 1)[:, None], axis=1
            )
            later = jnp.pad(history[:, j:], ((0, 0), (0, j)), constant_values=-1)
            match &= later == token
        hit = match.any(axis=1)
        after = jnp.where(hit, jnp.argmax(match, axis=1).astype(jnp.int32) + n, after)
        found |= hit
    # Past the end of the history the continuation is the guess itself: period ``position + 1 - after``.
    period = jnp.maximum(position + 1 - after, 1)
    at = after[:, None] + jnp.arange(drafts)[None, :] % period[:, None]
    guess = jnp.take_along_axis(history, jnp.clip(at, 0, length - 1), axis=1)
    last = jnp.take_along_axis(history, jnp.clip(position, 0, length - 1)[:, None], axis=1)
    return jnp.where(found[:, None], guess, last)


def _greedy(logits: Any, table: dict[str, Any], live: Any) -> dict[str, Any]:
    """:func:`rows.choose`'s greedy choice at every position of ``logits`` (``[rows, n, vocab]``), with
    log-probabilities only when a ``live`` row asks for them."""
    count, n, vocab = logits.shape
    flat = logits.reshape(count * n, vocab)
    step = jnp.zeros((count * n,), jnp.int32)
    branches = [
        lambda flat, work=work: _on_torch(lambda x, s: rows.choose(x, {}, s, work), flat, step)
        for work in rows.WORKS[:2]  # greedy, without and with log-probabilities
    ]
    asked = (table["logprobs"] & live).any().astype(jnp.int32)
    chosen = jax.lax.switch(asked, branches, flat)
    return jax.tree.map(lambda x: x.reshape(count, n, *x.shape[1:]), chosen)


def _speculate(
    model: Any, params: Any, state: dict[str, Any], steps: Any, eos: Any, static: SlotStatic
) -> dict[str, Any]:
    """:func:`_decode`'s chunk with prompt lookup: each step feeds every row its last token and
    ``static.drafts`` guessed tokens (:func:`lookup`) at the next positions, in one forward over
    ``drafts + 1`` columns from the clock, and gives a row every guess its model agrees with (each is the
    greedy token after those before it) and the model's own token after them: 1 to ``drafts + 1``
    tokens per step for the cost of one forward, which on a device bound by reading the weights (a few
    rows) costs about what one token's does.

    Why the tokens are those of plain decoding: a guess is kept only if it equals the token the row
    chooses there, and the keys and values written for it were computed from the row's own earlier
    tokens (causal attention), so the cache after the step is the one plain steps write, up to
    rounding. Only greedy rows without a penalty or a bias keep guesses; every other row takes its one
    token chosen as :func:`_decode` chooses it (its sampling, penalties and seed unchanged), and an EOS
    token or the row's limit cuts the tokens given. Every row writes ``drafts + 1`` columns and the
    clock moves that far; a row that kept ``a`` guesses then has ``drafts - a`` columns it does not
    want at the end, hidden, and its columns are rolled right by that many (``moved``, reported per row
    so that the host follows its columns), so that its tokens again end at the clock in consecutive
    columns, as plain decoding leaves them (sliding windows and chunks counted in columns see what they
    see there)."""
    slots, length = state["valid"].shape
    chunk, drafts = static.step.decoding.capacity, static.drafts
    width = drafts + 1
    offsets = jnp.arange(width)
    axes = _slot_axes(model, static.step)
    rolls = jax.vmap(lambda x, d, axis: jnp.roll(x, d, axis=axis - 1), in_axes=(0, 0, None))

    def running(carry: tuple[Any, Any, Any]) -> Any:
        state, i, _ = carry
        busy = jnp.any(~state["rows"]["finished"])
        return (i < jnp.minimum(steps, chunk)) & busy & (state["clock"] + width <= length)

    def advance(carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        state, i, params = carry
        table, clock = state["rows"], state["clock"]
        live = ~table["finished"]
        position = table["position"]
        history = _recorded(table["history"], position, table["last"][:, None], live[:, None])
        guessed = lookup(history, position, drafts)
        ids = jnp.concatenate([table["last"][:, None], guessed], axis=1)
        valid = jax.lax.dynamic_update_slice(
            state["valid"], jnp.ones((slots, width), bool), (0, clock)
        )
        window = Window(ids, position[:, None] + offsets[None], valid, clock + offsets, clock)
        forward = Forward(model, static.step, static.layout, params)
        logits, states, _ = forward.decoder(
            window, state["states"], masked=static.step.attends, every=True
        )
        first = _choose(logits[:, 0], table, table["step"], live, None)
        later = _greedy(logits[:, 1:], table, live)
        chosen = {
            name: jnp.concatenate([first[name][:, None], later[name]], axis=1) for name in first
        }
        token = chosen["token"]
        plain = ~table["sample"] & ~_on_torch(rows.adjusted, table)
        agreed = jnp.cumprod(guessed == token[:, :-1], axis=1).sum(axis=1)
        kept = jnp.where(plain, agreed, 0) + 1
        ends = _is_eos(token.reshape(-1), eos).reshape(token.shape)
        kept = jnp.minimum(kept, jnp.where(ends.any(1), jnp.argmax(ends, axis=1) + 1, width))
        given = jnp.where(live, jnp.minimum(kept, table["limit"] - table["step"]), 0)
        mask = offsets[None] < given[:, None]
        out = state["out"]
        at = jnp.where(mask, out["count"][:, None] + offsets[None], out["tokens"].shape[1])
        lines = jnp.arange(slots)[:, None]
        written = {
            name: out[name].at[lines, at].set(chosen[key], mode="drop")
            for name, key in (
                ("tokens", "token"),
                ("logprobs", "logprob"),
                ("top_ids", "top_ids"),
                ("top_logprobs", "top_logprobs"),
            )
        }
        last = jnp.take_along_axis(token, jnp.maximum(given - 1, 0)[:, None], axis=1)[:, 0]
        step = table["step"] + given
        done = live & ((ends & mask).any(1) | (step >= table["limit"]))
        counts = table["counts"].at[lines, token].add(mask.astype(table["counts"].dtype))
        table = {
            **table,
            "counts": counts,
            "history": _recorded(history, position + 1, token, mask),
            "last": jnp.where(live, last, table["last"]),
            "position": position + given,
            "step": step,
            "finished": table["finished"] | done,
        }
        # Each live row's unwanted columns hidden, then its columns rolled right by their count.
        moved = jnp.where(live, width - given, 0)
        wanted = (offsets[None] < given[:, None]) | ~live[:, None]
        valid = jax.lax.dynamic_update_slice(valid, wanted, (0, clock))
        valid = rolls(valid, moved, 1) & (jnp.arange(length)[None] >= moved[:, None])
        states = [
            {name: rolls(value, moved, axes[name]) for name, value in layer.items()}
            for layer in states
        ]
        out = {**written, "count": out["count"] + given, "moved": out["moved"] + moved}
        new = {**state, "states": states, "valid": valid, "clock": clock + width, "rows": table}
        carried = jax.lax.optimization_barrier(params) if static.layout.carries_weights else params
        return {**new, "out": out}, i + 1, carried

    state = {**state, "out": _output(slots, static.capacity)}
    state, _, _ = jax.lax.while_loop(running, advance, (state, jnp.int32(0), params))
    return state


def history_program(
    model: Any, state: dict[str, Any], row: Any, ids: Any, static: Static
) -> dict[str, Any]:
    """Rows ``row`` (``[slots]``; ``slots`` or more: padding, written nowhere) given their prompts' tokens
    by position, ``ids`` (``[slots, length]``): what prompt lookup searches (:func:`lookup`)."""
    table = state["rows"]
    history = table["history"].at[row].set(ids, mode="drop")
    return {**state, "rows": {**table, "history": history}}


def shift_program(model: Any, state: dict[str, Any], delta: Any, static: Static) -> dict[str, Any]:
    """Every row's columns moved by ``delta`` (the clock with them); columns moved in hold nothing."""
    axes = _slot_axes(model, static)
    length = state["valid"].shape[1]
    states = [
        {name: jnp.roll(value, delta, axis=axes[name]) for name, value in layer.items()}
        for layer in state["states"]
    ]
    columns = jnp.arange(length) - delta
    kept = (columns >= 0) & (columns < length)
    valid = jnp.roll(state["valid"], delta, axis=1) & kept[None]
    return {**state, "states": states, "valid": valid, "clock": state["clock"] + delta}


def move_program(
    model: Any, state: dict[str, Any], source: Any, target: Any, static: Static
) -> dict[str, Any]:
    """Row ``source``'s request (its cache, visible columns and :data:`rows` settings) copied into row
    ``target``, and ``source`` left finished. The columns are every row's (one clock), so nothing else
    changes: the request decodes in its new row exactly as in its old one."""
    parts = {
        name: jax.tree.map(lambda x: x.at[target].set(x[source]), state[name]) for name in ROW_PARTS
    }
    table = parts["rows"]
    parts["rows"] = {**table, "finished": table["finished"].at[source].set(True)}
    return {**state, **parts}


def restart_program(
    model: Any, state: dict[str, Any], clock: Any, static: Static
) -> dict[str, Any]:
    """The clock at ``clock`` and no column visible in any row; the cache's contents stay (no row holds
    anything, and an admitted prompt writes its row's columns and visibility whole)."""
    return {**state, "valid": jnp.zeros_like(state["valid"]), "clock": clock}


def release_program(model: Any, state: dict[str, Any], free: Any, static: Static) -> dict[str, Any]:
    table = state["rows"]
    return {**state, "rows": {**table, "finished": table["finished"] | free}}


class SlotEngine:
    """``slots`` rows of a ``length``-column cache, a store of ``prefixes`` prompt prefixes of up to
    ``prefix_length`` tokens (default: half a row), and prompts prefilled in pieces of up to ``piece``
    tokens (0: whole): the JAX backend's :class:`hfax.generation.slots.SlotEngine`."""

    def __init__(
        self,
        model: Any,
        slots: int,
        length: int,
        chunk: int,
        prefixes: int = 0,
        prefix_length: int | None = None,
        piece: int = 0,
        window: int | None = None,
        lookup: int = 0,
    ) -> None:
        check_servable(model, length)
        window = short_window(length) if window is None else window
        if not 0 <= window < length:
            raise ValueError(
                f"a short decode window takes fewer columns than a row's {length}, not {window} "
                "(0: every decode runs over the whole row)"
            )
        if not 0 <= piece < length:
            raise ValueError(
                f"a prefill piece takes fewer tokens than a row's {length} columns, not {piece} "
                "(0: every prompt prefilled whole)"
            )
        if model.mesh is not None and slots % mesh.batch_multiple(model.mesh):
            raise ValueError(
                f"--max-batch {slots} must be a multiple of the mesh's batch axes "
                f"({mesh.batch_multiple(model.mesh)})"
            )
        if prefixes < 0:
            raise ValueError(f"the prefix store takes 0 or more entries, not {prefixes}")
        if not 0 <= lookup < length:
            raise ValueError(
                f"prompt lookup guesses 0 or more tokens a step, fewer than a row's {length} columns, "
                f"not {lookup} (0: no guesses)"
            )
        self.model, self.slots, self.length, self.chunk = model, slots, length, chunk
        self.lookup = lookup
        eos = model.generation_config.eos_token_id
        self.eos = self._replicate(processors.padded_ids([] if eos is None else eos))
        self._decode_static = _static(model, 0, chunk)
        self._layout = slot_layout(model, slots)
        valid, table = self._replicate((np.zeros((slots, length), bool), _row_arrays(slots)))
        program = model.program("serve_start", start_program)
        # Its output holds a guessing chunk's tokens, as every decode's does (SlotStatic.capacity).
        decoding = self._decode_static.decoding
        static = dataclasses.replace(
            self._decode_static,
            decoding=dataclasses.replace(decoding, capacity=decoding.capacity * (lookup + 1)),
        )
        self.state = program(model.params, valid, table, static=static)
        self.clock = 0  # the host's copy of the device's clock
        self.vocab = int(self.state["rows"]["counts"].shape[1])
        refusal = split_refusal(model) if prefixes or piece else ""  # one rule for both
        self.prefix_refusal = refusal if prefixes else ""
        self.piece_refusal = refusal if piece else ""
        self.piece = 0 if self.piece_refusal else piece
        self.prefixes = 0 if self.prefix_refusal else prefixes
        most = bucket(max(length // 2, 1), MIN_LENGTH_BUCKET)  # half a row, in whole buckets
        if most > max(length // 2, MIN_LENGTH_BUCKET):
            most //= 2
        self.prefix_length = (
            min(bucket(prefix_length, MIN_LENGTH_BUCKET), length) if prefix_length else most
        )
        self.store = self._empty_store() if self.prefixes else []
        taken = MIN_LENGTH_BUCKET
        while self.prefixes and taken <= self.prefix_length:  # every keep program, writing nowhere
            self._keep(*self._kept(taken))
            taken *= 2
        # The host's record of each row's prompt: its tokens and the column of each (moved by shift and
        # move), and of each store entry's tokens: what keep and a reuse check against.
        self._prompts: dict[int, tuple[list[int], np.ndarray]] = {}
        self._held: dict[int, list[int]] = {}
        # The rows that may be unfinished (their prompts' columns are what a decode's window must hold),
        # and the chunks decoded but not read yet, oldest first, each with the most columns it moves the
        # clock (the host's clock is the last read one's).
        self._decoding: set[int] = set()
        self._unread: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self.windows = (window, length) if window else (length,)

    def _replicate(self, tree: Any) -> Any:
        return mesh.replicate(tree, self.model.mesh)

    @property
    def unread(self) -> int:
        """How many decoded chunks :meth:`read` has not returned yet."""
        return len(self._unread)

    @property
    def ahead(self) -> int:
        """The most columns the unread chunks move the clock past :attr:`clock` (the last read one's)."""
        return sum(columns for _, columns in self._unread)

    def _read_first(self, what: str) -> None:
        """Refuse ``what`` while a chunk is unread: it places columns by the clock, which only a read
        gives the host."""
        if self._unread:
            raise ValueError(
                f"{what} places columns by the clock: read the {len(self._unread)} decoded chunk(s) first"
            )

    def _empty_store(self) -> list[dict[str, Any]]:
        """Zeros shaped as every row's layer states but with ``prefixes`` rows of ``prefix_length``
        columns, held as the cache is (:func:`store_program`)."""
        program = self.model.program("serve_store", store_program)
        sizes = self._replicate(np.zeros((self.prefixes, self.prefix_length), np.int8))
        return program(self.state, sizes, static=self._decode_static)

    def bucket(self, length: int) -> int:
        """The prompt bucket a prompt of ``length`` tokens is padded into."""
        return bucket(length, MIN_LENGTH_BUCKET)

    def columns(self, length: int, reused: int = 0) -> int:
        """The columns before the clock a prompt of ``length`` tokens takes, its first ``reused`` from the
        prefix store: the stored ones' bucket, then the rest's."""
        return self.bucket(length - reused) + (self.bucket(reused) if reused else 0)

    def admit(self, requests: Sequence[Admission]) -> list[dict[str, Any]]:
        """Prefill every request's ``ids`` into its row at the clock in one program (:func:`admit_program`),
        padded into the bucket of the longest; returns each one's first token's choice on the host, made
        among the tokens its ``allowed`` lets it choose when given. One program per prompt bucket and
        power of two of requests (padding rows write nothing). Requests that reuse stored prefixes
        (:func:`reuse_program`) prefill only the tokens after them, padded into the bucket of the
        longest such rest, beside the stored columns padded into the bucket of the longest prefix: one
        program per pair of those buckets and power of two of requests."""
        self._read_first("admit")
        self._check(requests)
        reused = [request.reuse.count if request.reuse else 0 for request in requests]
        size = self.bucket(max(len(r.ids) - n for r, n in zip(requests, reused)))
        held = self.bucket(max(reused)) if requests[0].reuse else 0
        if held + size > self.clock:
            raise ValueError(
                f"these prompts take {held + size} columns before the clock, which is at {self.clock}: "
                "shift or restart the engine first"
            )
        count = min(self.slots, bucket(len(requests), 1))
        padded = np.zeros((count, size), np.int32)
        mask = np.zeros((count, size), bool)
        mask[:, -1] = (
            True  # a padding row's prompt is one token: every row's attention sees something
        )
        row = np.full((count,), self.slots, np.int32)  # padding rows: no row of the engine
        for i, (request, n) in enumerate(zip(requests, reused)):
            rest = request.ids[n:]
            padded[i, size - len(rest) :], mask[i, size - len(rest) :] = rest, True
            row[i] = request.row
        per_row = [{**r.sampling.arrays(), "limit": np.int32(r.max_new)} for r in requests]
        per_row += [{**rows.Sampling().arrays(), "limit": np.int32(0)}] * (count - len(requests))
        settings = {name: np.stack([one[name] for one in per_row]) for name in per_row[0]}
        allowed = None
        if any(request.allowed is not None for request in requests):
            bits = np.full((count, (self.vocab + 31) // 32), -1, np.int32)
            for i, request in enumerate(requests):
                if request.allowed is not None:
                    bits[i] = request.allowed
            allowed = self._replicate(bits)
        args = self._replicate((padded, mask, row, settings))
        static = SlotStatic(_static(self.model, size, self.chunk), self._layout, held=held)
        if held:
            entry = np.full((count,), self.prefixes, np.int32)
            entry[: len(requests)] = [request.reuse.entry for request in requests]
            counts = np.zeros((count,), np.int32)
            counts[: len(requests)] = reused
            program = self.model.program("serve_reuse", reuse_program, donate=("state",))
            self.state, chosen = program(
                self.model.params, self.state, self.store, *self._replicate((entry, counts)),
                *args, self.eos, allowed, static=static,
            )  # fmt: skip
        else:
            program = self.model.program("serve_admit", admit_program, donate=("state",))
            self.state, chosen = program(
                self.model.params, self.state, *args, self.eos, allowed, static=static
            )
        for request in requests:  # reused or not, a prompt's tokens end at the clock
            columns = (self.clock - len(request.ids) + np.arange(len(request.ids))).astype(np.int32)
            self._prompts[request.row] = (list(request.ids), columns)
            self._decoding.add(request.row)
        self._history([(request.row, request.ids) for request in requests])
        host = {name: np.asarray(value) for name, value in chosen.items()}
        return [{name: value[i] for name, value in host.items()} for i in range(len(requests))]

    def prefill(self, pieces: Sequence[Piece]) -> list[dict[str, Any] | None]:
        """Prefill the next piece of each prompt into its row, every piece padded into ``piece`` columns
        ending at the clock, in one program (:func:`piece_program`; one per power of two of pieces,
        padding rows write nothing); returns, for each piece that ends its prompt, its first token's
        choice on the host (among its ``allowed`` tokens when given), and ``None`` for the others."""
        self._read_first("prefill")
        self._check_pieces(pieces)
        size, count = self.piece, min(self.slots, bucket(len(pieces), 1))
        ids = np.zeros((count, size), np.int32)
        mask = np.zeros((count, size), bool)
        mask[:, -1] = (
            True  # a padding row's piece is one token: every row's attention sees something
        )
        row = np.full((count,), self.slots, np.int32)  # padding rows: no row of the engine
        done, end = np.zeros((count,), np.int32), np.zeros((count,), np.int32)
        last = np.zeros((count,), bool)
        for i, piece in enumerate(pieces):
            request, n = piece.admission, piece.end - piece.start
            ids[i, size - n :], mask[i, size - n :] = request.ids[piece.start : piece.end], True
            row[i], done[i] = request.row, piece.start
            end[i] = self._prompts[request.row][1][-1] + 1 if piece.start else 0
            last[i] = piece.end == len(request.ids)
        requests = [piece.admission for piece in pieces]
        per_row = [{**r.sampling.arrays(), "limit": np.int32(r.max_new)} for r in requests]
        per_row += [{**rows.Sampling().arrays(), "limit": np.int32(0)}] * (count - len(requests))
        settings = {name: np.stack([one[name] for one in per_row]) for name in per_row[0]}
        allowed = None
        if any(r.allowed is not None and ends for r, ends in zip(requests, last)):
            bits = np.full((count, (self.vocab + 31) // 32), -1, np.int32)
            for i, request in enumerate(requests):
                if request.allowed is not None:
                    bits[i] = request.allowed
            allowed = self._replicate(bits)
        program = self.model.program("serve_piece", piece_program, donate=("state",))
        static = SlotStatic(_static(self.model, size, self.chunk), self._layout)
        self.state, chosen = program(
            self.model.params, self.state, *self._replicate((ids, mask, row, done, end, last, settings)),
            self.eos, allowed, static=static,
        )  # fmt: skip
        for piece in pieces:
            prompt = list(piece.admission.ids[: piece.end])
            columns = (self.clock - piece.end + np.arange(piece.end)).astype(np.int32)
            self._prompts[piece.admission.row] = (prompt, columns)
            if piece.end == len(piece.admission.ids):  # the row decodes from now on
                self._decoding.add(piece.admission.row)
        self._history([(p.admission.row, p.admission.ids) for p, ends in zip(pieces, last) if ends])
        host = {name: np.asarray(value) for name, value in chosen.items()}
        return [
            {name: value[i] for name, value in host.items()} if last[i] else None
            for i in range(len(pieces))
        ]

    def _history(self, prompts: list[tuple[int, list[int]]]) -> None:
        """Give rows their prompts' tokens by position (:func:`history_program`, one program), what
        prompt lookup searches; nothing without it."""
        if not self.lookup or not prompts:
            return
        row = np.full((self.slots,), self.slots, np.int32)
        ids = np.zeros((self.slots, self.length), np.int32)
        for i, (at, prompt) in enumerate(prompts):
            row[i], ids[i, : len(prompt)] = at, prompt
        program = self.model.program("serve_history", history_program, donate=("state",))
        self.state = program(self.state, *self._replicate((row, ids)), static=self._decode_static)

    def _check_pieces(self, pieces: Sequence[Piece]) -> None:
        """Refuse what :meth:`prefill` cannot do, before anything runs."""
        if not self.piece:
            raise ValueError(
                "this engine prefills every prompt whole"
                + (
                    f": {self.piece_refusal}"
                    if self.piece_refusal
                    else " (it was made with piece=0)"
                )
            )
        self._check([piece.admission for piece in pieces])
        most = max(piece.start for piece in pieces) + self.piece
        if most > self.clock:
            raise ValueError(
                f"these pieces take {most} columns before the clock, which is at {self.clock}: shift "
                "or restart the engine first"
            )
        for piece in pieces:
            request = piece.admission
            if request.reuse is not None:
                raise ValueError(
                    f"row {request.row}'s prompt is prefilled in pieces: it reuses no stored prefix"
                )
            if not 0 <= piece.start < piece.end <= len(request.ids) or (
                piece.end - piece.start > self.piece
            ):
                raise ValueError(
                    f"row {request.row}: a piece takes 1 to {self.piece} tokens of its prompt of "
                    f"{len(request.ids)}, not [{piece.start}, {piece.end})"
                )
            if not piece.start:
                continue
            if piece.end - piece.start != self.piece:
                raise ValueError(
                    f"row {request.row}: a piece after a prompt's first holds {self.piece} tokens, not "
                    f"{piece.end - piece.start} (the short piece goes first, so that the prompt's tokens "
                    "sit in consecutive columns)"
                )
            held, where = self._prompts.get(request.row, ([], np.zeros((0,), np.int32)))
            if held != list(request.ids[: piece.start]):
                raise ValueError(
                    f"row {request.row} holds {len(held)} tokens of another prompt, not the first "
                    f"{piece.start} of this one: prefill a prompt's pieces in order, from its first"
                )
            if where.min() < 0 or where.max() >= self.clock:
                raise ValueError(
                    f"row {request.row}'s earlier pieces were moved out of its row or past the clock: "
                    "its prompt cannot continue"
                )

    def keep(self, kept: Sequence[Kept]) -> None:
        """Copy each :class:`Kept`'s prompt tokens from its row into its store entry (:func:`keep_program`,
        one program per bucket of the most tokens kept, all compiled when the engine is made)."""
        self._read_first("keep")
        for one in kept:
            if not 0 <= one.entry < self.prefixes:
                raise ValueError(
                    f"the prefix store has entries 0 to {self.prefixes - 1}, not {one.entry}"
                    if self.prefixes
                    else f"this engine keeps no prefixes{': ' + self.prefix_refusal if self.prefix_refusal else ''}"
                )
            if one.row not in self._prompts or not 0 < one.count <= min(
                len(self._prompts[one.row][0]), self.prefix_length
            ):
                raise ValueError(
                    f"keep {one.count} tokens of row {one.row}: it takes 1 to {self.prefix_length} "
                    "tokens of a prompt admitted into that row"
                )
            where = self._prompts[one.row][1][: one.count]
            if where.min() < 0 or where.max() >= self.length:
                raise ValueError(
                    f"row {one.row}'s prompt was moved out of its row: it cannot be kept"
                )
        if len({one.entry for one in kept}) != len(kept):
            raise ValueError(f"keep writes each entry once, got {[one.entry for one in kept]}")
        row, entry, columns = self._kept(self.bucket(max(one.count for one in kept)))
        for i, one in enumerate(kept):
            ids, where = self._prompts[one.row]
            row[i], entry[i] = one.row, one.entry
            columns[i, : one.count] = where[: one.count]
            self._held[one.entry] = ids[: one.count]
        self._keep(row, entry, columns)

    def _kept(self, taken: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`keep_program`'s rows, entries and columns for ``taken`` tokens, one per entry of the
        store (a keep writes each entry at most once), all padding: written nowhere."""
        count = self.prefixes
        return (
            np.zeros((count,), np.int32),
            np.full((count,), self.prefixes, np.int32),
            np.zeros((count, taken), np.int32),
        )

    def _keep(self, row: np.ndarray, entry: np.ndarray, columns: np.ndarray) -> None:
        program = self.model.program("serve_keep", keep_program, donate=("store",))
        self.store = program(
            self.state,
            self.store,
            *self._replicate((row, entry, columns)),
            static=self._decode_static,
        )

    def _check(self, requests: Sequence[Admission]) -> None:
        """Refuse what :meth:`admit` cannot do, before anything runs."""
        if not requests:
            raise ValueError("admit needs at least one request")
        taken = [request.row for request in requests]
        if len(set(taken)) != len(taken) or not all(0 <= r < self.slots for r in taken):
            raise ValueError(
                f"admit takes distinct rows from 0 to {self.slots - 1}, one per request; got {taken}"
            )
        if len({request.reuse is None for request in requests}) > 1:
            raise ValueError(
                "admit takes requests that all reuse a stored prefix or none that does, not both"
            )
        for request in requests:
            if not request.ids:
                raise ValueError(f"the prompt for row {request.row} is empty: give it a token")
            if request.allowed is not None and np.shape(request.allowed) != (
                (self.vocab + 31) // 32,
            ):
                raise ValueError(
                    f"allowed for row {request.row} has shape {np.shape(request.allowed)}: it takes "
                    f"one bit per token, int32 [{(self.vocab + 31) // 32}]"
                )
            reuse = request.reuse
            if reuse is None:
                continue
            held = self._held.get(reuse.entry, [])
            if (
                not 0 < reuse.count < len(request.ids)
                or request.ids[: reuse.count] != held[: reuse.count]
                or reuse.count > len(held)
            ):
                raise ValueError(
                    f"row {request.row} reuses {reuse.count} tokens of prefix entry {reuse.entry}, "
                    f"which holds {len(held)} tokens{'' if self.prefixes else ' (no prefix store)'}: "
                    "reuse takes from 1 to all but the last token of a prompt, the entry's own first tokens"
                )

    def score(self, ids: list[int]) -> Scored:
        """``ids``' own log-probabilities (:func:`score_program`): one program per prompt bucket, compiled
        when a prompt of its bucket is first scored."""
        size = self.bucket(len(ids))
        padded = np.zeros((1, size), np.int32)
        mask = np.zeros((1, size), bool)
        padded[0, size - len(ids) :], mask[0, size - len(ids) :] = ids, True
        program = self.model.program("serve_score", score_program)
        static = SlotStatic(_static(self.model, size, self.chunk), self._layout)
        chosen, top_ids, top_logprobs = program(
            self.model.params, *self._replicate((padded, mask)), static=static
        )
        # The positions after each prompt token but the last.
        real = slice(size - len(ids), size - 1)
        return Scored(
            np.asarray(chosen)[real], np.asarray(top_ids)[real], np.asarray(top_logprobs)[real]
        )

    def decode(
        self, steps: int, rows: int, allowed: np.ndarray | None = None, guess: bool = False
    ) -> None:
        """Start a chunk of up to ``steps`` tokens per unfinished row among the first ``rows`` (``read``
        waits for it). A decode may start before the last chunk is read: it runs on the device after it,
        and the reads return the chunks in order. One program per power of two of rows. With ``allowed`` (``[slots, ceil(vocab /
        32)]``, :func:`rows.allow`'s bitmask), one step (``steps`` must be 1) of :func:`step_program`.
        With ``guess``, ``steps`` steps of prompt lookup (:func:`_speculate`, :attr:`lookup` guesses a
        step): up to ``steps * (lookup + 1)`` tokens a row, writing that many columns."""
        multiple = mesh.batch_multiple(self.model.mesh)
        rows = min(self.slots, -(-bucket(max(rows, 1), 1) // multiple) * multiple)
        static = SlotStatic(self._decode_static, self._layout, rows, lookup=self.lookup)
        if allowed is not None:
            if steps != 1:
                raise ValueError(f"a decode with allowed tokens runs one step, not {steps}")
            program = self.model.program("serve_step", step_program, donate=("state",))
            bits = self._replicate(np.asarray(allowed, np.int32))
            self.state, report = program(
                self.model.params, self.state, self.eos, bits, static=static
            )
            self._unread.append((report, 1))
            return
        if guess and not self.lookup:
            raise ValueError("this engine guesses no tokens (it was made with lookup=0)")
        drafts = self.lookup if guess else 0
        start, columns = self._window(steps * (drafts + 1), rows)
        static = dataclasses.replace(
            static, columns=0 if columns == self.length else columns, drafts=drafts
        )
        program = self.model.program("serve_decode", decode_program, donate=("state",))
        limit, start = self._replicate((np.int32(steps), np.int32(start)))
        self.state, report = program(
            self.model.params, self.state, limit, self.eos, start, static=static
        )
        self._unread.append((report, steps * (drafts + 1)))

    def _window(self, steps: int, rows: int) -> tuple[int, int]:
        """``(start, columns)``: the fewest columns of :attr:`windows` that hold every column an
        unfinished row among the first ``rows`` holds, and the ``steps`` columns from the clock on, which
        the decode writes, counted from the clock after the unread chunks (the most they move it).
        Unread chunks only roll rows right (prompt lookup), so the host's first columns are at or before
        the rows'. Every column if no row is unfinished (the decode then runs no step:
        :func:`hfax.serve.engine` compiles the whole-row programs so)."""
        firsts = [int(self._prompts[row][1].min()) for row in self._decoding if row < rows]
        if not firsts:
            return 0, self.length
        end = min(self.clock + self.ahead + steps, self.length)
        columns = next(w for w in self.windows if w >= end - max(min(firsts), 0))
        return min(max(end - columns, 0), self.length - columns), columns

    def read(self) -> Chunk:
        """The oldest unread chunk's tokens per row (waits for the device); the clock is then its."""
        if not self._unread:
            raise ValueError("no decoded chunk to read: decode first")
        out = dict(self._unread.popleft()[0])
        finished = out.pop("finished")
        _wait((out, finished))
        self.clock = int(out.pop("clock"))
        done = np.asarray(finished)
        self._decoding = {row for row in self._decoding if not done[row]}
        moved = np.asarray(out["moved"])
        self._prompts = {
            row: (ids, where + moved[row]) for row, (ids, where) in self._prompts.items()
        }
        return Chunk(
            **{name: np.asarray(value) for name, value in out.items()},
            finished=np.asarray(finished),
        )

    def release(self, free: np.ndarray) -> None:
        """Mark the rows ``free`` (bool ``[slots]``) finished, so no decode step waits for them."""
        program = self.model.program("serve_release", release_program, donate=("state",))
        self.state = program(self.state, self._replicate(free), static=self._decode_static)
        self._decoding = {row for row in self._decoding if not free[row]}

    def shift(self, delta: int) -> None:
        """Move every row's columns by ``delta``: see the module docstring."""
        self._read_first("shift")
        program = self.model.program("serve_shift", shift_program, donate=("state",))
        self.state = program(
            self.state, self._replicate(np.int32(delta)), static=self._decode_static
        )
        self.clock += delta
        self._prompts = {row: (ids, where + delta) for row, (ids, where) in self._prompts.items()}

    def move(self, source: int, target: int) -> None:
        """Move the request in row ``source`` to the free row ``target`` (``source`` is free after it)."""
        self._read_first("move")
        program = self.model.program("serve_move", move_program, donate=("state",))
        self.state = program(
            self.state,
            *self._replicate((np.int32(source), np.int32(target))),
            static=self._decode_static,
        )
        if source in self._prompts:
            self._prompts[target] = self._prompts.pop(source)
        if source in self._decoding:
            self._decoding = (self._decoding - {source}) | {target}

    def restart(self, clock: int) -> None:
        """Put the clock at ``clock`` with every row free, copying nothing (see :meth:`shift`)."""
        self._read_first("restart")
        program = self.model.program("serve_restart", restart_program, donate=("state",))
        self.state = program(
            self.state, self._replicate(np.int32(clock)), static=self._decode_static
        )
        self.clock = clock
        self._prompts, self._decoding = {}, set()

    def counters(self) -> tuple[int, float]:
        snapshot = monitor.snapshot()
        return snapshot.compiles, snapshot.compile_seconds + snapshot.trace_seconds
