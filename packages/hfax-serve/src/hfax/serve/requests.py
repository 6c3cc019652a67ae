"""OpenAI request bodies checked and turned into what the scheduler runs, or an OpenAI-style error.

Every field OpenAI defines for ``/v1/completions`` and ``/v1/chat/completions`` is either honoured, or
refused with a 400 naming it when set to anything but its default (``best_of``, ``suffix``, ...);
a field OpenAI does not define is refused too, so a typo never passes silently. ``response_format``
(chat's field, which completions take too, as vLLM's do) is checked and compiled by
:mod:`hfax.serve.formats`, chat's ``tools`` by :mod:`hfax.serve.tools`.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hfax.generation.rows import MAX_BIASED, TOP_LOGPROBS, Sampling
from hfax.serve import tools
from hfax.serve.errors import APIError

#: Fields both endpoints honour.
COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
          "seed", "presence_penalty", "frequency_penalty", "logprobs", "user", "logit_bias",
          "response_format"}  # fmt: skip
#: OpenAI's fields that hfax serve refuses unless left at their default (``None``, or the value given).
UNSUPPORTED = {
    "suffix": None,
    "best_of": 1,
    "functions": None,
    "function_call": None,
    "modalities": None,
    "audio": None,
    "prediction": None,
    "reasoning_effort": None,
    "service_tier": None,
    "store": None,
    "metadata": None,
}
#: Why a refused field is refused, where leaving it out is not the whole answer.
REASONS = {
    "best_of": "hfax serve ranks no candidates on the server; ask for n choices with logprobs and "
    "rank them by their token_logprobs",
    "suffix": "filling in before a suffix needs the model's own infilling tokens, which hfax serve does "
    "not know; send the text before it as the prompt",
    "modalities": "hfax serve answers in text only",
    "audio": "hfax serve answers in text only",
    "functions": "OpenAI's deprecated form; send tools",
    "function_call": "OpenAI's deprecated form; send tool_choice",
}
FIELDS = {
    "completions": COMMON | {"prompt", "echo", "suffix", "best_of"},
    "chat": COMMON
    | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice"}
    | {"parallel_tool_calls"}
    | {name for name, _ in UNSUPPORTED.items() if name not in {"echo", "suffix", "best_of"}},
}
#: At most this many choices per request (each takes a row).
MAX_N = 16
MAX_STOPS = 4


@dataclasses.dataclass
class Job:
    """One request, checked: its prompts' tokens and everything its choices and its answer need.

    A completions request may send several prompts; each gets ``n`` choices, numbered prompt by prompt
    (choice ``i`` continues prompt ``i // n``), and each prompt's choices are those a request of that
    prompt alone would get (the same seed draws the same tokens)."""

    kind: str  # "completions" or "chat"
    prompts: list[list[int]]
    max_new: int
    n: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]
    logprobs: int | None  # how many top alternatives per token, or None for no logprobs
    stream: bool
    include_usage: bool
    echoes: list[str] | None = None  # completions' ``echo``: each prompt's text

    presence: float = 0.0  # OpenAI's presence_penalty
    frequency: float = 0.0  # OpenAI's frequency_penalty
    bias: tuple[tuple[int, float], ...] = ()  # OpenAI's logit_bias as (token, bias) pairs
    grammar: str | None = None  # response_format (or tool_choice) as an llguidance grammar
    offered: tools.Offered | None = None  # chat's tools, unless tool_choice is "none"

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    def prompt(self, choice: int) -> list[int]:
        return self.prompts[choice // self.n]

    def sampling(self, choice: int) -> Sampling:
        return Sampling(
            self.temperature,
            self.top_p,
            self.seed,
            choice % self.n,
            self.logprobs is not None,
            self.presence,
            self.frequency,
            self.bias,
        )


def parse(
    kind: str,
    body: Any,
    model_name: str,
    tokenizer: Any,
    fits: Any,
    length: int,
    formats: Any,
    template: Any = None,
) -> Job:
    """``body`` (parsed JSON) of a ``kind`` request as a :class:`Job`, or :class:`APIError`.

    ``fits(prompt_tokens, max_new)`` says whether the server's rows hold them; ``length`` is their
    capacity in tokens, for the error message and chat's default ``max_tokens``. ``formats`` (a
    :class:`hfax.serve.formats.Formats`) turns ``response_format`` or ``tool_choice`` into a grammar,
    last, so that a request refused for another field costs no grammar. ``template`` is how the model
    writes tool calls (:func:`hfax.serve.tools.response_template`), which ``tool_choice: "auto"`` needs.
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
            reason = REASONS.get(name, "leave it out")
            raise APIError(f"{name} is not supported by hfax serve: {reason}", param=name)
    model = body.get("model")
    if model != model_name:
        raise APIError(
            f"model {model!r} is not served here; this server serves {model_name!r}",
            status=404,
            param="model",
            code="model_not_found",
        )
    offered = tools.offered(body) if kind == "chat" else None
    if offered is not None:
        _check_tool_use(body, offered, template)
    sent = _each(body) if kind == "completions" else []
    if kind == "completions":
        prompts = _prompts(sent, tokenizer)
    else:
        prompts = [_chat_ids(body, tokenizer, functions=None if offered is None else offered.tools)]
        if offered is not None and offered.mode in ("none", "auto"):
            if prompts[0] == _chat_ids(body, tokenizer):
                raise APIError(
                    f"this model's chat template does not show tools to the model, so tool_choice "
                    f'"{offered.mode}" would ignore them; use tool_choice "required" or name a '
                    "function (hfax serve holds the output to their schemas), or leave tools out",
                    param="tools",
                )
    longest = max(len(ids) for ids in prompts)
    echo = body.get("echo", False) if kind == "completions" else False
    if not isinstance(echo, bool):
        raise APIError("echo must be true or false", param="echo")
    default_max = 16 if kind == "completions" else None
    max_new = _max_tokens(body, kind, default_max, echo)
    if max_new is None:
        max_new = max(1, length - longest)
    if not fits(longest, max(max_new, 1)):
        param = (
            "max_tokens" if fits(longest, 1) else "prompt" if kind == "completions" else "messages"
        )
        raise APIError(
            f"the prompt ({longest} tokens) and max_tokens ({max_new}) exceed what a row of this server "
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
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise APIError(
            'stream_options takes only {"include_usage": true|false}', param="stream_options"
        )
    return Job(
        kind=kind,
        prompts=prompts,
        max_new=max_new,
        n=n,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=_stop(body),
        logprobs=_logprobs(body, kind),
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        echoes=[_prompt_text(one, ids, tokenizer) for one, ids in zip(sent, prompts)]
        if echo
        else None,
        presence=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        bias=_bias(body, len(tokenizer)),
        grammar=_grammar(body, offered, formats),
        offered=offered if offered is not None and offered.mode != "none" else None,
    )


def _check_tool_use(body: dict[str, Any], offered: tools.Offered, template: Any) -> None:
    """Refuse what ``tools`` cannot go with: ``stop`` and ``response_format`` unless the model only sees
    the tools (the end of a call is the model's markup, or its grammar's), "auto" where the model's way of
    writing calls is not known."""
    if offered.mode == "none":
        return
    for name in ("stop", "response_format"):
        if body.get(name) is not None:
            raise APIError(
                f'{name} does not go with tools unless tool_choice is "none": a call ends where '
                f"its markup or its schema does; leave {name} out",
                param=name,
            )
    if offered.mode == "auto" and template is None:
        raise APIError(
            'tool_choice "auto" reads calls from the model\'s own markup, and hfax serve does not know '
            "this model's (its tokenizer has no response_template, and transformers has none for its "
            'family); use tool_choice "required" or name a function, which hfax serve holds to the '
            "tools' schemas",
            param="tool_choice",
        )


def _grammar(body: dict[str, Any], offered: tools.Offered | None, formats: Any) -> str | None:
    """The grammar of the output: a tool_choice's calls, else ``response_format``'s, else ``None``."""
    schema = None if offered is None else offered.schema()
    if schema is not None:
        return formats.tools_grammar(*schema)
    return formats.grammar(body.get("response_format"))


#: At most this many prompts in one completions request (each of their choices takes a row).
MAX_PROMPTS = 64


def _each(body: dict[str, Any]) -> list[Any]:
    """The request's ``prompt``, one entry per prompt: a string or a list of token ids is one prompt, a
    list of those is several."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return prompt
    return [prompt]


def _prompts(prompts: list[Any], tokenizer: Any) -> list[list[int]]:
    """Each prompt's token ids (``prompts`` as :func:`_each` gives them)."""
    if len(prompts) > MAX_PROMPTS:
        raise APIError(
            f"at most {MAX_PROMPTS} prompts per request; send the rest in another", param="prompt"
        )
    return [_prompt_ids({"prompt": prompt}, tokenizer) for prompt in prompts]


def _prompt_text(prompt: Any, ids: list[int], tokenizer: Any) -> str:
    """A prompt as ``echo`` gives it back: as sent, or its token ids decoded."""
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids)


