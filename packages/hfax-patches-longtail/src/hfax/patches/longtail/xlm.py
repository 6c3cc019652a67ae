"""XLM's and Flaubert's ``generate``: the mask token appended after the tokens so far at every step.

Their ``prepare_inputs_for_generation`` appends ``mask_token_id`` after the tokens so far at every step
and passes no cache: the model re-reads them all, and the appended token's logits choose the next one
(Flaubert has the same code but no causal class). hfax's generate does the same
(:attr:`GenerationTraits.appended`), with ``langs`` all ``lang_id`` where the config has one. A causal
model is refused: its attention then masks no padding, and hfax pads prompts.
"""

from __future__ import annotations

from typing import Any

from hfax.generation.traits import Appended, GenerationTraits


def generation_traits(model: Any, config: Any) -> GenerationTraits | None:
    token = getattr(config, "mask_token_id", None)
    if token is None:
        return None
    if getattr(config, "causal", False):
        return GenerationTraits(
            refused=f"{type(model).__name__} with causal=True masks causally but not the padding hfax adds "
            "to prompts (its attention ignores attention_mask then); run it with transformers' own generate"
        )
    return GenerationTraits(appended=Appended(int(token), getattr(config, "lang_id", None)))
