"""RoFormer's sinusoidal positions, counted from the cache's length with a static shape on every backend
(:mod:`hfax.patches.longtail.cache_positions`)."""

from __future__ import annotations

from hfax.patches.longtail.cache_positions import counted_positions
from hfax.patches.longtail.family import LongTailFamily

#: The position embedding: class name -> (method, its replacement).
POSITIONS = {"RoFormerSinusoidalPositionalEmbedding": ("forward", counted_positions)}

#: The family's hooks (entry point ``roformer``).
plugin = LongTailFamily("roformer", ("roformer",), POSITIONS)
