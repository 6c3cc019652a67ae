"""Position embeddings that count from the cache's length (MVP, TrOCR, RoFormer, LED; BERT's as the
decoder of an ``EncoderDecoderModel``), with a static shape on every backend: :func:`counted_positions`,
which those families' modules bind, and :func:`count_of`, how each release passes the count.

Their forward numbers a step's positions ``torch.arange(past, past + n)`` (BERT: slices ``position_ids[:,
past : past + n]`` from a table), ``past`` being the count of tokens the cache held. hfax's static cache counts them with a
tensor, one compiled decode step serving every position: torch_xla's dynamo bridge then has to read the tensor's value to size the range, which it
refuses ("Data dependent operator", "Dynamic slicing with Tensor arguments"). ``past + torch.arange(n)``
is the same range, sized by ``n`` alone.
(hfax-jax's count, ``CacheLength``, sizes the original range itself; this form serves it too.)
"""

from __future__ import annotations

from typing import Any


def count_of(rest: tuple[Any, ...], named: dict[str, Any]) -> Any:
    """The cache's count of tokens among an embedding's arguments after the ones it shares across releases
    (5.23 calls it ``past_key_values_length``, 5.24 ``cache_length``): passed by position or by name."""
    if rest:
        return rest[0]
    return next(iter(named.values()), 0)


def counted_positions(
    self: Any, input_ids: Any, *rest: Any, position_ids: Any = None, **named: Any
) -> Any:
    """The embedding's ``forward(input_ids or its shape, count, position_ids)``: the embeddings of
    positions ``count + 0 .. n-1`` (shifted by the class's ``offset``), ``[batch, n, dim]`` for ids and
    ``[n, dim]`` for a shape, as transformers returns them."""
    import torch

    if len(rest) > 1:  # positions passed by position
        rest, position_ids = rest[:1], rest[1]
    count = count_of(rest, named)
    if position_ids is not None or not isinstance(count, torch.Tensor):
        # Positions given, or a Python count: transformers' own code sizes the range statically.
        extra = () if position_ids is None else (position_ids,)
        return type(self).forward(self, input_ids, count, *extra)
    is_ids = isinstance(input_ids, torch.Tensor)
    length = input_ids.shape[1] if is_ids else input_ids[1]
    positions = count + torch.arange(length, device=self.weight.device)
    positions = positions.long() + getattr(self, "offset", 0)
    if is_ids:
        positions = positions.expand(input_ids.shape[0], -1)
    return torch.nn.Embedding.forward(self, positions)
