"""A cache that reports a fixed count of cached tokens, its writes going to the cache it stands for.

Some forwards read the count of cached tokens only to choose a slice or a branch whose outcome the family
knows without it: MPT's ALiBi rows (count 0 chooses its bias's one row), ProphetNet's and GIT's
"decoding?" branches (count 1). hfax's static cache counts with a tensor (one compiled decode step serves
every position), which a slice cannot take and dynamo (torch_xla's decode step) cannot branch on, so such a
forward is handed :func:`fixed_count`'s view of the cache. The view shares the cache's layers (an
encoder-decoder cache's caches and ``is_updated`` flags) and sends ``update`` to the cache itself, so
everything the forward writes lands in the cache; only ``get_seq_length`` differs. It is a ``Cache`` (an
``EncoderDecoderCache`` for one), so transformers' type checks take it as the cache. Built by plain
``__init__`` assignments, which dynamo traces.
"""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import Cache, EncoderDecoderCache


class _FixedCount(Cache):
    """``cache`` with ``get_seq_length`` ``count``."""

    def __init__(
        self, cache: Cache, count: int
    ) -> None:  # Cache's own __init__ would build new layers
        self.cache = cache
        self.count = count
        self.layers = cache.layers
        self.layer_class_to_replicate = cache.layer_class_to_replicate
        self.offloading = cache.offloading

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return self.cache.update(*args, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.count


class _FixedCountCross(EncoderDecoderCache):
    """An encoder-decoder ``cache`` with ``get_seq_length`` ``count``: its own self- and cross-attention
    caches and ``is_updated`` flags."""

    def __init__(self, cache: EncoderDecoderCache, count: int) -> None:  # as above
        self.self_attention_cache = cache.self_attention_cache
        self.cross_attention_cache = cache.cross_attention_cache
        self.is_updated = cache.is_updated
        self.count = count

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.count


def fixed_count(cache: Cache, count: int) -> Cache:
    """``cache`` as a forward reads it with ``count`` tokens cached (see the module's docstring)."""
    if isinstance(cache, EncoderDecoderCache):
        return _FixedCountCross(cache, count)
    return _FixedCount(cache, count)
