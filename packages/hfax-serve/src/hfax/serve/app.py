"""The OpenAI-compatible HTTP API of ``hfax serve`` (Starlette, run by uvicorn).

    POST /v1/completions, /v1/chat/completions   answered whole, or as server-sent events (``stream``)
    GET  /v1/models, /health, /metrics           what is served, whether it serves, Prometheus counters
    POST /tokenize, /detokenize; GET /tokenizer_info   the served tokenizer, as vLLM's endpoints give it

A request is checked (:mod:`hfax.serve.requests`), split into its ``n`` choices (each with a grammar of
its own when ``response_format`` asks for one: :mod:`hfax.serve.formats`), and queued on the
:class:`~hfax.serve.scheduler.Scheduler`; tokens come back per decode chunk and are turned into text
here, where ``stop`` strings end a choice. A client that goes away cancels its choices, which frees their
rows before the next chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from hfax.serve import requests, tools
from hfax.serve.errors import APIError
from hfax.serve.formats import Constraint, Formats
from hfax.serve.requests import Job
from hfax.serve.scheduler import AHEAD_SHARE, Event, QueueFull, Scheduler, Sequence
from hfax.serve.text import Text


class Choice:
    """One of a request's ``n`` continuations: its sequence in the scheduler, its text and logprobs, and
    with tools the reader of its calls (:func:`hfax.serve.tools.reader`)."""

    def __init__(
        self,
        index: int,
        job: Job,
        tokenizer: Any,
        queue: asyncio.Queue,
        loop: Any,
        constraint: Constraint | None = None,
        template: Any = None,
    ) -> None:
        self.index = index
        self.text = Text(tokenizer, job.stop)
        self.finish: str | None = None
        self.tokens = 0
        self.reader = None
        if job.offered is not None:
            self.reader = tools.reader(job.offered, template, tokenizer, job.prompt(index))

        def deliver(event: Event) -> None:  # on the scheduler's thread
            loop.call_soon_threadsafe(queue.put_nowait, (self, event))

        self.sequence = Sequence(
            job.prompt(index), job.max_new, job.sampling(index), deliver, constraint
        )


class Server:
    """The API's state: the scheduler, the tokenizer, the served name and the limits."""

    def __init__(
        self, scheduler: Scheduler, tokenizer: Any, name: str, length: int, template: Any = None
    ) -> None:
        self.scheduler, self.tokenizer, self.name, self.length = scheduler, tokenizer, name, length
        self.template = template  # how the model writes tool calls (hfax.serve.tools), or None
        self.formats = Formats(tokenizer, scheduler.engine.vocab, sorted(scheduler.eos))
        self.started = int(time.time())
        self.closing = False
        self.latency: dict[str, list[float]] = {"ttft": [], "e2e": []}

    def job(self, kind: str, body: Any) -> Job:
        return requests.parse(
            kind,
            body,
            self.name,
            self.tokenizer,
            self.scheduler.fits,
            self.length,
            self.formats,
            self.template,
        )

    async def score(self, ids: list[int]) -> Any:
        """``ids``' own log-probabilities (:class:`~hfax.generation.slots.Scored`), computed on the
        scheduler's thread between decode chunks."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        try:
            self.scheduler.score(
                ids, lambda scored: loop.call_soon_threadsafe(future.set_result, scored)
            )
        except QueueFull:
            raise APIError("the server is shutting down", status=503, kind="server_error") from None
        scored = await future
        if isinstance(scored, Exception):
            raise APIError(
                "the model failed on this request; see the server's log",
                status=500,
                kind="server_error",
            )
        return scored

    async def run(
        self, job: Job, disconnected: Any
    ) -> AsyncIterator[tuple[Choice, Event, tools.Part, bool]]:
        """Queue ``job``'s choices and yield ``(choice, event, what it sends, more)`` as tokens arrive,
        until every choice finished: its new text as content, or with tools what its reader makes of it;
        ``more`` says another event is already waiting (a consumer behind may write them together).
        Cancels them all if the consumer stops early or ``disconnected()`` says so. A choice that called
        tools and stopped finishes with "tool_calls"."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        constraints: list[Constraint | None] = [None] * job.choices
        if job.grammar is not None:
            constraints = list(self.formats.constraints(job.grammar, job.choices))
        choices = [
            Choice(i, job, self.tokenizer, queue, loop, constraints[i], self.template)
            for i in range(job.choices)
        ]
        try:
            self.scheduler.submit([choice.sequence for choice in choices])
        except QueueFull:
            raise APIError(
                f"the server's queue is full ({self.scheduler.max_queue} waiting); retry later",
                status=429,
                code="queue_full",
                kind="rate_limit_error",
            ) from None
        submitted = time.perf_counter()
        first = True
        open_choices = len(choices)
        try:
            while open_choices:
                choice, event = await _next(queue, disconnected)
                if choice.finish is not None:
                    continue
                if first and event.ids:
                    self.latency["ttft"].append(time.perf_counter() - submitted)
                    first = False
                choice.tokens += len(event.ids)
                text = choice.text.add(event.ids, event.finish is not None)
                if choice.text.stopped:
                    event.finish = "stop"
                    self.scheduler.cancel(choice.sequence)
                if event.finish is not None:
                    choice.finish = event.finish
                    open_choices -= 1
                if event.finish == "error":
                    raise APIError(
                        "the model failed on this request; see the server's log",
                        status=500,
                        kind="server_error",
                    )
                part = tools.Part(text)
                if choice.reader is not None:
                    part = choice.reader.add(event.ids, text, event.finish is not None)
                    if event.finish == "stop" and choice.reader.called:
                        event.finish = choice.finish = "tool_calls"
                yield choice, event, part, not queue.empty()
        finally:
            for choice in choices:
                if choice.finish is None:
                    self.scheduler.cancel(choice.sequence)
            self.latency["e2e"].append(time.perf_counter() - submitted)


