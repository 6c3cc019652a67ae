"""Choosing the next token: greedy, sampling and beam search, in torch ops every backend runs compiled.

Sampling draws from a counter-based hash of ``(seed, step, row, token)`` in 32-bit integer arithmetic
(murmur3's finalizer), through the Gumbel-max trick: ``argmax(scores + gumbel)`` picks a token with
probability ``softmax(scores)``, as transformers' ``torch.multinomial`` does, without any random-number
state. The arithmetic wraps the same way in XLA (JAX, torch_xla) and PyTorch, so the same seed gives the
same tokens on both backends.
"""

from __future__ import annotations

from typing import Any

#: murmur3's constants as signed 32-bit integers (torch refuses Python ints that overflow int32).
_GOLDEN = -1640531535  # 0x9E3779B1
_MIX_1 = -2048144789  # 0x85EBCA6B
_MIX_2 = -1028477387  # 0xC2B2AE35


def _shift_right(x: Any, bits: int) -> Any:
    """A logical right shift of int32 ``x`` by 1 to 31 ``bits``.

    Only non-negative values go through ``>>``: on negative ones torch_xla 2.9's ``>>`` rounds toward zero
    (``-5 >> 16`` is 0, not -1), PyTorch and JAX round down. The sign bit is added back where it lands.
    """
    import torch

    low = (x & 0x7FFFFFFF) >> bits
    return low | (x < 0).to(torch.int32) * (1 << (31 - bits))


def _mix(x: Any) -> Any:
    x = x ^ _shift_right(x, 16)
    x = x * _MIX_1
    x = x ^ _shift_right(x, 13)
    x = x * _MIX_2
    return x ^ _shift_right(x, 16)


def uniform(seed: Any, step: Any, rows: Any, vocab: int) -> Any:
    """``[len(rows), vocab]`` float32 noise in (0, 1), a pure function of ``(seed, step, row, token)``.

    ``seed`` and ``step`` are 0-d int32 tensors, ``rows`` a 1-D int32 tensor of row numbers.
    """
    import torch

    key = _mix(seed.to(torch.int32) ^ _mix(step.to(torch.int32) * _GOLDEN + 1))
    columns = torch.arange(vocab, dtype=torch.int32, device=rows.device)
    counter = rows.to(torch.int32)[:, None] * vocab + columns[None]
    bits = _mix(_mix(counter ^ key) + key)
    return (_shift_right(bits, 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def gumbel(seed: Any, step: Any, rows: Any, vocab: int) -> Any:
    import torch

    return -torch.log(-torch.log(uniform(seed, step, rows, vocab)))


def pick(scores: Any, do_sample: bool, seed: Any, step: Any, rows: Any) -> Any:
    """Each row's next token from its processed ``scores``: the best, or a sample."""
    import torch

    if do_sample:
        scores = scores + gumbel(seed, step, rows, scores.shape[-1])
    return torch.argmax(scores, dim=-1).to(torch.int32)
