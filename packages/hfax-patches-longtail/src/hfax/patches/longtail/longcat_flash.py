"""LongCat-Flash's experts with static shapes, on every backend: every routed expert runs on every token,
weighted by the router with its identity experts (:func:`hfax.experts.weighted`), where transformers loops
in Python over the experts a batch hits (``nonzero`` of the routing, a data-dependent shape).

That loop is transformers 5.23's and 5.24's layer, whose routed and identity experts share one table
(``num_routed_experts``, ``zero_expert_num``). From 5.25 on the layer is under
``@use_experts_implementation``, with the identity experts handled by ``LongcatFlashMoE`` around it, and
core's generic static experts path (:mod:`hfax.experts`) serves it: :func:`patch_model` leaves it alone.
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


def patch_model(model: Any, patcher: Any) -> None:
    """Every ``LongcatFlashExperts`` of ``model`` that loops over its routed and identity experts (the
    layout with ``num_routed_experts``) runs :func:`longcat_experts` instead."""
    for module in model.modules():
        if type(module).__name__ == "LongcatFlashExperts" and hasattr(module, "num_routed_experts"):
            patcher.bind(module, "forward", longcat_experts)
