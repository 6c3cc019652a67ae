"""A choice's output read back as tool calls (:func:`hfax.serve.tools.reader`), token chunk by token
chunk as the scheduler delivers them, against transformers' own parse of the whole message
(``tokenizer.parse_response``); and the checks of ``tools`` and ``tool_choice``."""

from __future__ import annotations

import json
import random
import types

import pytest

from hfax.serve import tools
from hfax.serve.errors import APIError
from hfax.serve.text import Text

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
PROMPT = "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from hfax.testing import save_tiny_byte_tokenizer

    return save_tiny_byte_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def _read(tokenizer, offered: tools.Offered, output: str, seed: int) -> tuple[str, str, list, str]:
    """``output``'s tokens through :func:`tools.reader`'s reader in random chunks of 1 to 5 tokens: the
    content and reasoning sent, the merged calls, and the streamed entries as JSON."""
    template = tools.response_template(tokenizer, types.SimpleNamespace(model_type="qwen2"))
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    reader = tools.reader(offered, template, tokenizer, prompt)
    text = Text(tokenizer, [])
    ids = tokenizer(output, add_special_tokens=False)["input_ids"]
    rng = random.Random(seed)
    content = reasoning = ""
    entries: list = []
    at = 0
    while at < len(ids):
        step = rng.randint(1, 5)
        chunk, at = ids[at : at + step], at + step
        final = at >= len(ids)
        part = reader.add(chunk, text.add(chunk, final), final)
        content, reasoning, entries = (
            content + part.content,
            reasoning + part.reasoning,
            entries + part.calls,
        )
    return content, reasoning, tools.merged(entries) or [], json.dumps(entries)


CALLS = (
    "Let me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


@pytest.mark.parametrize(
    "output",
    [CALLS, "<think>sunny, I guess</think>" + CALLS, "It is sunny in Paris.", "no call, no end"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_reads_content_reasoning_and_calls_as_transformers_parses_the_whole_message(
    tokenizer, output, seed
):
    offered = tools.Offered([WEATHER, TIME], "auto")
    template = tools.response_template(tokenizer, types.SimpleNamespace(model_type="qwen2"))
    want = tokenizer.parse_response(output, template, prefix=PROMPT, tools=[WEATHER, TIME])
    content, reasoning, calls, _ = _read(tokenizer, offered, output, seed)
    assert content == want.get("content", "")
    assert reasoning == (want.get("reasoning_content") or "")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls", [])
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_malformed_or_cut_call_comes_back_as_the_text(tokenizer, seed):
    """transformers' parse fails on both (ValueError); the choice's whole text is its content."""
    offered = tools.Offered([WEATHER], "auto")
    for output in (
        "Sure.\n<tool_call>\n{bad json}\n</tool_call> after",
        'Ok <tool_call>{"name": "get',
    ):
        content, _, calls, _ = _read(tokenizer, offered, output, seed)
        assert calls == [] and content == output


def test_a_named_function_streams_its_arguments_and_required_sends_each_call_whole(tokenizer):
    arguments = '{"city":"Paris","days":3}'
    named = tools.Offered([WEATHER, TIME], "function", "get_weather")
    content, _, calls, streamed = _read(tokenizer, named, arguments, 0)
    assert content == "" and len(calls) == 1
    assert calls[0]["function"] == {"name": "get_weather", "arguments": arguments}
    assert len(json.loads(streamed)) > 1  # the arguments arrived in pieces, the name in the first
    assert [e.get("id") is not None for e in json.loads(streamed)] == [True] + [False] * (
        len(json.loads(streamed)) - 1
    )
    required = tools.Offered([WEATHER, TIME], "required")
    output = (
        '[{"name":"get_time","arguments":{}},{"name":"get_weather","arguments":{"city":"Oslo"}}]'
    )
    content, _, calls, _ = _read(tokenizer, required, output, 1)
    assert content == ""
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_time", {}),
        ("get_weather", {"city": "Oslo"}),
    ]
    # max_tokens ended it in the second call: the first is a call, the second's start text.
    cut = output[:50]
    content, _, calls, _ = _read(tokenizer, required, cut, 1)
    assert content == cut[len('[{"name":"get_time","arguments":{}},') :]
    assert [c["function"]["name"] for c in calls] == ["get_time"]


def test_required_sends_each_call_once_its_object_closes(tokenizer):
    """Strings holding brackets, quotes and backslashes do not end a call; each call goes out in the
    chunk its closing brace arrives in, not at the end."""
    required = tools.Offered([WEATHER, TIME], "required")
    first = '{"name":"get_weather","arguments":{"city":"a}\\"b]{","days":[1,[2]]}}'
    output = f'[{first},{{"name":"get_time","arguments":{{}}}}]'
    reader = tools.reader(required, None, tokenizer, [])
    sent = [reader.add([], char, at == len(output) - 1) for at, char in enumerate(output)]
    closed = [at for at, part in enumerate(sent) if part.calls]
    assert closed == [len(first), len(output) - 2]
    assert (
        json.loads(sent[closed[0]].calls[0]["function"]["arguments"])
        == json.loads(first)["arguments"]
    )
    assert all(part.content == "" for part in sent)


def test_required_holds_the_output_to_an_array_of_the_tools_calls():
    schema, strict = tools.Offered([WEATHER, TIME], "required", parallel=False).schema()
    assert not strict and schema["minItems"] == schema["maxItems"] == 1
    names = [item["properties"]["name"] for item in schema["items"]["anyOf"]]
    assert names == [{"const": "get_weather"}, {"const": "get_time"}]
    assert (
        schema["items"]["anyOf"][0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    )
    assert "maxItems" not in tools.Offered([WEATHER], "required").schema()[0]
    named = tools.Offered([WEATHER, TIME], "function", "get_time").schema()
    assert named == ({"type": "object"}, False)
    assert tools.Offered([WEATHER], "auto").schema() is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"tools": []}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)  # fmt: skip
def test_bad_tools_and_tool_choices_are_refused_naming_the_field(body, param):
    with pytest.raises(APIError) as error:
        tools.offered(body)
    assert error.value.param == param and str(error.value)


def test_earlier_calls_and_results_reach_the_chat_template_as_transformers_takes_them():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    message = tools.template_message({"role": "assistant", "content": None, "tool_calls": [call]})
    assert message == {"tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert tools.template_message(result) == {"tool_call_id": "call_1"}
    with pytest.raises(APIError):
        tools.template_message({"role": "user", "content": "x", "tool_calls": [call]})
    bad = {**call, "function": {"name": "get_weather", "arguments": "{not json"}}
    with pytest.raises(APIError):
        tools.template_message({"role": "assistant", "tool_calls": [bad]})
