"""Kolibri 1.1's key selection without its Python loop over query groups, in static shapes.

``Kolibri1_1Indexer`` chooses the keys of each query of its sparse layers: a pool of blocks of
``index_compression`` keys whose mean key scores highest (``select_pool``), then the ``index_topk`` best
keys of that pool plus the first sink and last local keys (``select_tokens``). Blocks and positions count
from the query's first visible key, so transformers groups the queries by that key (``starts.unique()``,
``nonzero``: a loop whose length and slices depend on the mask's values, which no compiled program has)
and scores each group against its own slice of keys.

Here every query is scored against every key at once and reads what its group would: a block starting at
the query's first visible key ``s`` lies on the grid of blocks of phase ``s % index_compression``, so the
mean keys are computed for each phase's grid (``index_compression`` grids of ``keys / compression``
blocks: as many mean keys as keys) and each query gathers its own phase's scores; its positions are the
keys' minus ``s``. The selection is transformers' to the tie (``Kolibri1_1Indexer.top_k_mask``, its
rounding ``nvfp4_fake_quantize`` and its order of summation over heads are transformers' own), and each
query costs ``[keys]`` scores as in transformers.
"""

from __future__ import annotations

from typing import Any


def _spans(visible: Any) -> tuple[Any, Any]:
    """Each query's first visible key and its span of keys up to the last visible one (``0`` for a query
    that sees none): ``[batch, queries]`` each, as ``Kolibri1_1Indexer.query_groups`` counts them."""
    starts = visible.int().argmax(-1)
    ends = visible.shape[-1] - visible.flip(-1).int().argmax(-1)
    return starts, (ends - starts) * visible.any(-1)


def _score(indexer: Any, queries: Any, keys: Any) -> Any:
    """``Kolibri1_1Indexer.score`` for every batch row at once: ``[batch, heads, queries, dim]`` queries
    against ``[batch, keys, dim]`` keys, the heads summed in transformers' order."""
    scores = (queries[:, 0] @ keys.transpose(-1, -2)).relu()
    for head in range(1, queries.shape[1]):
        scores = scores + (queries[:, head] @ keys.transpose(-1, -2)).relu()
    return scores * indexer.head_weight


def kolibri1_1_pool(self: Any, queries: Any, keys: Any, visible: Any) -> Any:
    """``Kolibri1_1Indexer.select_pool``: the ``[batch, queries, keys]`` mask of each query's candidate
    keys, the whole of its visible keys where they fit the pool, else its best blocks."""
    import torch
    from transformers.models.kolibri1_1.modeling_kolibri1_1 import nvfp4_fake_quantize

    width = visible.shape[-1]
    ratio = self.compression
    starts, lengths = _spans(visible)
    grid = -(-width // ratio)  # blocks per phase; the incomplete ones at the end are masked below
    # [batch, keys]: keys that no query sees count as zeros in their block's mean
    unseen = ~visible.any(1)
    document = keys[:, 0].masked_fill(unseen[..., None], 0.0).float()
    padded = torch.nn.functional.pad(document, (0, 0, 0, (grid + 1) * ratio - width))
    # Phase p's block m covers keys p + m * ratio ... p + (m + 1) * ratio - 1.
    phases = torch.stack(
        [padded[:, p : p + grid * ratio].unflatten(1, (grid, ratio)) for p in range(ratio)], 1
    )  # [batch, phase, block, ratio, dim]
    summaries = nvfp4_fake_quantize(phases.sum(3) / ratio)  # [batch, phase, block, dim]
    routing = nvfp4_fake_quantize(queries[:, : self.num_heads]).float()
    scores = _score(self, routing, summaries.flatten(1, 2))  # [batch, queries, phase * block]
    phase = (starts % ratio)[..., None]
    block = torch.arange(grid, device=scores.device)
    scores = torch.gather(scores, -1, phase * grid + block)  # [batch, queries, block]
    # A query's block j is its phase's block starts // ratio + j; transformers scores the blocks whole
    # within the keys (j < (width - start) // ratio) and gives the one after them a zero score.
    relative = block - (starts // ratio)[..., None]
    whole = relative < ((width - starts) // ratio)[..., None]
    scores = torch.where(whole, scores, 0.0)
    scores = torch.where(relative < (lengths // ratio)[..., None], scores, 0.0)
    unseen_block = (relative < 0) | (relative >= ((lengths + ratio - 1) // ratio)[..., None])
    scores = scores.masked_fill(unseen_block, float("-inf"))
    chosen = self.top_k_mask(scores, self.pool_size // ratio)
    # Each key reads its block on the query's grid (keys before the query's first visible one are unseen).
    key = torch.arange(width, device=scores.device)
    of_key = ((key - phase).clamp(min=0) // ratio).clamp(max=grid - 1)
    pooled = torch.gather(chosen, -1, of_key) & visible
    long_rows = (lengths > self.pool_size)[..., None]
    return torch.where(long_rows, pooled, visible)


def kolibri1_1_tokens(self: Any, queries: Any, keys: Any, visible: Any, pool: Any) -> Any:
    """``Kolibri1_1Indexer.select_tokens``: the ``[batch, queries, keys]`` mask of the keys each query
    attends to, its ``index_topk`` best candidates of ``pool`` with its sink and local keys, or all its
    visible keys where they fit the budget."""
    import torch
    from transformers.models.kolibri1_1.modeling_kolibri1_1 import nvfp4_fake_quantize

    width = visible.shape[-1]
    starts, lengths = _spans(visible)
    budget = self.topk + self.num_local_tokens + self.num_sink_tokens
    routing_keys = nvfp4_fake_quantize(keys[:, 0]).float()
    routing = nvfp4_fake_quantize(queries[:, : self.num_heads]).float()
    scores = _score(self, routing, routing_keys)  # [batch, queries, keys]
    positions = torch.arange(width, device=scores.device) - starts[..., None]
    lengths = lengths[..., None]
    sinks = (positions >= 0) & (positions < self.num_sink_tokens)
    local = (positions >= lengths - self.num_local_tokens) & (positions < lengths)
    candidates = pool & (positions >= 0) & ~sinks & (positions < lengths - self.num_local_tokens)
    chosen = self.top_k_mask(scores.masked_fill(~candidates, float("-inf")), self.topk)
    selected = (chosen | sinks | local) & visible
    return torch.where(lengths > budget, selected, visible)


def patch_model(model: Any, patcher: Any) -> None:
    """Every ``Kolibri1_1Indexer`` of ``model`` chooses its pool and its keys without the loop."""
    for module in model.modules():
        if type(module).__name__ == "Kolibri1_1Indexer":
            patcher.bind(module, "select_pool", kolibri1_1_pool)
            patcher.bind(module, "select_tokens", kolibri1_1_tokens)
