"""OpenAI's ``tools``: a chat request's functions go into the prompt through the model's chat template, and
each choice's output comes back as ``tool_calls``.

    tool_choice "none"          the model sees the tools and answers in text
    tool_choice "auto"          (the default with tools) the model answers in text or calls tools in its own
                                markup, read back with transformers' response parsing
                                (``transformers.utils.chat_parsing``): the tokenizer's ``response_template``,
                                else the one transformers serve falls back to for the model's family
                                (Qwen 2 and 3, Qwen 3.5, Gemma 4)
    tool_choice "required"      the output is held (llguidance, :mod:`hfax.serve.formats`) to a JSON array
                                of calls, ``[{"name": ..., "arguments": {...}}]``, each naming one of the
                                tools with arguments its ``parameters`` schema validates (one call unless
                                ``parallel_tool_calls``)
    {"type": "function", "function": {"name": ...}}
                                the output is held to that function's ``parameters``: its arguments

transformers serve reads tool calls back as "auto" does and ignores ``tool_choice``; vLLM holds "required"
and a named function to a grammar too. A choice that calls tools ends with ``finish_reason:
"tool_calls"``; streamed, a call's ``arguments`` arrive as the model writes them where its name is known
from the start (a named function), else each call whole once its markup (or its object in the array)
closes. A call the model writes malformed, or that ``max_tokens`` cuts, comes back as text, as vLLM's
does; a named function's arguments, streamed as written, stay its call's when cut (``"length"``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import uuid
from typing import Any

from hfax.serve.errors import APIError
from hfax.serve.formats import NAME
from hfax.serve.text import Text

#: OpenAI's most tools per request.
MAX_TOOLS = 128


@dataclasses.dataclass(frozen=True)
class Offered:
    """A request's ``tools`` (as OpenAI gives them, for the chat template) and what ``tool_choice`` asks:
    ``mode`` "none", "auto", "required" or "function" (the one named ``name``)."""

    tools: list[dict[str, Any]]
    mode: str
    name: str | None = None
    parallel: bool = True

    def _function(self, name: str) -> dict[str, Any]:
        return next(t["function"] for t in self.tools if t["function"]["name"] == name)

    def parameters(self, name: str) -> dict[str, Any]:
        return self._function(name).get("parameters") or {"type": "object"}

    def strict(self, name: str) -> bool:
        return bool(self._function(name).get("strict"))

    def schema(self) -> tuple[dict[str, Any], bool] | None:
        """The JSON schema the output is held to and whether strictly (every function strict), or
        ``None`` where the model writes freely ("none", "auto")."""
        if self.mode == "function":
            assert self.name is not None
            return self.parameters(self.name), self.strict(self.name)
        if self.mode != "required":
            return None
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    "arguments": self.parameters(tool["function"]["name"]),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in self.tools
        ]
        array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        return array, all(self.strict(tool["function"]["name"]) for tool in self.tools)


def offered(body: dict[str, Any]) -> Offered | None:
    """A chat body's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked as OpenAI defines
    them; ``None`` without tools."""
    given, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if given is None:
        for name in ("tool_choice", "parallel_tool_calls"):
            if body.get(name) is not None:
                raise APIError(f"{name} needs tools", param=name)
        return None
    if not isinstance(given, list) or not 1 <= len(given) <= MAX_TOOLS:
        raise APIError(f"tools must be a list of 1 to {MAX_TOOLS} functions", param="tools")
    names: set[str] = set()
    for tool in given:
        _check_tool(tool, names)
    if parallel is not None and not isinstance(parallel, bool):
        raise APIError("parallel_tool_calls must be true or false", param="parallel_tool_calls")
    if choice is None or choice in ("none", "auto", "required"):
        return Offered(given, choice or "auto", parallel=parallel is not False)
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if name is None or choice.get("type") != "function" or set(choice) != {"type", "function"}:
        raise APIError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
            '{"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise APIError(
            f"tool_choice names {name!r}, which is not among the tools", param="tool_choice"
        )
    return Offered(given, "function", name, parallel is not False)


def _check_tool(tool: Any, names: set[str]) -> None:
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(function, dict)
        or tool.get("type") != "function"
        or set(tool) != {"type", "function"}
    ):
        raise APIError('every tool must be {"type": "function", "function": {...}}', param="tools")
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise APIError(f"a tool's function has no field {unknown[0]!r}", param="tools")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise APIError(
            "a function's name must be 1 to 64 letters, digits, underscores or dashes",
            param="tools",
        )
    if name in names:
        raise APIError(f"two tools are named {name!r}", param="tools")
    names.add(name)
    if not isinstance(function.get("description", ""), str):
        raise APIError(f"function {name!r}: description must be a string", param="tools")
    if not isinstance(function.get("parameters", {}), dict):
        raise APIError(f"function {name!r}: parameters must be a JSON schema object", param="tools")
    if not isinstance(function.get("strict", False), bool):
        raise APIError(f"function {name!r}: strict must be true or false", param="tools")


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's ``tool_calls`` or a ``tool`` message's result, as chat templates take them:
    each call's ``arguments`` (OpenAI's JSON string) as the object it encodes, as transformers' chat
    templates expect; ``tool_call_id`` and ``name`` kept."""
    kept: dict[str, Any] = {}
    for name in ("tool_call_id", "name"):
        if message.get(name) is not None:
            if not isinstance(message[name], str):
                raise APIError(f"a message's {name} must be a string", param="messages")
            kept[name] = message[name]
    calls = message.get("tool_calls")
    if calls is None:
        return kept
    if message.get("role") != "assistant" or not isinstance(calls, list):
        raise APIError("tool_calls must be a list, in an assistant message", param="messages")
    converted = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(
                'every tool call must be {"id", "type": "function", "function": {"name", '
                '"arguments"}}',
                param="messages",
            )
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            raise APIError(
                f"tool call {function['name']!r}: arguments must be a JSON string", param="messages"
            ) from None
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        converted.append(entry)
    return {**kept, "tool_calls": converted}


