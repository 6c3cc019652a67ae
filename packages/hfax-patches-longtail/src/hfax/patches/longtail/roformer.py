"""RoFormer's sinusoidal positions, counted from the cache's length with a static shape on every backend
(:mod:`hfax.patches.longtail.cache_positions`)."""

from __future__ import annotations

from hfax.patches.longtail.cache_positions import counted_positions

#: The position embedding: class name -> (method, its replacement).
PATCHES = {"RoFormerSinusoidalPositionalEmbedding": ("forward", counted_positions)}
