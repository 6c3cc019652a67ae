"""A choice's text as its tokens arrive (:class:`hfax.serve.text.Text`): decoded incrementally, it equals the
tokenizer's decoding of all its tokens, however they are split into events, on a word-level and a
byte-level tokenizer (whose tokens may hold part of a character); stop strings cut it where they start."""

from __future__ import annotations

import random

import pytest

from hfax.serve.text import Text


@pytest.fixture(scope="module", params=["words", "bytes"])
def tokenizer(request, tmp_path_factory):
    from hfax.testing import save_tiny_byte_tokenizer, save_tiny_tokenizer

    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "words":
        return save_tiny_tokenizer(folder, 128)
    return save_tiny_byte_tokenizer(folder)


def streamed(tokenizer, ids: list[int], stop: list[str], seed: int) -> tuple[str, bool]:
    """The text sent for ``ids`` split into events of 1 to 4 tokens, and whether a stop string ended it."""
    generator, text, sent, start = random.Random(seed), Text(tokenizer, stop), "", 0
    while start < len(ids) and not text.stopped:
        end = start + generator.randrange(1, 5)
        sent += text.add(ids[start:end], end >= len(ids))
        start = end
    return sent, text.stopped


def test_the_streamed_text_is_the_whole_decoding(tokenizer):
    for seed in range(200):
        generator = random.Random(seed)
        ids = [generator.randrange(len(tokenizer)) for _ in range(generator.randrange(1, 40))]
        sent, _ = streamed(tokenizer, ids, [], seed)
        assert sent == tokenizer.decode(ids, skip_special_tokens=True), seed


def test_a_stop_string_cuts_the_text_where_it_starts(tokenizer):
    ids = tokenizer("the cat sat on the mat and the dog", add_special_tokens=False)["input_ids"]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    for seed in range(20):
        sent, stopped = streamed(tokenizer, ids, ["on the", "zzz"], seed)
        assert stopped and sent == whole[: whole.index("on the")], (seed, sent)