async def _next(queue: asyncio.Queue, disconnected: Any) -> tuple[Choice, Event]:
    """The next event, checking every half second whether the client went away."""
    if not queue.empty():  # no timer for an event already there
        return queue.get_nowait()
    while True:
        try:
            return await asyncio.wait_for(queue.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await disconnected():
                raise asyncio.CancelledError("the client disconnected") from None


def usage(job: Job, choices_tokens: int) -> dict[str, int]:
    prompt_tokens = sum(len(ids) for ids in job.prompts)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": choices_tokens,
        "total_tokens": prompt_tokens + choices_tokens,
    }


def _finish(reason: str | None) -> str | None:
    return "length" if reason == "cancelled" else reason


class Logprobs:
    """A choice's log-probabilities in the shape of its endpoint: completions' parallel lists, or
    chat's ``content`` entries."""

    def __init__(self, tokenizer: Any, top: int) -> None:
        self.tokenizer, self.top = tokenizer, top

    def _token(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def completions(self, event: Event, offset: int) -> dict[str, Any]:
        tokens = [self._token(t) for t in event.ids]
        offsets, at = [], offset
        for text in tokens:
            offsets.append(at)
            at += len(text)
        top = [
            {self._token(t): lp for t, lp in zip(ids[: self.top], lps[: self.top])}
            for ids, lps in zip(event.top_ids, event.top_logprobs)
        ]
        return {
            "tokens": tokens,
            "token_logprobs": event.logprobs,
            "top_logprobs": top if self.top else None,
            "text_offset": offsets,
        }

    def prompt(self, ids: list[int], scored: Any) -> dict[str, Any]:
        """``echo``'s part: the prompt's tokens with their log-probabilities (none for the first, which
        nothing comes before), as OpenAI's completions give them."""
        first = Event([ids[0]], [], [], [])
        rest = Event(ids[1:], scored.logprobs.tolist(), scored.top_ids.tolist(),
                     scored.top_logprobs.tolist())  # fmt: skip
        head, tail = self.completions(first, 0), self.completions(rest, len(self._token(ids[0])))
        return {
            "tokens": head["tokens"] + tail["tokens"],
            "token_logprobs": [None] + tail["token_logprobs"],
            "top_logprobs": [None] + tail["top_logprobs"] if self.top else None,
            "text_offset": head["text_offset"] + tail["text_offset"],
        }

    def chat(self, event: Event) -> dict[str, Any]:
        def entry(token: int, logprob: float) -> dict[str, Any]:
            text = self._token(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = []
        for token, logprob, ids, lps in zip(
            event.ids, event.logprobs, event.top_ids, event.top_logprobs
        ):
            alternatives = [entry(t, lp) for t, lp in zip(ids[: self.top], lps[: self.top])]
            content.append({**entry(token, logprob), "top_logprobs": alternatives})
        return {"content": content}


def _merge(kind: str, parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    if kind == "chat":
        return {"content": [entry for part in parts for entry in part["content"]]}
    return {key: [x for part in parts for x in (part[key] or [])] or None for key in parts[0]}


async def answer(server: Server, job: Job, disconnected: Any) -> dict[str, Any]:
    """The whole response of a request that is not streamed."""
    texts: dict[int, list[str]] = {i: [] for i in range(job.choices)}
    logs: dict[int, list[dict[str, Any]]] = {i: [] for i in range(job.choices)}
    thoughts: dict[int, list[str]] = {i: [] for i in range(job.choices)}
    calls: dict[int, list[dict[str, Any]]] = {i: [] for i in range(job.choices)}
    reasons: dict[int, str | None] = {}
    logprobs = Logprobs(server.tokenizer, job.logprobs or 0)
    tokens = 0
    async for i, echo, scored in _echoes(server, job, logprobs):
        texts[i].append(echo)
        if scored is not None:
            logs[i].append(scored)
    events = server.run(job, disconnected) if job.max_new else _nothing()
    if not job.max_new:
        reasons = dict.fromkeys(range(job.choices), "length")
    async for choice, event, sent, _ in events:
        texts[choice.index].append(sent.content)
        thoughts[choice.index].append(sent.reasoning)
        calls[choice.index] += sent.calls
        if job.logprobs is not None and event.ids:
            offset = sum(len(t) for t in texts[choice.index][:-1])
            part = (
                logprobs.chat(event) if job.kind == "chat" else logprobs.completions(event, offset)
            )
            logs[choice.index].append(part)
        if event.finish is not None:
            reasons[choice.index] = _finish(event.finish)
            tokens += choice.tokens
    choices = []
    for i in range(job.choices):
        text = "".join(texts[i])
        body: dict[str, Any] = {"index": i, "finish_reason": reasons.get(i)}
        if job.kind == "chat":
            body["message"] = {"role": "assistant", "content": text}
            if job.offered is not None:
                merged = tools.merged(calls[i])
                body["message"]["content"] = None if merged and not text else text
                body["message"]["tool_calls"] = merged
                thought = "".join(thoughts[i])
                if thought:
                    body["message"]["reasoning_content"] = thought
        else:
            body["text"] = text
        body["logprobs"] = _merge(job.kind, logs[i]) if job.logprobs is not None else None
        choices.append(body)
    return {
        **_head(server, job),
        "object": "chat.completion" if job.kind == "chat" else "text_completion",
        "choices": choices,
        "usage": usage(job, tokens),
    }


async def _echoes(
    server: Server, job: Job, logprobs: Logprobs
) -> AsyncIterator[tuple[int, str, dict[str, Any] | None]]:
    """``echo``'s part of each choice, in order: its prompt's text and, with ``logprobs``, the prompt's
    scores (:meth:`Logprobs.prompt`, one scoring per prompt); nothing without ``echo``."""
    for number, (ids, echo) in enumerate(zip(job.prompts, job.echoes or [])):
        scored = None
        if job.logprobs is not None:
            scored = logprobs.prompt(ids, await server.score(ids))
        for i in range(number * job.n, (number + 1) * job.n):
            yield i, echo, scored


async def _nothing() -> AsyncIterator[tuple[Choice, Event, tools.Part, bool]]:
    """No tokens: what ``max_tokens: 0`` with ``echo`` asks for."""
    return
    yield


def _head(server: Server, job: Job) -> dict[str, Any]:
    prefix = "chatcmpl" if job.kind == "chat" else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.name}


#: The most events one write of a stream holds (:func:`stream`).
CATCH_UP = 8


async def stream(server: Server, job: Job, disconnected: Any) -> AsyncIterator[str]:
    """The response as server-sent events: one chunk per choice and decode chunk, ``[DONE]`` last. Events
    already waiting when one is written go out with it, in one write of up to :data:`CATCH_UP`: a stream
    that fell behind (many rows, a slow reader) costs one write per catch-up, not one per decode chunk.
    The first one goes out alone, at once. With ``echo``, each choice's first chunk is its prompt (text,
    and its scores with ``logprobs``), as in the response that is not streamed; with ``max_tokens: 0``
    it is the only one, finished for ``"length"``."""
    head = {
        **_head(server, job),
        "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
    }
    logprobs = Logprobs(server.tokenizer, job.logprobs or 0)
    offsets = [0] * job.choices
    tokens, finished = 0, 0
    greeted: set[int] = set()
    try:
        ended = None if job.max_new else "length"
        async for i, echo, scored in _echoes(server, job, logprobs):
            body = {"index": i, "text": echo, "logprobs": scored, "finish_reason": ended}
            offsets[i] = len(echo)
            finished += ended is not None
            chunk = {**head, "choices": [body]}
            if finished == job.choices and not job.include_usage:
                chunk["usage"] = usage(job, tokens)
            yield _event(chunk)
        waiting: list[str] = []
        first = True
        events = server.run(job, disconnected) if job.max_new else _nothing()
        async for choice, event, sent, more in events:
            text = sent.content
            body: dict[str, Any] = {"index": choice.index, "finish_reason": _finish(event.finish)}
            if job.kind == "chat":
                delta: dict[str, Any] = {"content": text} if text else {}
                if sent.reasoning:
                    delta["reasoning_content"] = sent.reasoning
                if sent.calls:
                    delta["tool_calls"] = sent.calls
                if choice.index not in greeted:
                    delta = {"role": "assistant", **delta, "content": text}
                    greeted.add(choice.index)
                body["delta"] = delta
            else:
                body["text"] = text
            part = None
            if job.logprobs is not None and event.ids:
                part = (
                    logprobs.chat(event)
                    if job.kind == "chat"
                    else logprobs.completions(event, offsets[choice.index])
                )
            body["logprobs"] = part
            offsets[choice.index] += len(text)
            if text or sent.calls or sent.reasoning or event.ids or event.finish is not None:
                chunk = {**head, "choices": [body]}
                if event.finish is not None:
                    tokens += choice.tokens
                    finished += 1
                    if finished == job.choices and not job.include_usage:
                        chunk["usage"] = usage(job, tokens)
                waiting.append(_event(chunk))
            # Out now when nothing else waits, for a choice's first text (its time to first token), or
            # once a catch-up is long enough that holding more would delay its tokens.
            if waiting and (not more or first or len(waiting) >= CATCH_UP):
                first = False
                yield "".join(waiting)
                waiting.clear()
        if waiting:
            yield "".join(waiting)
        if job.include_usage:
            yield _event({**head, "choices": [], "usage": usage(job, tokens)})
    except APIError as error:
        if error.status < 500:  # a full queue: raised before the stream starts, answered as a 429
            raise
        yield _event(error.body())
    yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def metrics(server: Server) -> str:
    """Prometheus' text format."""
    scheduler = server.scheduler
    counters = scheduler.counters
    compiles, compile_seconds = scheduler.engine.counters()
    rows = [
        ("hfax_requests_total", "counter", "Requests accepted.", counters.requests),
        (
            "hfax_requests_rejected_total",
            "counter",
            "Requests refused with 429.",
            counters.rejected,
        ),
        ("hfax_prompt_tokens_total", "counter", "Prompt tokens prefilled.", counters.prompt_tokens),
        ("hfax_generation_tokens_total", "counter", "Tokens generated.", counters.generated_tokens),
        (
            "hfax_decode_steps_total",
            "counter",
            "Decode steps run (a guessing chunk counts the most tokens a row got in it).",
            counters.decode_steps,
        ),
        (
            "hfax_busy_row_steps_total",
            "counter",
            "Decode steps times busy rows (a guessing chunk counts its rows' tokens).",
            counters.busy_row_steps,
        ),
        ("hfax_cache_shifts_total", "counter", "Times every row's cache moved.", counters.shifts),
        (
            "hfax_prefix_reused_tokens_total",
            "counter",
            "Prompt tokens read from the prefix store instead of prefilled.",
            counters.reused_tokens,
        ),
        (
            "hfax_prefix_kept_total",
            "counter",
            "Prompt prefixes copied into the prefix store.",
            counters.kept_prefixes,
        ),
        (
            "hfax_prefill_pieces_total",
            "counter",
            "Pieces of long prompts prefilled between decode chunks.",
            counters.prefill_pieces,
        ),
        (
            "hfax_decode_chunks_ahead_total",
            "counter",
            "Decode chunks started before the last one was read (the host's work overlapping the device's).",
            counters.chunks_ahead,
        ),
        (
            "hfax_host_share",
            "gauge",
            f"The host's share of a decode turn, a moving average (NaN until measured): chunks start "
            f"ahead from {AHEAD_SHARE} on.",
            "NaN" if scheduler.host_share is None else round(scheduler.host_share, 4),
        ),
        ("hfax_queue_depth", "gauge", "Sequences waiting for a row.", scheduler.waiting),
        ("hfax_batch_occupancy", "gauge", "Rows holding a sequence.", scheduler.busy),
        ("hfax_batch_slots", "gauge", "Rows of the decode program.", scheduler.engine.slots),
        (
            "hfax_prefix_store_entries",
            "gauge",
            "Prompt prefixes the device keeps (0: prefix caching off).",
            scheduler.engine.prefixes,
        ),
        ("hfax_compiles_total", "counter", "XLA programs compiled in this process.", compiles),
        (
            "hfax_compile_seconds_total",
            "counter",
            "Seconds spent tracing and compiling.",
            compile_seconds,
        ),
    ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return "\n".join(lines) + "\n"


def tokenizer_description(tokenizer: Any, length: int) -> dict[str, Any]:
    """``/tokenizer_info``: the tokenizer's class, special tokens (as text) and chat template, and the
    tokens a row holds, the fields vLLM's endpoint gives and lm-evaluation-harness's remote tokenizer
    reads."""
    template = getattr(tokenizer, "chat_template", None)
    return {
        "tokenizer_class": type(tokenizer).__name__,
        **{
            name: getattr(tokenizer, name, None)
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        },
        "chat_template": template if isinstance(template, str) else None,
        "model_max_length": length,
    }


def build(server: Server, drain: Any = None) -> Any:
    """The Starlette application serving ``server``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def error_response(error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    async def body_of(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as error:
            raise APIError(f"the request body is not valid JSON: {error}") from None

    def endpoint(kind: str) -> Any:
        async def handle(request: Request) -> Any:
            try:
                if server.closing:
                    raise APIError("the server is shutting down", status=503, kind="server_error")
                job = server.job(kind, await body_of(request))
                if job.stream:  # Starlette cancels the stream when its client goes away
                    events = stream(server, job, _never)
                    first = await events.__anext__()  # a full queue still answers 429, not a stream
                    return StreamingResponse(
                        _prepend(first, events), media_type="text/event-stream"
                    )
                return JSONResponse(await answer(server, job, request.is_disconnected))
            except APIError as error:
                return error_response(error)

        return handle

    async def models(request: Request) -> JSONResponse:
        entry = {
            "id": server.name,
            "object": "model",
            "created": server.started,
            "owned_by": "hfax",
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def tokenize(request: Request) -> JSONResponse:
        try:
            ids = requests.tokenize(await body_of(request), server.name, server.tokenizer)
        except APIError as error:
            return error_response(error)
        return JSONResponse({"count": len(ids), "max_model_len": server.length, "tokens": ids})

    async def detokenize(request: Request) -> JSONResponse:
        try:
            ids = requests.detokenize(await body_of(request), server.name, server.tokenizer)
        except APIError as error:
            return error_response(error)
        return JSONResponse({"prompt": server.tokenizer.decode(ids)})

    async def tokenizer_info(request: Request) -> JSONResponse:
        return JSONResponse(tokenizer_description(server.tokenizer, server.length))

    async def health(request: Request) -> Any:
        if server.closing:
            return PlainTextResponse("shutting down", status_code=503)
        return PlainTextResponse("ok")

    async def metrics_endpoint(request: Request) -> PlainTextResponse:
        return PlainTextResponse(metrics(server), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, error: Exception) -> JSONResponse:
        status = getattr(error, "status_code", 404)
        message = f"{request.method} {request.url.path} is not an endpoint of hfax serve"
        return error_response(
            APIError(message, status=status, code="not_found" if status == 404 else None)
        )

    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        server.closing = True
        await asyncio.to_thread(server.scheduler.close)

    routes = [
        Route("/v1/completions", endpoint("completions"), methods=["POST"]),
        Route("/v1/chat/completions", endpoint("chat"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found}
    )


async def _never() -> bool:
    return False


async def _prepend(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    yield first
    async for event in rest:
        yield event
