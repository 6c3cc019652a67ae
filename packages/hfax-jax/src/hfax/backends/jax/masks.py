"""Attention masks for the slot cache, built in JAX from which slots hold real tokens.

transformers accepts a ready 4-D mask (or, for hybrid models, a dict of them by layer type) and then skips
its own mask construction, which would read Python-int lengths off the cache. The masks here are additive
(0 where a query may look, the dtype's minimum elsewhere), which every attention implementation accepts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def layer_windows(config: Any) -> dict[str, int | None]:
    """The sliding window of each attention layer type of ``config`` (``None`` = full attention)."""
    config = config.get_text_config()  # a multimodal model's decoder keeps its windows in its text config
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if not types:
        return {"full_attention": window}
    return {kind: (window if kind == "sliding_attention" else None) for kind in types}


def build(windows: dict[str, int | None], valid: jax.Array, query_slots: jax.Array, dtype: Any) -> Any:
    """The mask argument for a forward whose queries sit at ``query_slots`` (shape ``[q]``).

    ``valid`` is ``[batch, length]``: True where a slot holds a real (not padding) token. Returns one
    ``[batch, 1, q, length]`` mask, or a dict by layer type when the model mixes types.
    """
    slots = jnp.arange(valid.shape[1])
    causal = slots[None, :] <= query_slots[:, None]
    masks = {}
    for kind, window in windows.items():
        allowed = causal if window is None else causal & (slots[None, :] > query_slots[:, None] - window)
        allowed = allowed[None, None] & valid[:, None, None, :]
        masks[kind] = jnp.where(allowed, jnp.zeros((), dtype), jnp.finfo(dtype).min)
    return masks if len(masks) > 1 else next(iter(masks.values()))
