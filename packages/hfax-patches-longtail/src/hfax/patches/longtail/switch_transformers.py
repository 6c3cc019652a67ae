"""Switch Transformers' experts and router with static shapes, on every backend: transformers loops in
Python over the experts a batch hits, and its router moves its classifier module in its forward, which
torch_xla's dynamo bridge cannot trace.
"""

from __future__ import annotations

from typing import Any


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


#: Switch Transformers' experts and router: class name -> (method, its replacement).
PATCHES = {
    "SwitchTransformersExperts": ("forward", switch_experts),
    "SwitchTransformersTop1Router": ("forward", switch_router),
}
