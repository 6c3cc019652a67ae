"""``generate`` for every backend: settle the request, pad it into its bucket, run the backend's engine
in chunks, and assemble transformers' result.

    model.generate(**inputs, **settings)
      settings.prepare   transformers' GenerationConfig, processors and criteria; refusals   (host)
      pad_request        prompt bucket, traced settings, the loop's static structure         (host)
      engine.start       prefill: the prompt through the model, the first token              (device)
      engine.advance     the decode loop up to a limit, or until every row finished          (device)
      engine.read        the token state on the host, between chunks                         (host)
      assemble           EOS / stop-string padding, lengths, output type and classes         (host)

A backend's engine implements :class:`Engine`; the token choice inside its loop is
:func:`hfax.generation.tokens.advance`, the same torch code on every backend. Without a streamer, stop
strings, stopping criteria of the caller's or a time limit the loop runs in one chunk; the host waits for
it in a way Ctrl-C interrupts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import numpy as np

from hfax.generation import inputs as model_inputs
from hfax.generation import layer_outputs, loaded_cache, outputs, settings, tokens
from hfax.generation.shapes import (
    MIN_LENGTH_BUCKET,
    STREAM_CHUNK,
    accepts,
    bucket,
    pad_prompts,
)
from hfax.generation.traits import asked_once

#: New tokens per chunk when the host checks stop strings, stopping criteria or a time limit between chunks.
CHECK_CHUNK = 16


@dataclasses.dataclass
class GenerateStats:
    """What the last ``generate`` call did: tokens, wall time, and the compilation inside it."""

    new_tokens: int
    seconds: float
    compile_seconds: float
    compiles: int

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of running (compile and trace time excluded)."""
        running = self.seconds - self.compile_seconds
        return self.new_tokens / running if running > 0 else float("nan")


@dataclasses.dataclass
class PaddedRequest:
    """A request in its bucket, as an engine receives it.

    ``ids``/``mask`` are the decoder's prompt rows left-padded into the bucket (``int32``/``bool``);
    ``source`` the encoder's inputs by name (text ids and mask padded on the right), or ``None``;
    ``decoding`` the loop's static structure; ``arrays`` its traced settings
    (:func:`hfax.generation.tokens.host_arrays`).

    ``inputs`` are a decoder-only model's other inputs for prefill only, by ``forward`` name (images,
    their sizes, token types laid out like ``ids`` and padded with them; ``position_ids`` where the model's
    positions are multimodal); ``offsets`` (``[rows]``, or ``None``) is then added to the position of every
    token after the prompt. Rows that only fill the bucket hold no image: one filler token.

    ``resume`` is the caller's cache to load before the prefill, which then feeds only the tokens after
    it (:mod:`hfax.generation.loaded_cache`; asked only of an engine with the ``"cache_input"``
    feature), or ``None``.
    """

    ids: np.ndarray
    mask: np.ndarray
    source: dict[str, np.ndarray] | None
    decoding: tokens.Decoding
    arrays: dict[str, Any]
    positions: bool  # whether the model takes position_ids (else its prompt keeps its own length)
    inputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    offsets: np.ndarray | None = None
    resume: loaded_cache.Resume | None = None


