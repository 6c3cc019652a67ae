"""LongCat-Flash's experts with static shapes, on every backend: every routed expert runs on every token,
weighted by the router with its identity experts (:func:`hfax.experts.weighted`), where transformers loops
in Python over the experts a batch hits (``nonzero`` of the routing, a data-dependent shape).
"""

from __future__ import annotations

from typing import Any

from hfax.experts import weighted


def longcat_experts(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """``LongcatFlashExperts.forward``: routed experts (gate and up concatenated, ``[out, in]``), then
    ``zero_expert_num`` identity experts."""
    import torch

    routed = self.num_routed_experts
    identity = hidden_states.expand(self.zero_expert_num, *hidden_states.shape)
    if routed == 0 or self.gate_up_proj is None:
        return weighted(identity, top_k_index, top_k_weights).to(hidden_states.dtype)
    gate, up = torch.einsum("th,eoh->eto", hidden_states, self.gate_up_proj[:routed]).chunk(
        2, dim=-1
    )
    out = torch.einsum("etf,ehf->eth", self.act_fn(gate) * up, self.down_proj)
    return weighted(out, top_k_index, top_k_weights, identity).to(hidden_states.dtype)


#: LongCat-Flash's experts: class name -> (method, its replacement).
PATCHES = {"LongcatFlashExperts": ("forward", longcat_experts)}
