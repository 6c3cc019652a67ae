"""TrOCR's decoder (in a ``VisionEncoderDecoderModel`` or alone) positions, counted from the cache's length with a static shape on every backend
(:mod:`hfax.patches.longtail.cache_positions`)."""

from __future__ import annotations

from hfax.patches.longtail.cache_positions import counted_positions
from hfax.patches.longtail.family import LongTailFamily

#: The position embedding: class name -> (method, its replacement).
POSITIONS = {"TrOCRLearnedPositionalEmbedding": ("forward", counted_positions)}

#: The family's hooks (entry point ``trocr``).
plugin = LongTailFamily("trocr", ("trocr",), POSITIONS)
