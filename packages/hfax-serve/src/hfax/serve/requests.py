"""OpenAI request bodies checked and turned into what the scheduler runs, or an OpenAI-style error.

Every field OpenAI defines for ``/v1/completions`` and ``/v1/chat/completions`` is either honoured, or
refused with a 400 naming it when set to anything but its default (penalties, ``logit_bias``, tools, ...);
a field OpenAI does not define is refused too, so a typo never passes silently.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hfax.generation.rows import TOP_LOGPROBS, Sampling


class APIError(Exception):
    """An error answered as OpenAI answers it: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


#: Fields both endpoints honour.
COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
          "seed", "presence_penalty", "frequency_penalty", "logprobs", "user", "logit_bias"}  # fmt: skip
#: OpenAI's fields that hfax serve refuses unless left at their default (``None``, or the value given).
UNSUPPORTED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "suffix": None,
    "best_of": 1,
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "parallel_tool_calls": None,
    "response_format": None,
    "modalities": None,
    "audio": None,
    "prediction": None,
    "reasoning_effort": None,
    "service_tier": None,
    "store": None,
    "metadata": None,
}
FIELDS = {
    "completions": COMMON | {"prompt", "echo", "suffix", "best_of"},
    "chat": COMMON
    | {"messages", "max_completion_tokens", "top_logprobs"}
    | {name for name, _ in UNSUPPORTED.items() if name not in {"echo", "suffix", "best_of"}},
}
#: At most this many choices per request (each takes a row).
MAX_N = 16
MAX_STOPS = 4


@dataclasses.dataclass
class Job:
    """One request, checked: its prompt tokens and everything its choices and its answer need."""

    kind: str  # "completions" or "chat"
    ids: list[int]
    max_new: int
    n: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]
    logprobs: int | None  # how many top alternatives per token, or None for no logprobs
    stream: bool
    include_usage: bool
    echo: str | None = None  # completions' ``echo``: the prompt's text, put before each choice's

    def sampling(self, choice: int) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.seed, choice, self.logprobs is not None)


def parse(kind: str, body: Any, model_name: str, tokenizer: Any, fits: Any, length: int) -> Job:
    """``body`` (parsed JSON) of a ``kind`` request as a :class:`Job`, or :class:`APIError`.

    ``fits(prompt_tokens, max_new)`` says whether the server's rows hold them; ``length`` is their
    capacity in tokens, for the error message and chat's default ``max_tokens``.
    """
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[kind])
    if unknown:
        raise APIError(
            f"unknown field {unknown[0]!r}; see the OpenAI API reference", param=unknown[0]
        )
    for name, default in UNSUPPORTED.items():
        value = body.get(name)
        if name in body and value is not None and value != default and value != {}:
            raise APIError(f"{name} is not supported by hfax serve; leave it out", param=name)
    model = body.get("model")
    if model != model_name:
        raise APIError(
            f"model {model!r} is not served here; this server serves {model_name!r}",
            status=404,
            param="model",
            code="model_not_found",
        )
    ids = _prompt_ids(body, tokenizer) if kind == "completions" else _chat_ids(body, tokenizer)
    echo = body.get("echo", False) if kind == "completions" else False
    if not isinstance(echo, bool):
        raise APIError("echo must be true or false", param="echo")
    default_max = 16 if kind == "completions" else None
    max_new = _max_tokens(body, kind, default_max, echo)
    if max_new is None:
        max_new = max(1, length - len(ids))
    if not fits(len(ids), max(max_new, 1)):
        param = (
            "max_tokens" if fits(len(ids), 1) else "prompt" if kind == "completions" else "messages"
        )
        raise APIError(
            f"the prompt ({len(ids)} tokens) and max_tokens ({max_new}) exceed what a row of this server "
            f"holds ({length} tokens, the prompt counted in blocks of 16 and more); shorten the "
            "prompt or lower max_tokens",
            param=param,
            code="context_length_exceeded",
        )
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise APIError("top_p must be greater than 0 and at most 1", param="top_p")
    n = _integer(body, "n", 1, 1, MAX_N)
    seed = body.get("seed")
    if seed is None:
        seed = random.getrandbits(31)
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise APIError("seed must be an integer", param="seed")
    stream = body.get("stream", False) or False
    if not isinstance(stream, bool):
        raise APIError("stream must be true or false", param="stream")
    if echo and stream:
        raise APIError(
            "echo with stream is not supported by hfax serve; ask without stream", param="echo"
        )
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise APIError(
            'stream_options takes only {"include_usage": true|false}', param="stream_options"
        )
    return Job(
        kind=kind,
        ids=ids,
        max_new=max_new,
        n=n,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=_stop(body),
        logprobs=_logprobs(body, kind),
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        echo=_prompt_text(body, ids, tokenizer) if echo else None,
    )


