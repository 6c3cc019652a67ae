"""X-MOD's language adapters with static shapes, on every backend: a mixture routed by each row's language
id, whose rows transformers gathers per language by a boolean mask (a data-dependent shape).
"""

from __future__ import annotations

from typing import Any


def xmod_adapters(self: Any, lang_ids: Any, hidden_states: Any) -> Any:
    """``XmodOutput.lang_adapter``: each row's language adapter (``lang_ids``: one id per row, or per
    token). Every adapter runs on every row and each keeps its own language's output: the adapters are
    small bottleneck MLPs, so this costs ``languages`` times one of them."""
    import torch

    residual = hidden_states
    if self.adapter_layer_norm is not None:
        hidden_states = self.adapter_layer_norm(hidden_states)
    elif self.adapter_reuse_layer_norm:
        hidden_states = self.LayerNorm(hidden_states)
    if self.ln_before_adapter:
        residual = hidden_states
    chosen = lang_ids.reshape(*lang_ids.shape, *[1] * (hidden_states.dim() - lang_ids.dim()))
    adapted = torch.zeros_like(hidden_states)
    for index, adapter in enumerate(self.adapter_modules.values()):
        adapted = torch.where(chosen == index, adapter(hidden_states), adapted)
    return self.dropout(adapted) + residual


#: X-MOD's output layer: class name -> (method, its replacement).
PATCHES = {"XmodOutput": ("lang_adapter", xmod_adapters)}
