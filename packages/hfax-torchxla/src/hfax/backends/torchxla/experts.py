"""Mixture-of-experts layers computed with static shapes: every expert over every token, weighted by the router.

transformers' expert layers (the classes under ``@use_experts_implementation``) default to ``"grouped_mm"``:
tokens sorted by expert, counted with ``torch.histc`` and multiplied by ``torch._grouped_mm`` with those
counts as offsets. Under torch_xla 2.9 the count falls back to PyTorch's CPU ``histc``, which has no integer
kernel, and the group sizes are data: a lazy graph would change with every routing. ``"eager"`` loops in
Python over the experts a batch hits (a graph per routing too); ``"batched_mm"`` gathers one copy of an
expert's weights per token and choice (prompt length x top-k weight copies in prefill).

:func:`every_expert` instead runs each expert on every token, as one batched product per projection, and
sums the results weighted by the router's choices (zero for an expert a token did not choose): one graph
whatever the routing. It costs ``experts / top_k`` times the products of the chosen experts; a decode step
reads every expert's weights anyway once its batch hits them all.

:func:`patch` switches a model's expert layers from ``"grouped_mm"`` to it, through transformers' own
extension point (``ExpertsInterface``), recorded by ``hfax.Patcher``. An implementation the user chose
other than ``"grouped_mm"`` is kept.
"""

from __future__ import annotations

from typing import Any

import torch

#: The name under which :func:`every_expert` is registered in transformers' ``ALL_EXPERTS_FUNCTIONS``.
NAME = "hfax_every_expert"


def every_expert(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The experts' output ``[tokens, hidden]`` for ``hidden_states`` ``[tokens, hidden]`` routed to
    ``top_k_index`` with ``top_k_weights`` (both ``[tokens, top_k]``), with the layer's own gate, biases
    and post-expert norm (the attributes ``@use_experts_implementation`` sets)."""
    if top_k_weights.shape != top_k_index.shape:
        raise NotImplementedError(
            f"{type(self).__name__} passes routing weights of shape {tuple(top_k_weights.shape)} for expert "
            f"indices of shape {tuple(top_k_index.shape)}; hfax's static expert layer takes one weight per "
            "chosen expert. Load the model with experts_implementation='batched_mm'."
        )
    # [tokens, experts]: a token's weight for each expert, zero where it did not choose it.
    routing = torch.zeros(
        top_k_index.shape[0],
        self.num_experts,
        dtype=top_k_weights.dtype,
        device=top_k_weights.device,
    ).scatter_add(1, top_k_index.long(), top_k_weights)
    up = self.gate_up_proj if self.has_gate else self.up_proj
    # [experts, tokens, out]; weights are [experts, out, in], or [experts, in, out] when transposed.
    projected = _per_expert(hidden_states.to(up.dtype), up, self.is_transposed)
    if self.has_bias:
        projected = (
            projected + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[:, None]
        )
    projected = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
    out = _per_expert(projected, self.down_proj, self.is_transposed)
    if self.has_bias:
        out = out + self.down_proj_bias[:, None]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    combined = torch.einsum("eth,te->th", out, routing.to(out.dtype))
    return combined.to(hidden_states.dtype)


def _per_expert(inputs: torch.Tensor, weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Every expert's projection of ``inputs`` (``[tokens, in]``, or ``[experts, tokens, in]`` per expert)."""
    per_expert = "e" if inputs.dim() == 3 else ""
    layout = "eio" if transposed else "eoi"
    return torch.einsum(f"{per_expert}ti,{layout}->eto", inputs, weight)


def patch(model: torch.nn.Module, patcher: Any) -> None:
    """Compute ``model``'s expert layers by :func:`every_expert` where they would use ``"grouped_mm"``."""
    configs = {
        id(module.config): module.config
        for module in model.modules()
        # What `@use_experts_implementation` gives a layer; its forward dispatches on the config's name.
        if hasattr(module, "_is_expert_parallel") and hasattr(module, "has_gate")
    }
    chosen = [
        config
        for config in configs.values()
        if getattr(config, "_experts_implementation", None) == "grouped_mm"
    ]
    if not chosen:
        return
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, every_expert)
    for config in chosen:
        # Beneath the property, whose setter would also switch every sub-config.
        patcher.setattr(config, "_experts_implementation_internal", NAME)
