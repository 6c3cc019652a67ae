"""GPT-Neo's local attention in ``generate``: beyond its window, decoding without a cache.

Its local-attention layers mask by a fixed table of their own (``window_size`` wide), sliced as if the
cache held exactly the tokens so far (transformers marks the model ``_can_compile_fullgraph = False``). In
a static cache longer than the window their queries would see the wrong keys, so a call that needs more
positions than the window decodes without a cache (:attr:`GenerationTraits.local_attention_window`).
"""

from __future__ import annotations

from typing import Any

from hfax.generation.traits import GenerationTraits


def generation_traits(model: Any, config: Any) -> GenerationTraits | None:
    """The window of ``config``'s local-attention layers, where it has any."""
    window = getattr(config, "window_size", None)
    if window is None or "local" not in (getattr(config, "attention_layers", None) or ()):
        return None
    return GenerationTraits(local_attention_window=window)