def response_template(tokenizer: Any, config: Any) -> dict[str, Any] | None:
    """How the model writes tool calls, for "auto": the tokenizer's ``response_template``, else the
    template transformers serve falls back to for the model's family
    (``transformers.cli.serving.utils.get_response_template``, which takes a config in transformers 5.25
    and a model, for its ``config``, in 5.23: it gets an object that is both), else ``None``."""
    own = getattr(tokenizer, "response_template", None)
    if own is not None:
        return own
    try:
        from transformers.cli.serving.utils import get_response_template
    except ImportError:
        return None
    model_type = getattr(config, "model_type", None)
    both = types.SimpleNamespace(
        model_type=model_type, config=types.SimpleNamespace(model_type=model_type)
    )
    return get_response_template(tokenizer, both)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _whole(name: str, arguments: Any, index: int) -> dict[str, Any]:
    """One call as a streamed ``tool_calls`` entry that holds all of it."""
    text = arguments
    if not isinstance(arguments, str):  # compact, as the grammar of "required" writes them
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return {
        "index": index,
        "id": _call_id(),
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


@dataclasses.dataclass
class Part:
    """What a choice sends after some tokens: ``content`` and ``reasoning`` text (a template's thinking
    region: ``reasoning_content``, as transformers serve and vLLM send it) and streamed ``tool_calls``
    entries (a call's first entry holds its ``id``, ``type`` and name; later ones of the same ``index``
    add to its ``arguments``)."""

    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)


#: The fields response templates name a model's thinking by (transformers serve reads both).
REASONING = ("reasoning_content", "thinking")


def reader(offered: Offered, template: Any, tokenizer: Any, prompt: list[int]) -> Any:
    """The reader of one choice's output under ``offered`` (not "none"): each has ``add(ids, text,
    final)``, which turns the choice's new tokens (and their ``text``, special tokens left out) into the
    :class:`Part` it sends now, and ``called``, the calls sent so far; :func:`merged` joins the streamed
    calls into those of a whole answer, as a client joins them."""
    if offered.mode == "function":
        assert offered.name is not None
        return Arguments(offered.name)
    if offered.mode == "required":
        return Calls()
    return Markup(offered, template, tokenizer, prompt)


