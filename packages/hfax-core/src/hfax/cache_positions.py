"""Position embeddings that count from the cache's length (MVP, TrOCR, RoFormer, LED; BERT's as the
decoder of an ``EncoderDecoderModel``), with a static shape on every backend.

Their forward numbers a step's positions ``torch.arange(past, past + n)`` (BERT: slices ``position_ids[:,
past : past + n]`` from a table), ``past`` being the count of tokens the cache held. hfax's static cache counts them with a tensor, one compiled decode step serving
every position: torch_xla's dynamo bridge then has to read the tensor's value to size the range, which it
refuses ("Data dependent operator", "Dynamic slicing with Tensor arguments"). ``past + torch.arange(n)``
is the same range, sized by ``n`` alone.
(hfax-jax's count, ``CacheLength``, sizes the original range itself; this form serves it too.)

FSMT's sinusoidal table grows itself when ``past + n`` positions outrun it, a branch on the count. Its
table holds ``max_position_embeddings`` positions past the padding index, and hfax's generate refuses a run
that needs more before compiling (``hfax.generation.settings``), so with a tensor count the table is used
as it is.

MPT's attention reads the count only to choose its ALiBi bias's query rows (``max(0, rows - (n + past))``,
a slice at a tensor): the bias it builds has one row, which every count chooses, so the attention is
handed the cache with a count of 0 for that choice.
"""

from __future__ import annotations

from typing import Any

from hfax.signatures import cache_keyword


def _count(rest: tuple[Any, ...], named: dict[str, Any]) -> Any:
    """The cache's count of tokens among an embedding's arguments after the ones it shares across releases
    (5.23 calls it ``past_key_values_length``, 5.24 ``cache_length``): passed by position or by name."""
    if rest:
        return rest[0]
    return next(iter(named.values()), 0)


def counted_positions(self: Any, input_ids: Any, *rest: Any, position_ids: Any = None,
                      **named: Any) -> Any:  # fmt: skip
    """The embedding's ``forward(input_ids or its shape, count, position_ids)``: the embeddings of
    positions ``count + 0 .. n-1`` (shifted by the class's ``offset``), ``[batch, n, dim]`` for ids and
    ``[n, dim]`` for a shape, as transformers returns them."""
    import torch

    if len(rest) > 1:  # positions passed by position
        rest, position_ids = rest[:1], rest[1]
    count = _count(rest, named)
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


def bert_embeddings(self: Any, input_ids: Any = None, token_type_ids: Any = None,
                    position_ids: Any = None, inputs_embeds: Any = None, *rest: Any,
                    **named: Any) -> Any:  # fmt: skip
    """``BertEmbeddings.forward``, given the positions ``count + 0 .. n-1`` it would slice from its table
    when the cache's count is a tensor."""
    import torch

    count = _count(rest, named)
    if position_ids is None and isinstance(count, torch.Tensor):
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        table = self.position_ids
        positions = count + torch.arange(length, device=table.device)
        position_ids = positions.to(table.dtype)[None, :]
    return type(self).forward(self, input_ids, token_type_ids, position_ids, inputs_embeds, count)


def fsmt_positions(self: Any, input: Any, **named: Any) -> Any:
    """FSMT's ``SinusoidalPositionalEmbedding.forward``: each real token's position among the row's real
    tokens, after the cache's count of tokens (its one keyword argument); with a tensor count, without
    growing the table."""
    import torch

    count = _count((), named)
    if not isinstance(count, torch.Tensor):
        return type(self).forward(self, input, **named)
    positions = self.make_positions(input, self.padding_idx) + count
    return torch.nn.Embedding.forward(self, positions)


class _BiasRows:
    """The cache as :func:`mpt_attention` hands it to ``MptAttention.forward``: ``update`` is the cache's;
    ``get_seq_length`` is 0, which chooses the one query row of MPT's bias as the true count does."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return self.cache.update(*args, **kwargs)

    def get_seq_length(self, *args: Any) -> int:
        return 0


def mpt_attention(self: Any, hidden_states: Any, position_bias: Any, **kwargs: Any) -> Any:
    """``MptAttention.forward``, its bias's query rows chosen without reading the cache's count (a tensor
    under hfax's static cache) where the bias has a single row, as ``MptModel`` builds it. ``MptBlock``
    passes the cache by keyword, under the release's name for it."""
    name = cache_keyword(kwargs)
    if name is not None and position_bias is not None and position_bias.size(1) == 1:
        kwargs[name] = _BiasRows(kwargs[name])
    return type(self).forward(self, hidden_states, position_bias, **kwargs)


#: The position embeddings that count from the cache, and MPT's attention: class name -> (method, its
#: replacement).
COUNTED = {
    "MvpLearnedPositionalEmbedding": ("forward", counted_positions),
    "TrOCRLearnedPositionalEmbedding": ("forward", counted_positions),
    "RoFormerSinusoidalPositionalEmbedding": ("forward", counted_positions),
    "LEDLearnedPositionalEmbedding": ("forward", counted_positions),
    "BertEmbeddings": ("forward", bert_embeddings),
    # FSMT's, the only class of that name in transformers
    "SinusoidalPositionalEmbedding": ("forward", fsmt_positions),
    "MptAttention": ("forward", mpt_attention),
}
