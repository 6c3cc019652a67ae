"""OpenAI's ``response_format``: a request's output held to a grammar, one token mask per step.

    {"type": "text"}                                     no grammar (the default)
    {"type": "json_object"}                              any JSON object
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
                                                         a JSON document the schema validates

llguidance (https://github.com/guidance-ai/llguidance) compiles the JSON schema into a grammar over the
served tokenizer's tokens and, for each choice, keeps a matcher that says which tokens may come next
(:meth:`Constraint.allow`, a packed bitmask that the engine applies to the logits before the choice:
:func:`hfax.generation.rows.allow`) and advances with each chosen token (:meth:`Constraint.consume`).
When the document is complete the matcher allows nothing but EOS, and the choice ends there with
``finish_reason: "stop"``; ``max_tokens`` may cut it first (``"length"``), as OpenAI's does.

The JSON is written compact (no whitespace between its tokens, ``","`` and ``":"`` separators): with
whitespace allowed anywhere, a model may emit newlines for ever where a token of the document belongs
(vLLM's ``disable_any_whitespace`` exists for that), and a schema's own ``"x-guidance"`` options may still
ask for it. ``strict: true`` refuses a schema keyword llguidance does not implement with a 400; otherwise
such keywords are ignored and the rest of the schema still holds, OpenAI's "best effort".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import numpy as np

from hfax.serve.errors import APIError

log = logging.getLogger("hfax.serve")

#: What llguidance's JSON compiler gets before a schema's own ``"x-guidance"`` options (see the module
#: docstring).
COMPACT = {"whitespace_flexible": False}
#: OpenAI's rule for ``json_schema.name``.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Formats:
    """The served tokenizer as llguidance reads it, and the grammars of ``response_format`` fields.

    llguidance's view of the tokenizer (every token's bytes) is built once, by :meth:`prepare` before the
    server listens (seconds for a vocabulary of 262k tokens, holding the GIL, so it would stall every
    stream if a request's parse built it), or by the first request that asks for a grammar. A tokenizer it
    cannot read (a word-level one that joins its tokens with spaces, a slow Python tokenizer) is named in
    the 400 of each request with a ``response_format``, and requests without one are served as ever.
    ``vocab`` is the width of the engine's logits (it may exceed the tokenizer's), ``eos`` the tokens that
    end a choice."""

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        self.tokenizer, self.vocab, self.eos = tokenizer, vocab, eos
        self._built: Any = None
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Build llguidance's view of the tokenizer now, and log whether ``response_format`` is served."""
        started = time.perf_counter()
        try:
            self._llguidance_tokenizer()
        except APIError as error:
            log.info("hfax serve: requests with a response_format are refused: %s", error)
            return
        log.info(
            "hfax serve: response_format is served (llguidance read the tokenizer in %.1f s)",
            time.perf_counter() - started,
        )

    def _llguidance_tokenizer(self, param: str = "response_format") -> Any:
        with self._lock:
            if self._built is None:
                try:
                    import llguidance.hf

                    self._built = llguidance.hf.from_tokenizer(
                        self.tokenizer, n_vocab=self.vocab, eos_token=self.eos or None
                    )
                except Exception as error:  # noqa: BLE001 - the reason goes into each request's 400
                    self._built = error
        if isinstance(self._built, Exception):
            asks = (
                "response_format"
                if param == "response_format"
                else "a tool_choice of required or a function"
            )
            raise APIError(
                f"{asks} needs a tokenizer llguidance can read, and this model's cannot be read "
                f"({self._built}); leave {param} out",
                param=param,
            )
        return self._built

    def grammar(self, field: Any) -> str | None:
        """The llguidance grammar of a request's ``response_format``, or ``None`` for plain text; an
        :class:`APIError` naming ``response_format`` when the field or its schema is not one hfax serve
        can hold the output to."""
        if field is None:
            return None
        if not isinstance(field, dict) or set(field) - {"type", "json_schema"}:
            raise _refused('response_format must be an object {"type": ..., "json_schema": ...}')
        kind = field.get("type")
        if kind == "text" and set(field) == {"type"}:
            return None
        if kind == "json_object" and set(field) == {"type"}:
            return self._compiled({"type": "object"}, strict=True)
        if kind == "json_schema":
            schema, strict = _schema(field.get("json_schema"))
            return self._compiled(schema, strict)
        raise _refused(
            'response_format takes {"type": "text"}, {"type": "json_object"} or {"type": '
            f'"json_schema", "json_schema": {{"name": ..., "schema": {{...}}}}}}, got {field!r}'
        )

    def _compiled(
        self, schema: dict[str, Any], strict: bool, param: str = "response_format"
    ) -> str:
        """The grammar of ``schema``; a 400 naming ``param`` (``response_format``, or ``tools`` for
        :meth:`tools_grammar`) where llguidance cannot follow it."""
        from llguidance import LLMatcher

        tokenizer = self._llguidance_tokenizer(param)
        where = (
            "response_format's schema"
            if param == "response_format"
            else "a tool's parameters schema"
        )
        try:
            grammar = LLMatcher.grammar_from_json_schema(
                schema, defaults=COMPACT, overrides=None if strict else {"lenient": True}
            )
        except ValueError as error:
            raise APIError(f"{where} is not a JSON object: {error}", param=param) from None
        error = LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise APIError(f"{where} cannot be followed: {error}", param=param)
        return grammar

    def tools_grammar(self, schema: dict[str, Any], strict: bool) -> str:
        """The grammar of the calls a ``tool_choice`` of "required" or a named function holds the output
        to (:meth:`hfax.serve.tools.Offered.schema`); a 400 naming ``tools`` where it cannot be followed."""
        return self._compiled(schema, strict, param="tools")

    def constraints(self, grammar: str, count: int) -> list[Constraint]:
        """``count`` fresh matchers of ``grammar``, one per choice."""
        from llguidance import LLMatcher

        first = LLMatcher(self._llguidance_tokenizer(), grammar, log_level=0)
        if first.is_error():
            raise APIError(f"the request's grammar cannot be followed: {first.get_error()}")
        return [Constraint(first if i == 0 else first.deep_copy()) for i in range(count)]


