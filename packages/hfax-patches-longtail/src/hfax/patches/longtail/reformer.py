"""Reformer's axial position embeddings, looked up with a static shape on every backend.

Reformer's ``AxialPositionEmbeddings`` keeps one weight per axis of a ``rows x columns`` grid of positions.
Outside training it cuts the grid to the rows the largest position id needs (``position_ids.max().item()``)
before looking the ids up: the cut's size is a value, which ``jax.jit`` cannot trace. Position ``p`` is
the same grid cell whether the grid is cut or not (``p // columns``, ``p % columns``), so looking the ids up
in the whole grid gives the same embeddings, with a shape set by the config alone.
"""

from __future__ import annotations

import math
from typing import Any


def axial_positions(self: Any, position_ids: Any) -> Any:
    """``AxialPositionEmbeddings.forward``: ``[batch, length, dim]``, the concatenated axes' embeddings of
    each position. Training (where transformers uses the whole grid and may drop out parts of it) and a
    sequence longer than the grid (transformers' ValueError) run transformers' own code."""
    import torch

    cells = math.prod(self.axial_pos_shape)
    if self.training or position_ids.shape[1] > cells:
        return type(self).forward(self, position_ids)
    # Each axis's weight spread over the whole grid, then every cell's embedding in the grid's order.
    grid = [weight.expand(*self.axial_pos_shape, weight.shape[-1]) for weight in self.weights]
    table = torch.cat(grid, dim=-1).reshape(cells, -1)
    return torch.nn.functional.embedding(position_ids, table)


#: Reformer's axial position embeddings: class name -> (method, its replacement).
PATCHES = {"AxialPositionEmbeddings": ("forward", axial_positions)}
