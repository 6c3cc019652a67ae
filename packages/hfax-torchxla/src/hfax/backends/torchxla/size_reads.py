"""transformers models that read a size from an input in Python, given it as a Python value on torch_xla.

XLM's and Flaubert's base ``forward`` check their ``lengths`` against the width with
``lengths.max().item()``. Given a padding mask, those checks are all the lengths serve (the mask masks). In
torch_xla's decode step, one dynamo graph, ``.item()`` on a tensor cannot be traced. So a call with a mask and
no lengths gets :class:`RowWidths`, every row's width, which answers the checks from Python ints.
"""

from __future__ import annotations

from typing import Any

import torch


class RowWidths:
    """``lengths`` of ``rows`` rows of ``width`` tokens each, as much of a tensor as the checks read:
    ``size(0)``, ``max().item()`` and ``device``."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.rows, self.width, self.device = rows, width, device

    def size(self, dim: int | None = None) -> Any:
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


#: transformers' classes whose forward reads a size from an input with ``.item()``: class name -> (method,
#: its replacement).
SIZE_READS = {
    "XLMModel": ("forward", lengths_of_the_rows),
    "FlaubertModel": ("forward", lengths_of_the_rows),
}
