"""RecurrentGemma in ``generate``: decoding without a cache.

Its recurrent layers keep their decode state (``conv1d_state`` and ``recurrent_states``) in module
attributes, outside any cache a compiled loop can carry: a trace would store its tracers there and the
next program read them (an error on a fresh trace, wrong tokens once a cached program skipped the trace
that set them). So it decodes without a cache (:attr:`GenerationTraits.no_static_cache`).
"""

from __future__ import annotations

from typing import Any

from hfax.generation.traits import GenerationTraits

#: Why no static cache holds a RecurrentGemma's decode state.
MODULE_STATE = (
    "its recurrent layers keep their state (conv1d_state and recurrent_states) in module attributes"
)


def generation_traits(model: Any, config: Any) -> GenerationTraits:
    return GenerationTraits(no_static_cache=MODULE_STATE)
