"""Attention masks over a slot KV cache, written in torch so that every backend builds the same ones.

A slot cache holds ``length`` positions per row; prompt tokens sit left-padded in the first slots and new
tokens follow. transformers accepts a ready 4-D mask (or, for hybrid models, a dict of them by layer type)
and then skips its own mask construction, which reads Python-int lengths off the cache and syncs with the
host (``padding_mask.all()``). The masks are additive (0 where a query may look, the dtype's minimum
elsewhere), which every attention implementation accepts. torch is imported when a mask is built, never
when this module is.
"""

from __future__ import annotations

from typing import Any


def layer_windows(config: Any) -> dict[str, int | None]:
    """The sliding window of each attention layer type of ``config`` (``None`` = full attention)."""
    config = config.get_text_config()  # a multimodal model's decoder keeps its windows in its text config
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if not types:
        return {"full_attention": window}
    return {kind: (window if kind == "sliding_attention" else None) for kind in types}


def build(windows: dict[str, int | None], valid: Any, query_slots: Any, dtype: Any) -> Any:
    """The ``attention_mask`` argument for a forward whose queries sit at ``query_slots`` (shape ``[q]``).

    ``valid`` is a ``[batch, length]`` bool tensor: True where a slot holds a real (not padding) token.
    Returns one ``[batch, 1, q, length]`` mask of ``dtype``, or a dict by layer type when the model mixes
    types. Runs on any torch device (XLA, torchax's JAX tensors, CPU).
    """
    import torch

    slots = torch.arange(valid.shape[1], device=valid.device)
    causal = slots[None, :] <= query_slots[:, None]
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=valid.device)
    masks = {}
    for kind, window in windows.items():
        allowed = causal if window is None else causal & (slots[None, :] > query_slots[:, None] - window)
        allowed = allowed[None, None] & valid[:, None, None, :]
        masks[kind] = torch.where(allowed, torch.zeros((), dtype=dtype, device=valid.device), blocked)
    return masks if len(masks) > 1 else next(iter(masks.values()))
