"""A choice's text as its tokens arrive: what ``hfax serve`` streams (:mod:`hfax.serve.app`) and what a
response template reads tool calls from (:mod:`hfax.serve.tools`)."""

from __future__ import annotations

from typing import Any


class Text:
    """One choice's text as tokens arrive, cut at the first ``stop`` string and held back while its end
    could still start one.

    Decoded incrementally, so a token costs the same however long the text already is: each new piece is
    the decoding of the tokens since the last settled point minus that of the tokens before them, read from
    one settled piece back (a tokenizer may write a token differently at the start of a text: a leading
    space, a byte of a character). The new tokens settle once their decoding ends in a whole character
    (no ``\ufffd``); until then they wait. Where a decoder's pieces do not add up to its whole decoding,
    the whole text is decoded again. With ``special`` the special tokens are written too (what a response
    template reads: :mod:`hfax.serve.tools`)."""

    def __init__(self, tokenizer: Any, stop: list[str], special: bool = False) -> None:
        self.tokenizer, self.stop, self.special = tokenizer, stop, special
        self.ids: list[int] = []
        self.text = ""  # the settled tokens' text
        self.prefix = self.read = 0  # the piece before the settled point starts at ``prefix``
        self.sent = 0  # characters already handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=not self.special)

    def add(self, ids: list[int], final: bool) -> str:
        """The new text that may be sent after ``ids``; everything left when ``final``."""
        self.ids += ids
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if final or (len(after) > len(before) and not after.endswith("\ufffd")):
            if after.startswith(before):
                self.text += after[len(before) :]
            else:
                self.text = self._decode(self.ids)
            self.prefix, self.read = self.read, len(self.ids)
        text = self.text
        for stop in self.stop:
            at = text.find(stop, max(0, self.sent - len(stop) + 1))
            if at >= 0:
                text, self.stopped, final = text[:at], True, True
        end = len(text)
        if not final:
            hold = max((len(s) - 1 for s in self.stop), default=0)
            end = max(self.sent, len(text.rstrip("\ufffd")) - hold)
        new, self.sent = text[self.sent : end], max(self.sent, end)
        return new
