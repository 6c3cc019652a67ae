"""DBRX's experts with static shapes, on every backend: every expert runs on every token, weighted by the
router (:func:`hfax.experts.weighted`), where transformers loops in Python over the experts a batch hits
(``nonzero`` of the routing, a data-dependent shape). The sums differ from transformers' only in the order
of floating-point additions.
"""

from __future__ import annotations

from typing import Any

from hfax.experts import weighted


def dbrx_experts(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """``DbrxExperts.forward``: its experts' weights are ``[experts * ffn, hidden]`` matrices; the gate
    and up projections multiply by their transpose, the down projection by the matrix itself."""
    import torch

    batch = hidden_states.shape[0]
    tokens = hidden_states.reshape(-1, self.hidden_size)
    shape = (self.num_experts, self.ffn_hidden_size, self.hidden_size)
    mlp = self.mlp
    gate = torch.einsum("th,efh->etf", tokens, mlp.w1.view(shape))
    up = torch.einsum("th,efh->etf", tokens, mlp.v1.view(shape))
    out = torch.einsum("etf,efh->eth", mlp.activation_fn(gate) * up, mlp.w2.view(shape))
    return weighted(out, top_k_index, top_k_weights).view(batch, -1, self.hidden_size)


#: DBRX's experts: class name -> (method, its replacement).
PATCHES = {"DbrxExperts": ("forward", dbrx_experts)}