def _prompt(body: dict[str, Any]) -> Any:
    """The request's ``prompt``, a batch of one prompt unwrapped."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return prompt[0]
    return prompt


def _prompt_text(body: dict[str, Any], ids: list[int], tokenizer: Any) -> str:
    """The prompt as ``echo`` gives it back: as sent, or its token ids decoded."""
    prompt = _prompt(body)
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids)


def _prompt_ids(body: dict[str, Any], tokenizer: Any) -> list[int]:
    prompt = _prompt(body)
    if isinstance(prompt, str):
        ids = tokenizer(prompt)["input_ids"]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        ids = list(prompt)
        if not all(0 <= t < len(tokenizer) for t in ids):
            raise APIError(f"prompt token ids must lie in [0, {len(tokenizer)})", param="prompt")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise APIError(
            "one prompt per request; send several prompts as several requests", param="prompt"
        )
    else:
        raise APIError("prompt must be a non-empty string or a list of token ids", param="prompt")
    if not ids:
        raise APIError("the prompt is empty after tokenization", param="prompt")
    return ids


def _chat_ids(body: dict[str, Any], tokenizer: Any) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content}", param="messages")
    plain = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise APIError(
                "every message must be an object with a role and content", param="messages"
            )
        plain.append({"role": message["role"], "content": _content(message.get("content"))})
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(
            "this model's tokenizer has no chat template; use /v1/completions", param="messages"
        )
    ids = tokenizer.apply_chat_template(
        plain, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(ids["input_ids"])


def _content(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of ``{"type": "text", "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "".join(part["text"] for part in content)
    raise APIError("message content must be a string or a list of text parts", param="messages")


def _max_tokens(body: dict[str, Any], kind: str, default: int | None, echo: bool) -> int | None:
    """The tokens to generate; 0 only with ``echo`` (the prompt alone, as scoring clients ask)."""
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or value < (0 if echo else 1):
        raise APIError(
            f"{name} must be a positive integer{' (or 0 with echo)' if kind == 'completions' else ''}",
            param=name,
        )
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise APIError(
            f"{name} must be a number from {low:g} to {high:g}, got {value!r}", param=name
        )
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise APIError(f"{name} must be an integer from {low} to {high}, got {value!r}", param=name)
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise APIError(
            f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings",
            param="stop",
        )
    return stops


def _logprobs(body: dict[str, Any], kind: str) -> int | None:
    """How many alternatives per token the answer lists (``None``: no logprobs at all)."""
    if kind == "completions":
        value = body.get("logprobs")
        if value is None:
            return None
        if not _is_int(value) or not 0 <= value <= TOP_LOGPROBS:
            raise APIError(
                f"logprobs must be an integer from 0 to {TOP_LOGPROBS}", param="logprobs"
            )
        return value
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise APIError("logprobs must be true or false", param="logprobs")
    if top is not None:
        if not wanted:
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
        if not _is_int(top) or not 0 <= top <= TOP_LOGPROBS:
            raise APIError(
                f"top_logprobs must be an integer from 0 to {TOP_LOGPROBS}", param="top_logprobs"
            )
    return (top or 0) if wanted else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