def _prompt_ids(body: dict[str, Any], tokenizer: Any, special: bool = True) -> list[int]:
    """The token ids of ``body``'s one ``prompt``: a string, or a list of ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=special)["input_ids"]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        ids = list(prompt)
        if not all(0 <= t < len(tokenizer) for t in ids):
            raise APIError(f"prompt token ids must lie in [0, {len(tokenizer)})", param="prompt")
    else:
        raise APIError("prompt must be a non-empty string or a list of token ids", param="prompt")
    if not ids:
        raise APIError("the prompt is empty after tokenization", param="prompt")
    return ids


#: The fields of ``/tokenize`` and ``/detokenize`` (vLLM's endpoints, which lm-evaluation-harness's remote
#: tokenizer calls).
TOKENIZE_FIELDS = {
    "model", "prompt", "messages", "tools", "add_special_tokens", "add_generation_prompt",
}  # fmt: skip
DETOKENIZE_FIELDS = {"model", "tokens"}


def tokenize(body: Any, model_name: str, tokenizer: Any) -> list[int]:
    """A ``/tokenize`` body's token ids: its ``prompt`` (``add_special_tokens``, default true), or its chat
    ``messages`` (and ``tools``) through the chat template (``add_generation_prompt``, default true), as
    the completion endpoints would tokenize them."""
    body = _tool_body(body, TOKENIZE_FIELDS, model_name)
    special = _flag(body, "add_special_tokens", True)
    generation_prompt = _flag(body, "add_generation_prompt", True)
    if ("prompt" in body) == ("messages" in body):
        raise APIError("send either prompt or messages", param="prompt")
    if "prompt" in body:
        return _prompt_ids(body, tokenizer, special)
    offered = tools.offered({"tools": body.get("tools")})
    return _chat_ids(body, tokenizer, generation_prompt, None if offered is None else offered.tools)


def detokenize(body: Any, model_name: str, tokenizer: Any) -> list[int]:
    """A ``/detokenize`` body's ``tokens``, checked to lie in the vocabulary."""
    body = _tool_body(body, DETOKENIZE_FIELDS, model_name)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        raise APIError("tokens must be a list of token ids", param="tokens")
    if not all(0 <= t < len(tokenizer) for t in tokens):
        raise APIError(f"token ids must lie in [0, {len(tokenizer)})", param="tokens")
    return tokens


