"""Training data from a JSON-lines file: records, tokenized examples, and padded batches in a few shapes.

A record is ``{"text": ...}`` (every token scored) or ``{"prompt": ..., "completion": ...}`` (only the
completion scored; through the tokenizer's chat template when it has one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hfax.backends.jax.train.step import IGNORE


def read_records(path: str | Path) -> list[dict[str, str]]:
    """Every record of a JSON-lines file; a malformed line is an error naming its number."""
    records = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            if not _valid(record):
                raise ValueError(
                    f'{path}:{number}: expected {{"text": "..."}} or {{"prompt": "...", '
                    f'"completion": "..."}} with string values, got {line.strip()[:80]!r}'
                )
            records.append(record)
    if not records:
        raise ValueError(f"{path} holds no records; write one JSON object per line")
    return records


def _valid(record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    keys = {"text"} if "text" in record else {"prompt", "completion"}
    return keys <= set(record) and all(isinstance(record[key], str) for key in keys)


def tokenize(
    record: dict[str, str], tokenizer: Any, max_length: int
) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of one record, cut to ``max_length`` tokens; unscored tokens are labelled -100."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if "text" in record:
        ids = tokenizer(record["text"])["input_ids"] + eos
        return ids[:max_length], ids[:max_length]
    if getattr(tokenizer, "chat_template", None):
        user = [{"role": "user", "content": record["prompt"]}]
        prompt = _chat_ids(tokenizer, user, add_generation_prompt=True)
        reply = {"role": "assistant", "content": record["completion"]}
        ids = _chat_ids(tokenizer, [*user, reply])
    else:
        prompt = tokenizer(record["prompt"])["input_ids"]
        ids = prompt + tokenizer(record["completion"], add_special_tokens=False)["input_ids"] + eos
    labels = [IGNORE] * len(prompt) + ids[len(prompt) :]
    return ids[:max_length], labels[:max_length]


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]], **options: Any) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **options)
    return list(ids["input_ids"])


def buckets(max_length: int, smallest: int = 32) -> list[int]:
    """Padded lengths: powers of two from ``smallest`` up to ``max_length`` (the train step compiles once
    for each)."""
    sizes = [smallest]
    while sizes[-1] < max_length:
        sizes.append(min(sizes[-1] * 2, max_length))
    return sizes


def pad(
    examples: list[tuple[list[int], list[int]]], pad_id: int, sizes: list[int]
) -> dict[str, np.ndarray]:
    """One batch, right-padded to the smallest bucket that holds its longest example."""
    width = next(size for size in sizes if size >= max(len(ids) for ids, _ in examples))
    ids = np.full((len(examples), width), pad_id, np.int32)
    labels = np.full((len(examples), width), IGNORE, np.int32)
    mask = np.zeros((len(examples), width), np.int32)
    for row, (tokens, scored) in enumerate(examples):
        ids[row, : len(tokens)] = tokens
        labels[row, : len(scored)] = scored
        mask[row, : len(tokens)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def batches(
    examples: list[tuple[list[int], list[int]]],
    batch_size: int,
    pad_id: int,
    sizes: list[int],
    seed: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless shuffled batches of ``batch_size`` examples (each epoch in a new order)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(examples))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield pad([examples[i] for i in order[start : start + batch_size]], pad_id, sizes)
        if len(order) < batch_size:
            yield pad([examples[i] for i in rng.choice(len(examples), batch_size)], pad_id, sizes)
