"""``response_format`` as grammars (:mod:`hfax.serve.formats`), on hfax.testing's byte-level tokenizer,
without a model: which fields are refused, and how a choice's matcher allows, advances and completes.
The server applying them is tested in the repository's ``tests/test_serve.py``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hfax.serve.errors import APIError
from hfax.serve.formats import Formats

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    from hfax.testing import save_tiny_byte_tokenizer

    tokenizer = save_tiny_byte_tokenizer(tmp_path_factory.mktemp("bytes"))
    return Formats(tokenizer, vocab=len(tokenizer) + 3, eos=[2])  # logits wider than the tokenizer


def _allowed(formats: Formats, constraint) -> set[int]:
    bitmask = np.zeros((1, (formats.vocab + 31) // 32), np.int32)  # one bit per token
    constraint.allow(bitmask, 0)
    tokens = np.arange(formats.vocab)
    return set(tokens[(bitmask[0, tokens // 32] >> (tokens % 32)) & 1 == 1].tolist())


def test_text_is_no_grammar_and_json_holds_each_step_to_the_schema(formats):
    assert formats.grammar(None) is None and formats.grammar({"type": "text"}) is None
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    grammar = formats.grammar(
        {"type": "json_schema", "json_schema": {"name": "flag", "schema": schema, "strict": True}}
    )
    first, second = formats.constraints(grammar, 2)
    ids = formats.tokenizer('{"ok":false}', add_special_tokens=False)["input_ids"]
    assert _allowed(formats, first) == set(ids[:1])  # compact JSON: "{" and nothing else
    assert not any(first.consume(token) for token in ids[:-1])
    assert first.consume(ids[-1]) and not first.error()  # complete at "}"
    assert _allowed(formats, first) == {2}  # only EOS may follow
    assert _allowed(formats, second) == set(ids[:1])  # each choice's matcher is its own
    assert max(_allowed(formats, second)) < len(formats.tokenizer)  # no token past the tokenizer's
    anything = formats.constraints(formats.grammar({"type": "json_object"}), 1)[0]
    text = json.dumps({"a": [1, "b"]}, separators=(",", ":"))
    ids = formats.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert [anything.consume(token) for token in ids] == [False] * (len(ids) - 1) + [True]


@pytest.mark.parametrize(
    "field, says",
    [
        ({"type": "xml"}, "takes"),
        ("json_object", "must be an object"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "name"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}, "extra"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "nope"),
    ],
)
def test_fields_and_schemas_it_cannot_follow_are_refused_naming_response_format(
    formats, field, says
):
    with pytest.raises(APIError) as raised:
        formats.grammar(field)
    assert raised.value.param == "response_format" and says in str(raised.value)


def test_strict_refuses_keywords_llguidance_lacks_and_otherwise_ignores_them(formats):
    schema = {"type": "string", "format": "no-such-format-xyz"}
    strict = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    loose = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert formats.grammar(loose)
    with pytest.raises(APIError):
        formats.grammar(strict)
