"""XLM's and Flaubert's forward and ``generate``: their ``lengths`` checked from Python ints, and the mask
token appended after the tokens so far at every step.

Their base ``forward`` checks its ``lengths`` against the width with ``lengths.max().item()``, which a
compiled program cannot answer (a traced count has no value; torch_xla's one-graph decode step cannot
trace ``.item()``). Given a padding mask, those checks are all the lengths serve (the mask masks). So a call
with a mask and no lengths gets :class:`RowWidths`, every row's width, which answers the checks from Python
ints. Without a mask their lengths count the tokens that are not padding, which only the ids know: that
call is left as it was.

Their ``prepare_inputs_for_generation`` appends ``mask_token_id`` after the tokens so far at every step
and passes no cache: the model re-reads them all, and the appended token's logits choose the next one
(Flaubert has the same code but no causal class). hfax's generate does the same
(:attr:`GenerationTraits.appended`), with ``langs`` all ``lang_id`` where the config has one. A causal
model is refused: its attention then masks no padding, and hfax pads prompts.
"""

from __future__ import annotations

from typing import Any

from hfax.generation.traits import Appended, GenerationTraits


class RowWidths:
    """``lengths`` of ``rows`` rows of ``width`` tokens each, as much of a tensor as the checks read:
    ``size(0)``, ``max().item()`` and ``device``."""

    def __init__(self, rows: int, width: int, device: Any) -> None:
        self.rows, self.width, self.device = rows, width, device

    def size(self, dim: int | None = None) -> Any:
        import torch

        return torch.Size([self.rows]) if dim is None else torch.Size([self.rows])[dim]

    def max(self) -> _Count:
        return _Count(self.width)


class _Count:
    def __init__(self, value: int) -> None:
        self.value = value

    def item(self) -> int:
        return self.value


def lengths_of_the_rows(self: Any, *args: Any, **kwargs: Any) -> Any:
    """XLM's and Flaubert's base ``forward``, given every row's width as its lengths where a padding mask
    masks and no lengths are given (see the module docstring); otherwise as it was."""
    ids = args[0] if args else kwargs.get("input_ids")
    inputs = ids if ids is not None else kwargs.get("inputs_embeds")
    if (
        kwargs.get("lengths") is None
        and kwargs.get("attention_mask") is not None
        and inputs is not None
    ):
        kwargs["lengths"] = RowWidths(inputs.shape[0], inputs.shape[1], inputs.device)
    return type(self).forward(self, *args, **kwargs)


#: class name -> (method, its replacement)
PATCHES = {
    "XLMModel": ("forward", lengths_of_the_rows),
    "FlaubertModel": ("forward", lengths_of_the_rows),
}


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