class Engine(Protocol):
    """What a backend implements for ``generate``: run the model; the core does the rest."""

    #: What the engine runs beyond greedy search and sampling: ``"beams"``, ``"encoder_decoder"``,
    #: ``"cache_input"`` (``start`` loads a caller's cache: :attr:`PaddedRequest.resume`), ...
    features: frozenset[str]
    #: Rows are padded to a multiple of this (the mesh's batch axes).
    row_multiple: int

    def start(self, padded: PaddedRequest) -> Any:
        """Prefill: run the prompt (after ``padded.resume``'s columns, loaded, when given), choose the first
        token; returns the run's device state."""

    def advance(self, run: Any, limit: int) -> Any:
        """Decode until ``limit`` new tokens exist or every row finished."""

    def read(self, run: Any) -> dict[str, np.ndarray]:
        """The token state (:mod:`hfax.generation.tokens`) on the host; waits for the device."""

    def stop_rows(self, run: Any, rows: np.ndarray) -> Any:
        """The run with ``rows`` (bool ``[rows]``) marked finished."""

    def counters(self) -> tuple[int, float]:
        """Programs compiled and seconds spent tracing and compiling so far in this process."""

    def take_tokens(self, run: Any, token: Any, finished: np.ndarray) -> Any:
        """The run with every row's newest token replaced by ``token`` (``[rows]``) and ``finished``
        (bool ``[rows]``) as given: the host chose them (:mod:`hfax.generation.host_choice`). Asked only
        of an engine with the ``"host_choice"`` feature."""

    def cache(
        self,
        run: Any,
        rows: int,
        start: int,
        end: int,
        source: int | None = None,
        whole: bool = False,
    ) -> Any:
        """The run's cache as transformers returns it from ``generate``, on the CPU: a ``DynamicCache`` of
        slots ``[start, end)`` of the first ``rows`` rows; an encoder-decoder's an ``EncoderDecoderCache``
        of those self-attention slots and the cross-attention over the encoder's first ``source``
        positions (all with ``None``); ``None`` where the model's cache holds other states. Its sliding
        layers keep what transformers' dynamic ones keep, or with ``whole`` every slot (a ``DynamicCache``
        without the config, from which :func:`hfax.generation.outputs.requested_cache` makes a
        ``StaticCache`` whose sliding layers keep their whole window). Asked only of an engine with the
        ``"cache_output"`` feature."""


def pad_request(model: Any, request: settings.Request, engine: Engine) -> PaddedRequest:
    """Pad ``request`` into its bucket and split its settings into static structure and traced arrays."""
    encoder_decoder = request.source is not None
    positions = accepts(model.module, "position_ids") and not encoder_decoder
    length = None if positions else request.ids.shape[1]
    multiple = engine.row_multiple * request.expand
    ids, mask = pad_prompts(request.ids, request.mask, request.filler, multiple, length=length)
    source = _padded_source(request, multiple, ids.shape[0]) if encoder_decoder else None
    inputs, offsets = {}, None
    if request.inputs and not encoder_decoder:
        ids[request.rows :], mask[request.rows :] = request.filler, False
        mask[request.rows :, -1] = True
        aligned = model_inputs.row_aligned(request.inputs, request.ids.shape)
        for name, value in request.inputs.items():
            inputs[name] = _left_padded(value, ids.shape) if name in aligned else value
        rope = model_inputs.positions(model.module, ids, mask, inputs)
        if rope is not None:
            inputs["position_ids"], offsets = rope
            # the images are in a loaded cache: their grids only placed the positions
            if request.held is not None:
                inputs = {n: v for n, v in inputs.items() if not n.endswith("grid_thw")}
        elif "position_ids" in inputs:  # the caller's: later tokens go on from each row's last one
            offsets = (inputs["position_ids"][:, -1] + 1 - mask.sum(1)).astype(np.int32)
    config = request.config
    keep = max(2, 1 + len(request.eos)) * request.num_beams
    decoding = tokens.Decoding(
        steps=tuple(step.static for step in request.steps),
        do_sample=request.do_sample,
        num_beams=request.num_beams,
        prompt=ids.shape[1],
        capacity=bucket(request.max_new, MIN_LENGTH_BUCKET),
        # the host keeps them itself when it chooses the tokens
        scores=bool(config.return_dict_in_generate and config.output_scores and not request.host),
        logits=bool(config.return_dict_in_generate and config.output_logits and not request.host),
        early_stopping=config.early_stopping if request.num_beams > 1 else False,
        beams_to_keep=keep if request.num_beams > 1 else 0,
        hidden_states=bool(config.return_dict_in_generate and config.output_hidden_states),
        attentions=bool(config.return_dict_in_generate and config.output_attentions),
        host_choice=request.host is not None,
    )
    resume = None
    if request.held is not None:
        resume = loaded_cache.placed(
            request.held, request.cached, request.ids.shape[1], ids.shape[1], ids.shape[0]
        )
    return PaddedRequest(
        ids, mask, source, decoding, tokens.host_arrays(request), positions, inputs, offsets, resume
    )


