"""BERT's embeddings as the decoder of an ``EncoderDecoderModel``, their positions sized statically on every
backend.

``BertEmbeddings`` slices a decode step's positions from its table, ``position_ids[:, past : past + n]``,
``past`` being the count of tokens the cache held: hfax's static cache counts them with a tensor, which
torch_xla's dynamo bridge refuses to slice at. ``past + torch.arange(n)`` are the same positions, sized by
``n`` alone (:mod:`hfax.patches.longtail.cache_positions`).
"""

from __future__ import annotations

from typing import Any

from hfax.patches.longtail.cache_positions import count_of


def bert_embeddings(
    self: Any,
    input_ids: Any = None,
    token_type_ids: Any = None,
    position_ids: Any = None,
    inputs_embeds: Any = None,
    *rest: Any,
    **named: Any,
) -> Any:
    """``BertEmbeddings.forward``, given the positions ``count + 0 .. n-1`` it would slice from its table
    when the cache's count is a tensor."""
    import torch

    count = count_of(rest, named)
    if position_ids is None and isinstance(count, torch.Tensor):
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        table = self.position_ids
        positions = count + torch.arange(length, device=table.device)
        position_ids = positions.to(table.dtype)[None, :]
    return type(self).forward(self, input_ids, token_type_ids, position_ids, inputs_embeds, count)


#: BERT's embeddings: class name -> (method, its replacement).
PATCHES = {"BertEmbeddings": ("forward", bert_embeddings)}
