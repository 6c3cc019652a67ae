"""Mixture-of-experts layers with static shapes: every expert runs on every token, weighted by the router.

A compiled program needs shapes that do not depend on the data. transformers' expert layers route tokens
in ways that do:

* the classes under ``@use_experts_implementation`` default to ``"grouped_mm"``: tokens sorted by expert,
  counted with ``torch.histc``, multiplied by ``torch._grouped_mm`` with those counts as offsets. The JAX
  backend lowers that to ``jax.lax.ragged_dot``; torch_xla 2.9 sends the integer ``histc`` to PyTorch's CPU
  kernel, which has none, and its group sizes would change the lazy graph with every routing. For it,
  :func:`every_expert` is registered in transformers' ``ExpertsInterface`` (the backend switches to it).
  A class that defaults to ``"eager"`` (a loop over the experts hit) gets the backend's choice too
  (:func:`compile_experts`).
* a few models loop in Python over the experts a batch hits, or split their tokens by counts read as
  Python numbers: their family plugins replace those methods with static ones, built on :func:`weighted`.

Every expert on every token costs ``experts / top_k`` times the products of the chosen experts; a decode
step of a batch reads every expert's weights anyway once its tokens hit them all. The sums differ from
transformers' only in the order of floating-point additions.

torch is imported when a layer runs or a model is patched, never when this module is.
"""

from __future__ import annotations

from typing import Any

#: The name under which :func:`every_expert` is registered in transformers' ``ALL_EXPERTS_FUNCTIONS``.
NAME = "hfax_every_expert"


def every_expert(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The output ``[tokens, hidden]`` of a transformers expert layer (``@use_experts_implementation``)
    for ``hidden_states`` ``[tokens, hidden]`` routed to ``top_k_index`` with ``top_k_weights`` (both
    ``[tokens, top_k]``), with the layer's own gate, biases and post-expert norm."""
    import torch

    if top_k_weights.shape != top_k_index.shape:
        raise NotImplementedError(
            f"{type(self).__name__} passes routing weights of shape {tuple(top_k_weights.shape)} for expert "
            f"indices of shape {tuple(top_k_index.shape)}; hfax's static expert layer takes one weight per "
            "chosen expert. Load the model with experts_implementation='batched_mm'."
        )
    up = self.gate_up_proj if self.has_gate else self.up_proj
    # Weights are [experts, out, in], or [experts, in, out] when transposed.
    layout = "eio" if self.is_transposed else "eoi"
    projected = torch.einsum(f"ti,{layout}->eto", hidden_states.to(up.dtype), up)
    if self.has_bias:
        projected = (
            projected + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[:, None]
        )
    projected = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
    out = torch.einsum(f"eti,{layout}->eto", projected, self.down_proj)
    if self.has_bias:
        out = out + self.down_proj_bias[:, None]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return weighted(out, top_k_index, top_k_weights).to(hidden_states.dtype)


def weighted(out: Any, top_k_index: Any, top_k_weights: Any, extra: Any = None) -> Any:
    """``[tokens, hidden]``: every expert's output ``out`` (``[experts, tokens, hidden]``) summed with the
    router's weight for it (zero where a token did not choose it). ``extra`` (``[more, tokens, hidden]``)
    are the outputs of experts numbered after those of ``out`` (identity experts that return their input)."""
    import torch

    if extra is not None:
        out = torch.cat([out, extra.to(out.dtype)])
    routing = torch.zeros(
        top_k_index.shape[0], out.shape[0], dtype=out.dtype, device=out.device
    ).scatter_add(1, top_k_index.long(), top_k_weights.to(out.dtype))
    return torch.einsum("eth,te->th", out, routing)


def compile_experts(model: Any, patcher: Any, implementation: str) -> None:
    """Compute ``model``'s transformers expert layers by ``implementation`` (``"grouped_mm"``, or
    :data:`NAME` for :func:`every_expert`) where they run what transformers picks when nobody asks, through
    transformers' own extension point. That is ``"grouped_mm"``, or ``"eager"`` where the model class
    defaults to it (a class that avoids grouped_mm's order of additions): eager loops over the
    experts a batch hits by ``nonzero``, which no compiled program can size. The products per token are the
    same. An implementation the user chose is kept (a user's ``"eager"`` on a class that defaults to it
    looks the same, and is switched)."""
    configs = {
        id(module.config): module.config
        for module in model.modules()
        # What `@use_experts_implementation` gives a layer; its forward dispatches on the config's name.
        if hasattr(module, "_is_expert_parallel") and hasattr(module, "has_gate")
    }
    defaults = {"grouped_mm"}
    if configs and model.get_correct_experts_implementation(None) == "eager":
        defaults.add("eager")
    chosen = [
        config
        for config in configs.values()
        if getattr(config, "_experts_implementation", None) in defaults - {implementation}
    ]
    if not chosen:
        return
    if implementation == NAME:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        if NAME not in ALL_EXPERTS_FUNCTIONS:
            ALL_EXPERTS_FUNCTIONS.register(NAME, every_expert)
    for config in chosen:
        # Beneath the property, whose setter would also switch every sub-config.
        patcher.setattr(config, "_experts_implementation_internal", implementation)
