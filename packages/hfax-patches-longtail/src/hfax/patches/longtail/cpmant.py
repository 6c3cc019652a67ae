"""CPM-Ant's forward at the call's own shape.

CPM-Ant builds its attention mask from its ids alone: it counts a row's non-zero ids and takes that many
*last* positions as the row's tokens (it expects left padding with id 0; its forward ignores an
``attention_mask``). Ids padded on the right would shift its real tokens out of that window, so its
forward runs every call unpadded (:attr:`GenerationTraits.no_forward_padding`). Test:
``test_a_family_that_reads_padding_runs_its_forward_at_the_calls_shape`` (packages/hfax-jax/tests/test_forward.py).
"""

from __future__ import annotations

from typing import Any

from hfax.generation.traits import GenerationTraits

#: Why CPM-Ant's forward is not padded into a bucket.
READS_PADDING = (
    "it takes a row's last non-zero ids as its tokens, so padding on the right moves them"
)


def generation_traits(model: Any, config: Any) -> GenerationTraits:
    return GenerationTraits(no_forward_padding=READS_PADDING)