def _tool_body(body: Any, fields: set[str], model_name: str) -> dict[str, Any]:
    """A tokenizer endpoint's body: an object of known fields, naming this server's model if any."""
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise APIError(f"unknown field {unknown[0]!r}", param=unknown[0])
    if body.get("model") not in (None, model_name):
        raise APIError(
            f"model {body['model']!r} is not served here; this server serves {model_name!r}",
            status=404,
            param="model",
            code="model_not_found",
        )
    return body


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise APIError(f"{name} must be true or false", param=name)
    return value


def _chat_ids(
    body: dict[str, Any], tokenizer: Any, generation_prompt: bool = True, functions: Any = None
) -> list[int]:
    """The chat template's tokens of ``body``'s ``messages`` (with the tools ``functions``, and the calls
    and results of earlier turns: :func:`hfax.serve.tools.template_message`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("messages must be a non-empty list of {role, content}", param="messages")
    plain = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise APIError(
                "every message must be an object with a role and content", param="messages"
            )
        content = message.get("content")
        calls = message.get("tool_calls") is not None
        plain.append(
            {
                "role": message["role"],
                "content": "" if content is None and calls else _content(content),
                **tools.template_message(message),
            }
        )
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(
            "this model's tokenizer has no chat template; use /v1/completions", param="messages"
        )
    ids = tokenizer.apply_chat_template(
        plain,
        tools=functions,
        add_generation_prompt=generation_prompt,
        tokenize=True,
        return_dict=True,
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


def _bias(body: dict[str, Any], vocabulary: int) -> tuple[tuple[int, float], ...]:
    """``logit_bias``, OpenAI's ``{"token id": bias from -100 to 100}``, as ``(token, bias)`` pairs."""
    given = body.get("logit_bias")
    if given is None:
        return ()
    message = (
        f"logit_bias must map at most {MAX_BIASED} token ids (as strings, below {vocabulary}) "
        "to numbers from -100 to 100"
    )
    if not isinstance(given, dict) or len(given) > MAX_BIASED:
        raise APIError(message, param="logit_bias")
    pairs = []
    for key, value in given.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else -1
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not 0 <= token < vocabulary or not number or not -100 <= value <= 100:
            raise APIError(f"{message}; got {key!r}: {value!r}", param="logit_bias")
        pairs.append((token, float(value)))
    return tuple(pairs)


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
