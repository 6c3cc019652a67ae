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
* a few models loop in Python over the experts a batch hits (``nonzero`` of the routing, then the tokens
  of each): DBRX, LongCat-Flash, Switch Transformers; JetMoE (its experts and its mixture of attention heads) splits the tokens
  sorted by expert by a Python list of counts; X-MOD's language adapters, a mixture routed by each row's
  language id, gather each language's rows by a boolean mask. hfax-core's ``hfax_patch_model`` hook
  replaces those methods on the instance (:data:`LOOPS`).

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
    are the outputs of experts numbered after those of ``out`` (LongCat's identity experts)."""
    import torch

    if extra is not None:
        out = torch.cat([out, extra.to(out.dtype)])
    routing = torch.zeros(
        top_k_index.shape[0], out.shape[0], dtype=out.dtype, device=out.device
    ).scatter_add(1, top_k_index.long(), top_k_weights.to(out.dtype))
    return torch.einsum("eth,te->th", out, routing)


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


def jetmoe_gating(self: Any, hidden_states: Any) -> Any:
    """``JetMoeTopKGating.forward``, its tokens per expert kept as a tensor: transformers turns them into
    a Python list (``tolist()``) to split the sorted tokens by expert, a count no traced program has."""
    import torch

    logits = self.layer(hidden_states).float()
    top_logits, top_indices = logits.topk(self.top_k, dim=1)
    top_gates = torch.softmax(top_logits, dim=1).type_as(hidden_states)
    chosen = torch.zeros(
        top_gates.shape[0], self.num_experts, dtype=torch.long, device=logits.device
    )
    expert_size = chosen.scatter(1, top_indices, 1).sum(0)
    _, order = top_indices.flatten().sort(0)
    # JetMoE's `map` passes these to `index_add`. torch_xla 2.9 aborts the process there (an XLA shape
    # check) when the index is `sort`'s own output in the same graph; an operation between them avoids it.
    index_sorted_experts = order + 0
    batch_index = index_sorted_experts.div(self.top_k, rounding_mode="trunc")
    batch_gates = top_gates.flatten()[index_sorted_experts]
    return index_sorted_experts, batch_index, batch_gates, expert_size, logits


def jetmoe_parallel_experts(self: Any, inputs: Any, expert_size: Any) -> Any:
    """``JetMoeParallelExperts.forward``: ``inputs`` sorted by expert, ``expert_size`` (a tensor, from
    :func:`jetmoe_gating`) tokens each. Every expert multiplies every row, and each row keeps its own
    expert's product."""
    import torch

    rows = torch.arange(inputs.shape[0], device=inputs.device)
    expert = (rows[:, None] >= torch.cumsum(expert_size, 0)[None, :]).sum(1)
    out = torch.einsum("ri,eoi->reo", inputs, self.weight)
    return out.gather(1, expert[:, None, None].expand(-1, 1, out.shape[2])).squeeze(1)


def switch_experts(
    self: Any, hidden_states: Any, selected_experts: Any, routing_weights: Any
) -> Any:
    """``SwitchTransformersExperts.forward``: ``selected_experts`` is each token's one-hot expert
    (``[tokens, 1, experts]``, all zero for a token past its expert's capacity), ``routing_weights`` its
    router probability (``[tokens, 1]``). Every expert runs on every token; each token keeps its own
    expert's output, weighted, and a token past capacity keeps zeros, as in transformers."""
    import torch

    out = torch.stack([self[f"expert_{index}"](hidden_states) for index in range(self.num_experts)])
    weights = selected_experts[:, 0, :].to(out.dtype).T * routing_weights[:, 0].to(out.dtype)
    return (out * weights[..., None]).sum(0).to(hidden_states.dtype)


def switch_router(self: Any, hidden_states: Any) -> Any:
    """``SwitchTransformersTop1Router.forward`` outside training: transformers' routing (each token's most
    probable expert, one-hot, zero past the expert's capacity; that probability; the logits), with the
    classifier's weight cast to the router's dtype inside the product. transformers moves the classifier
    module itself in its forward (``self.classifier = self.classifier.to(self.dtype)``), which torch_xla's
    dynamo bridge cannot trace."""
    import torch

    if self.training:  # jitter noise
        return type(self).forward(self, hidden_states)
    classifier = self.classifier
    bias = None if classifier.bias is None else classifier.bias.to(self.dtype)
    logits = torch.nn.functional.linear(
        hidden_states.to(self.dtype), classifier.weight.to(self.dtype), bias
    )
    probabilities = torch.softmax(logits, dim=-1, dtype=self.dtype).to(hidden_states.dtype)
    chosen = torch.nn.functional.one_hot(probabilities.argmax(-1), num_classes=self.num_experts)
    within_capacity = chosen.cumsum(-2) <= self.expert_capacity
    return chosen * within_capacity, probabilities.max(-1).values.unsqueeze(-1), logits


#: transformers' classes with a method that loops over the experts a batch hits: class name -> (method,
#: its replacement); and Switch Transformers' router, which moves its classifier in its forward.
LOOPS = {
    "DbrxExperts": ("forward", dbrx_experts),
    "LongcatFlashExperts": ("forward", longcat_experts),
    "XmodOutput": ("lang_adapter", xmod_adapters),
    "JetMoeTopKGating": ("forward", jetmoe_gating),
    "JetMoeParallelExperts": ("forward", jetmoe_parallel_experts),
    "SwitchTransformersExperts": ("forward", switch_experts),
    "SwitchTransformersTop1Router": ("forward", switch_router),
}


def compile_experts(model: Any, patcher: Any, implementation: str) -> None:
    """Compute ``model``'s transformers expert layers by ``implementation`` (``"grouped_mm"``, or
    :data:`NAME` for :func:`every_expert`) where they run what transformers picks when nobody asks, through
    transformers' own extension point. That is ``"grouped_mm"``, or ``"eager"`` where the model class
    defaults to it (OpenAI Privacy Filter, which fears grouped_mm's order of additions): eager loops over the
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