class Arguments:
    """A named function's call: its arguments are the output, sent as they are written."""

    def __init__(self, name: str) -> None:
        self.name, self.called = name, 0

    def add(self, ids: list[int], text: str, final: bool) -> Part:
        if self.called:
            return Part(calls=[{"index": 0, "function": {"arguments": text}}] if text else [])
        self.called = 1
        return Part(calls=[_whole(self.name, text, 0)])


class Calls:
    """ "required"'s array of calls, each sent once its object closes (the grammar writes the array
    compact and valid, so its brackets and quotes say where a call ends); a call cut by ``max_tokens``
    as text."""

    def __init__(self) -> None:
        self.called = 0
        self.held = ""  # the output so far
        self.depth, self.start = 0, -1  # its brackets open, and where the call being written starts
        self.quoted = self.escaped = False  # inside a string, after its backslash

    def add(self, ids: list[int], text: str, final: bool) -> Part:
        part = Part()
        for char in text:
            self.held += char
            if self.quoted:
                self.escaped, self.quoted = (
                    (False, True) if self.escaped else (char == "\\", char != '"')
                )
            elif char == '"':
                self.quoted = True
            elif char in "[{":
                self.depth += 1
                if self.depth == 2:
                    self.start = len(self.held) - 1
            elif char in "]}":
                self.depth -= 1
                if self.depth == 1:
                    call = json.loads(self.held[self.start :])
                    part.calls.append(_whole(call["name"], call["arguments"], self.called))
                    self.called, self.start = self.called + 1, -1
        if final and self.start >= 0:
            part.content = self.held[self.start :]
        return part


class Markup:
    """ "auto": the model's own markup read by transformers' ``ResponseParser`` from the output with its
    special tokens (a template's markers may be special tokens), decoded by a :class:`Text` that keeps
    them, after the prompt (``prefix``: a template may open a region there). Content and reasoning go
    out as they are parsed, each call once its region closes; once a call cannot be read, the rest of
    the choice's text goes out as content."""

    def __init__(self, offered: Offered, template: Any, tokenizer: Any, prompt: list[int]) -> None:
        from transformers.utils.chat_parsing import ResponseParser

        prefix = tokenizer.decode(prompt, skip_special_tokens=False)
        self.parser: Any = ResponseParser(template, prefix=prefix, tools=offered.tools)
        self.special = Text(tokenizer, [], special=True)
        self.called = 0
        self.sent = ""  # content sent so far
        self.plain = ""  # the choice's text so far

    def add(self, ids: list[int], text: str, final: bool) -> Part:
        self.plain += text
        return self._parsed(self.special.add(ids, final), final)

    def _parsed(self, text: str, final: bool) -> Part:
        if self.parser is None:  # a call could not be read: the rest is text
            rest = self.plain[len(os.path.commonprefix([self.plain, self.sent])) :]
            self.sent += rest
            return Part(rest)
        part = Part()
        try:
            events = self.parser.feed(text)
            if final:
                events += self.parser.finalize()[1]
        except ValueError:
            self.parser = None
            return self._parsed("", final)
        for event in events:
            field = event.get("field")
            if event["type"] == "region_chunk" and not event.get("dirty"):
                if field == "content":
                    part.content += event.get("text") or ""
                elif field in REASONING:
                    part.reasoning += event.get("text") or ""
            elif event["type"] == "region_close" and field == "tool_calls":
                function = event["value"]["function"]
                part.calls.append(_whole(function["name"], function["arguments"], self.called))
                self.called += 1
        self.sent += part.content
        return part


def merged(entries: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The calls a choice's streamed ``tool_calls`` entries make, joined by ``index``; ``None`` for none."""
    calls: dict[int, dict[str, Any]] = {}
    for entry in entries:
        index = entry["index"]
        if index not in calls:
            calls[index] = {k: v for k, v in entry.items() if k != "index"}
            calls[index]["function"] = dict(entry["function"])
        else:
            calls[index]["function"]["arguments"] += entry["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)] or None
