"""Sparse-attention indexers that choose each query's keys in a Python loop, with static shapes instead.

Qwen4-Exp's ``Qwen4ExpTextQSAIndexer`` loops over every row and query: it lists the query's visible keys
(``nonzero``: a data-dependent shape, which no compiled program has), cuts them into blocks of
``indexer_compress_ratio`` keys in order, scores each complete block by its mean key, keeps the best
``block_topk`` blocks and every key after the last complete block. :func:`qwen4_exp_blocks` computes the
same selection for all queries at once: a key's block is its rank among the query's visible keys divided
by the ratio, each block's mean key is a sum over a one-hot membership, and incomplete blocks score
``-inf``. The membership is ``[batch, queries, keys, blocks]``: built for the short prompts such a model
decodes without a cache, not for long ones.

Its cache keeps the keys' positions beside them, and the indexer reads the fed tokens' positions from the
end of those (``indexer_position_ids``): a slot cache writes each token at its slot, not at the end. So the
family tells hfax's generate to decode these models without a cache
(:attr:`hfax.generation.traits.GenerationTraits.no_static_cache`).
"""

from __future__ import annotations

import math
from typing import Any

from hfax.generation.traits import GenerationTraits


def qwen4_exp_blocks(
    self: Any,
    hidden_states: Any,
    position_embeddings: Any,
    attention_mask: Any,
    past_key_values: Any,
    **kwargs: Any,
) -> Any:
    """``Qwen4ExpTextQSAIndexer.forward``: the boolean ``[batch, 1, queries, keys]`` mask of the keys each
    query attends to, as transformers' loop selects them. ``kwargs`` are the layer's own keyword arguments
    (``output_router_logits`` and the rest of transformers' kwargs, handed on from transformers 5.25):
    none of them changes which keys are chosen."""
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import apply_rotary_pos_emb

    batch, queries, _ = hidden_states.shape
    dim, ratio = self.index_head_dim, self.compress_ratio
    cos, sin = position_embeddings  # of every key; the queries are the last
    split = [self.index_n_heads * dim, self.index_kv_heads * dim]
    query, key = torch.split(self.index_qk_proj(hidden_states), split, dim=-1)
    query = self.q_layernorm(query.reshape(batch, queries, -1, dim))
    query = apply_rotary_pos_emb(
        query, cos=cos[:, -queries:], sin=sin[:, -queries:], unsqueeze_dim=2
    )
    keys = key.reshape(batch, queries, -1, dim).squeeze(2)
    if past_key_values is not None:
        keys = past_key_values.update_indexer(keys, self.layer_idx)
    visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    visible = visible[:, 0]  # [batch, queries, keys]
    width = visible.shape[-1]
    blocks = -(-width // ratio)
    rank = visible.long().cumsum(-1) - 1
    complete = visible.long().sum(-1, keepdim=True) // ratio
    block = torch.where(visible, torch.div(rank, ratio, rounding_mode="floor"), -1)
    member = block[..., None] == torch.arange(blocks, device=block.device)
    pooled = torch.einsum("bqkn,bkd->bqnd", member.float(), keys.float()) / ratio
    pooled = self.k_layernorm(pooled.to(keys.dtype))
    # Each block is rotated to the position of its first key.
    index = torch.arange(width, device=block.device)[:, None]
    starts = torch.where(member, index, width).amin(2).clamp(max=width - 1)

    def at_starts(table: Any) -> Any:
        table = table[:, None].expand(batch, queries, width, table.shape[-1])
        return torch.gather(table, 2, starts[..., None].expand(-1, -1, -1, table.shape[-1]))

    block_keys = apply_rotary_pos_emb(
        pooled.unsqueeze(-2), cos=at_starts(cos), sin=at_starts(sin), unsqueeze_dim=-2
    ).squeeze(-2)
    scores = torch.einsum("bqhd,bqnd->bqnh", query.float(), block_keys.float())
    scores = torch.relu(scores).sum(-1) / math.sqrt(dim)
    usable = torch.arange(blocks, device=block.device) < complete
    scores = torch.where(usable, scores, float("-inf"))
    best = scores.topk(min(self.block_topk, blocks), dim=-1)
    chosen = torch.zeros_like(usable).scatter(-1, best.indices, torch.isfinite(best.values))
    in_chosen = torch.gather(chosen & usable, 2, block.clamp(min=0)) & (block >= 0)
    after_the_blocks = rank >= complete * ratio
    return (visible & (in_chosen | after_the_blocks))[:, None]


#: transformers' classes that choose keys in a Python loop: class name -> (method, its replacement).
PATCHES = {"Qwen4ExpTextQSAIndexer": ("forward", qwen4_exp_blocks)}


def generation_traits(model: Any, config: Any) -> GenerationTraits:
    """``model`` decodes without a cache (see the module's docstring)."""
    reason = "its indexer keeps its keys' positions in the cache and reads the new tokens' from their end"
    return GenerationTraits(no_static_cache=reason)