class Constraint:
    """One choice's grammar as its tokens arrive (an llguidance ``LLMatcher``); used on the scheduler's
    thread only."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def allow(self, bitmask: np.ndarray, row: int) -> None:
        """Write the tokens that may come next into ``bitmask[row]`` (int32, one bit per token)."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, bitmask, row)

    def consume(self, token: int) -> bool:
        """Advance past ``token``; whether the output is complete (only EOS may follow), or the matcher
        failed, which it reports in :meth:`error` and which no token its masks allow should cause."""
        self.matcher.consume_token(token)
        return self.matcher.is_stopped()

    def error(self) -> str:
        return self.matcher.get_error()


def _schema(given: Any) -> tuple[dict[str, Any], bool]:
    """``json_schema``'s schema and whether it is ``strict``, checked as OpenAI defines the object."""
    if not isinstance(given, dict):
        raise _refused(
            'response_format of type json_schema needs "json_schema": {"name", "schema"}'
        )
    unknown = sorted(set(given) - {"name", "description", "schema", "strict"})
    if unknown:
        raise _refused(f"response_format.json_schema has no field {unknown[0]!r}")
    name = given.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _refused(
            "response_format.json_schema.name must be 1 to 64 letters, digits, underscores or dashes"
        )
    schema, strict = given.get("schema"), given.get("strict")
    if not isinstance(schema, dict):
        raise _refused("response_format.json_schema.schema must be a JSON schema object")
    if strict is not None and not isinstance(strict, bool):
        raise _refused("response_format.json_schema.strict must be true or false")
    return schema, bool(strict)


def _refused(message: str) -> APIError:
    return APIError(message, param="response_format")
