"""JetMoE's experts and mixture of attention heads with static shapes, on every backend: transformers
splits the tokens sorted by expert by a Python list of counts (``tolist()``), which no traced program has;
here the counts stay a tensor and every expert multiplies every row.
"""

from __future__ import annotations

from typing import Any


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


#: JetMoE's gating and experts: class name -> (method, its replacement).
PATCHES = {
    "JetMoeTopKGating": ("forward", jetmoe_gating),
    "JetMoeParallelExperts": ("forward", jetmoe_parallel_experts),
}