def _padded_source(request: settings.Request, multiple: int, rows: int) -> dict[str, np.ndarray]:
    """The encoder's inputs with the decoder's rows: text on the right into its length bucket, other
    inputs (features) with filler rows repeating row 0."""
    source = dict(request.source)
    if "input_ids" in source:
        text, text_mask = pad_prompts(
            source["input_ids"],
            source["attention_mask"].astype(bool),
            request.filler,
            multiple,
            left=False,
        )
        source["input_ids"], source["attention_mask"] = text, text_mask.astype(np.int32)
    for name, value in source.items():
        if value.shape[0] < rows:
            source[name] = np.concatenate([value, np.repeat(value[:1], rows - value.shape[0], 0)])
    return source


def _left_padded(value: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """An input laid out like the prompt's ids (one value or vector per token), padded as they are (zeros
    in padding and filler rows)."""
    padded = np.zeros(shape + value.shape[2:], value.dtype)
    padded[: value.shape[0], shape[1] - value.shape[1] :] = value
    return padded


@asked_once()
def generate(
    model: Any,
    engine: Engine,
    input_ids: Any,
    attention_mask: Any = None,
    *,
    streamer: Any = None,
    **options: Any,
) -> Any:
    """transformers' ``generate`` on ``engine``: see the module docstring. A model's generation traits
    are asked of the plugins once per call (:func:`hfax.generation.traits.asked_once`)."""
    check_streamer(streamer)
    request = settings.prepare(model, input_ids, attention_mask, options, engine.features)
    if input_ids is None:  # embeddings, or an encoder's features: the result takes their type
        input_ids = options.get("inputs_embeds")
        if input_ids is None:
            input_ids = options.get(getattr(model.module, "main_input_name", ""))
    kind = outputs.array_kind(input_ids)
    started, (compiles, compile_seconds) = time.perf_counter(), engine.counters()
    if streamer is not None:
        if request.num_beams > 1:
            raise NotImplementedError(
                "a streamer cannot follow beam search (transformers refuses it too)"
            )
        _put(streamer, request.head)
    steps, result, run = 0, None, None
    if request.max_new > 0:
        padded = pad_request(model, request, engine)
        run, result, steps = _run(engine, padded, request, streamer)
    if streamer is not None:
        streamer.end()
    sequences, extras = _assemble(request, padded if request.max_new > 0 else None, result, steps)
    config = request.config
    embedded = request.ids.shape[1] - request.width  # a prompt of embeddings alone
    if config.return_dict_in_generate and config.use_cache and outputs.static_cache_asked(config):
        # a static cache's slots, counted before requested_cache records this call's length
        slots = outputs.static_cache_slots(model.module, config, embedded)
        layer_outputs.over_static_cache(extras, slots)
    if run is not None and config.return_dict_in_generate and config.use_cache:
        # transformers' cache after the call: the prompt and every new token but the last (never fed).
        if "cache_output" in engine.features:
            prompt = padded.decoding.prompt
            start = prompt - request.ids.shape[1]
            cache = engine.cache(
                run,
                request.rows,
                start,
                prompt + steps - 1,
                _source_length(request),
                whole=outputs.static_cache_asked(config),
            )
            extras["past_key_values"] = outputs.requested_cache(
                model.module, config, cache, embedded
            )
    after_compiles, after_seconds = engine.counters()
    model.last_generate_stats = GenerateStats(
        new_tokens=steps * request.batch,
        seconds=time.perf_counter() - started,
        compile_seconds=after_seconds - compile_seconds,
        compiles=after_compiles - compiles,
    )
    if request.finish is not None:
        fields = extras if config.return_dict_in_generate else None
        sequences, extras = request.finish(sequences, fields)
    return outputs.assemble(
        sequences,
        kind,
        input_ids,
        request.source is not None,
        request.num_beams > 1,
        bool(config.return_dict_in_generate),
        extras,
    )


def _run(
    engine: Engine, padded: PaddedRequest, request: settings.Request, streamer: Any
) -> tuple[Any, Any, int]:
    """Run the engine in chunks; returns the run, its last host state and the new tokens the result
    keeps."""
    checks = bool(request.criteria) or request.deadline is not None
    chunk = STREAM_CHUNK if streamer is not None else CHECK_CHUNK if checks else request.max_new
    if request.host is not None:  # one token at a time, each chosen on the host
        chunk = 1
    run = engine.start(padded)
    rows, prompt = request.rows, padded.decoding.prompt
    if request.cache is not None and (request.held is None or request.source is not None):
        _check_callers_cache(engine, run, request, prompt)
    ends = np.full((rows,), request.max_new, np.int64)  # where each row's tokens end (exclusive)
    done = ends.copy()  # where transformers counts each row done: the call ends once every row is
    sent = 0
    while True:
        limit = min(sent + chunk, request.max_new)
        if limit > 1:  # `start` chose the first new token: one token needs no decode program
            run = engine.advance(run, limit)
        state = engine.read(run)
        step = int(state["step"])
        if request.host is not None:
            run, state = request.host.take(engine, run, state, request, prompt)
        new = state["ids"][:rows, prompt : prompt + step]
        if request.num_beams == 1:
            ends = np.minimum(ends, _eos_ends(new, request.eos, sent))
            done = np.minimum(done, ends)
            stopped = _criteria_ends(request, state, prompt, sent, step, done)
            if stopped is not None:
                done = np.minimum(done, stopped)
                if request.pad_stopped:
                    ends = np.minimum(ends, stopped)
                    run = engine.stop_rows(
                        run, _padded_rows(ends < request.max_new, state["finished"].shape[0])
                    )
            if streamer is not None:  # nothing past the last row's end, as transformers stops there
                _put(streamer, _padded_tokens(new, ends, sent, int(min(step, done.max())), request))
        finished = state["finished"][:rows].all() or (done <= step).all()
        if step < limit and not state["finished"].all():
            # An engine must reach the limit or finish every row; looping again would never end.
            raise RuntimeError(
                f"hfax's {type(engine).__name__} stopped at new token {step} of {limit} with rows still "
                "running: its compiled step did not advance (a bug in hfax; please report it)"
            )
        sent = step
        late = request.deadline is not None and time.monotonic() > request.deadline
        if step >= request.max_new or finished or late:
            break
    if request.num_beams == 1:
        step = int(min(step, done.max()))
    state["ends"] = ends
    return run, state, step


def _source_length(request: settings.Request) -> int | None:
    """How many encoder positions an encoder-decoder's cross-attention cache covers for the caller: its
    source ids' length (hfax pads them further into their bucket), or ``None`` for the whole encoder output
    (features, which hfax does not pad, or a decoder-only model)."""
    text = None if request.source is None else request.source.get("input_ids")
    return None if text is None else text.shape[1]


def _check_callers_cache(engine: Engine, run: Any, request: settings.Request, prompt: int) -> None:
    """The caller's cache must be the record of the prompt's first tokens, which hfax's prefill has just
    computed again from the ids (its cache lives on device, in its own layout): the first layer that holds
    every cached token must hold, at every real position, the keys and values the prefill wrote (within
    16-bit rounding). Else the cache came from other tokens, positions or weights, and is refused. An
    encoder-decoder's self-attention part holds its decoder prompt's first tokens so (unless the engine
    loaded it: ``request.held``), and its cross-attention part, where filled, the encoder's keys and
    values at the source's real positions, which the prefill computes again from the source in either
    case (transformers would attend over the cached ones whatever the source)."""
    length = request.cached
    start = prompt - request.ids.shape[1]
    ours = engine.cache(run, request.rows, start, start + length, _source_length(request))
    if ours is None:
        raise NotImplementedError(
            "hfax's generate takes a caller's cache for models whose cache holds keys and values only"
        )
    given, source = request.cache, request.source
    name = "input_ids" if source is None else "decoder_input_ids"
    if request.held is None:
        _check_layers(
            getattr(ours, "self_attention_cache", ours).layers,
            getattr(given, "self_attention_cache", given).layers,
            request.mask[:: request.expand, :length],
            request.expand,
            f"{name}' first {length} tokens",
            "pass the ids the cache was made from, e.g. an earlier result's sequences with its "
            "past_key_values",
        )
    if source is None or given.cross_attention_cache.get_seq_length() == 0:
        return  # an empty cross-attention part is filled by prefill, in transformers too
    mine, theirs = ours.cross_attention_cache, given.cross_attention_cache
    positions = mine.get_seq_length()
    mask = source.get("attention_mask", np.ones((request.rows, positions)))
    if theirs.get_seq_length() != positions:
        raise ValueError(
            f"past_key_values' cross-attention holds {theirs.get_seq_length()} encoder positions, and "
            f"this call's encoder {positions}: pass the input_ids the cache was made from"
        )
    _check_layers(
        mine.layers,
        theirs.layers,
        mask[:: request.expand].astype(bool),
        request.expand,
        "the encoder's keys and values of input_ids",
        "pass the input_ids (and attention_mask) the cache was made from",
    )


def _check_layers(
    mine: list[Any], theirs: list[Any], real: np.ndarray, expand: int, held: str, fix: str
) -> None:
    """The first of ``theirs`` (the caller's cache layers) that holds every position of ``real``
    (``[rows, positions]``: which hold tokens) holds ``mine``'s keys and values there, or a ``ValueError``
    says the cache does not hold ``held`` and what to do (``fix``)."""
    length = real.shape[1]
    for index, (ours, given) in enumerate(zip(mine, theirs)):
        keys = getattr(given, "keys", None)
        if keys is None or keys.shape[2] < length:
            continue  # a sliding layer past its window keeps the window only
        if ours.keys.shape[2] != length:
            continue
        for name in ("keys", "values"):  # a static layer's first `length` slots hold the tokens
            a = getattr(ours, name)[::expand].float().numpy().transpose(0, 2, 1, 3)[real]
            b = getattr(given, name)[:, :, :length].detach().cpu().float().numpy()
            b = b.transpose(0, 2, 1, 3)[real]
            if a.shape != b.shape or not np.allclose(a, b, rtol=2e-2, atol=2e-2 * np.abs(b).max()):
                raise ValueError(
                    f"past_key_values does not hold {held} (layer {index}'s {name} differ from what this "
                    f"model computes for them): {fix}"
                )
        return


def _padded_rows(rows: np.ndarray, total: int) -> np.ndarray:
    return np.concatenate([rows, np.zeros((total - rows.shape[0],), bool)])


def _eos_ends(new: np.ndarray, eos: list[int], start: int) -> np.ndarray:
    """Per row, one past its first EOS among the new tokens from ``start`` on (or the buffer's end)."""
    ends = np.full((new.shape[0],), np.iinfo(np.int64).max, np.int64)
    if not eos:
        return ends
    hits = np.isin(new[:, start:], eos)
    found = hits.any(1)
    ends[found] = start + hits[found].argmax(1) + 1
    return ends


def _criteria_ends(
    request: settings.Request,
    state: dict[str, np.ndarray],
    prompt: int,
    start: int,
    step: int,
    done: np.ndarray,
) -> np.ndarray | None:
    """Per row, one past the new token at which a host criterion (:attr:`settings.Request.criteria`) first
    says the row is done, asking them at every new position in order as transformers does: with the
    ``input_ids`` so far (the caller's prompt and padding, not hfax's bucket filler) and, when the call
    records scores (``output_scores``), the tuple of processed scores so far, else ``None``. Rows already
    done (``done``) are not stopped again; once every row is, the criteria are not asked further.

    What a stopped row makes afterwards is transformers' choice too (:attr:`settings.Request.pad_stopped`):
    padding when its criteria include an EOS one, else the row's own tokens until every row is done."""
    if not request.criteria:
        return None
    import torch
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    criteria = StoppingCriteriaList(request.criteria)
    rows = request.rows
    ids, scores = state["ids"][:rows], state.get("scores")
    if scores is not None:  # one copy (the host's state is read-only), each step's scores a view
        scores = torch.from_numpy(np.array(scores[:rows, :step]))
    found = np.full_like(done, np.iinfo(np.int64).max)
    first = prompt - request.width
    for t in range(start, step):
        open_rows = (done > t) & (found > t)
        if not open_rows.any():
            break
        sequence = torch.from_numpy(ids[:, first : prompt + t + 1].astype(np.int64))
        so_far = None if scores is None else tuple(scores[:, i] for i in range(t + 1))
        hit = np.asarray(criteria(sequence, so_far)).reshape(-1) & open_rows
        found[hit] = t + 1
    return found


def _padded_tokens(
    new: np.ndarray, ends: np.ndarray, start: int, step: int, request: settings.Request
) -> np.ndarray:
    pad = request.pad if request.pad is not None else request.filler
    columns = np.arange(new.shape[1])[None]
    return np.where(columns >= ends[:, None], pad, new)[:, start:step]


def _put(streamer: Any, ids: np.ndarray) -> None:
    import torch

    streamer.put(torch.from_numpy(np.ascontiguousarray(ids.astype(np.int64))))


def _assemble(
    request: settings.Request, padded: PaddedRequest | None, state: Any, steps: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """The sequences ``[rows, width + steps]`` with transformers' padding, and the extras of its output."""
    head = request.head.astype(np.int64)
    if padded is None:
        return head, {}
    config = request.config
    extras: dict[str, Any] = {}
    prompt, rows = padded.decoding.prompt, request.rows
    if request.num_beams > 1:
        new, extras = _beam_results(request, state)
        steps = new.shape[1]
        head = head[:: request.expand].repeat(config.num_return_sequences, axis=0)
    else:
        new = _padded_tokens(state["ids"][:rows, prompt:], state["ends"], 0, steps, request)
    if config.return_dict_in_generate:
        for name in ("scores", "logits"):
            if name in state:
                extras[name] = [state[name][:rows, t] for t in range(steps)]
        encoder_decoder = request.source is not None
        fields = layer_outputs.asked(padded.decoding, encoder_decoder)
        if fields:
            source = None
            if encoder_decoder:  # the caller's source length (none for unpadded features)
                text = request.source.get("input_ids")
                source = (0 if text is None else text.shape[1], request.expand)
            extras.update(
                layer_outputs.assemble(
                    state,
                    fields,
                    rows,
                    request.ids.shape[1],
                    prompt,
                    steps,
                    bool(config.use_cache),
                    source,
                )
            )
    return np.concatenate([head, new[:, :steps].astype(np.int64)], axis=1), extras


def _beam_results(
    request: settings.Request, state: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, Any]]:
    """The best ``num_return_sequences`` hypotheses per prompt, cut as transformers cuts them."""
    count = request.config.num_return_sequences
    batch = request.rows // request.num_beams
    ids = state["best_ids"][:batch, :count].reshape(batch * count, -1)
    indices = state["best_indices"][:batch, :count].reshape(batch * count, -1)
    lengths = (indices >= 0).sum(1)
    longest = int(lengths.max()) if lengths.size else 0
    eos = request.eos
    pad = request.pad
    fill = (pad or eos[0]) if eos else -1  # transformers' `pad_token_id or eos_token_id[0]`
    columns = np.arange(ids.shape[1])[None]
    ids = np.where(columns < lengths[:, None], ids, fill)[:, :longest]
    extras = {
        "sequences_scores": state["best_scores"][:batch, :count].reshape(-1).astype(np.float32),
        "beam_indices": indices[:, :longest].astype(np.int32),  # transformers keeps them as int32
    }
    return ids, extras


def check_streamer(streamer: Any) -> None:
    """Reject a streamer without ``put`` and ``end`` before anything runs."""
    if streamer is not None and not (
        callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
    ):
        raise TypeError(
            "streamer must have put() and end() methods, like transformers.TextStreamer"
        )
