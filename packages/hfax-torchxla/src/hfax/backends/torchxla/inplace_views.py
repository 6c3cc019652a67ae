"""In-place view methods (``x.unsqueeze_(1)``, ``squeeze_``, ``transpose_``, ``t_``) in the graphs dynamo
hands PyTorch/XLA, rewritten to their out-of-place forms.

These methods change only a tensor's shape, not its values. torch 2.9's functionalization (AOT autograd,
which the ``openxla`` backend runs) fails on them for XLA tensors ("Expected XLA tensor. Got:
XLALongType"), so a model that calls one cannot compile: BigBird's question answering does, on the
question lengths it computes. In dynamo's graph, every use of ``x`` after ``x.unsqueeze_(1)`` refers to
the same node as before it. Rewriting the call to ``x1 = x.unsqueeze(1)`` and pointing the later uses at
``x1`` computes the same thing: ``x1`` is a view of the same storage with the new shape, and views taken
from ``x`` before the call keep their shape either way. A graph input's or a module attribute's shape
change would have to outlive the call, which no graph output can do: such calls are left as they are.
"""

from __future__ import annotations

from typing import Any, Callable

#: The in-place view methods and their out-of-place forms.
OUT_OF_PLACE = {
    "unsqueeze_": "unsqueeze",
    "squeeze_": "squeeze",
    "transpose_": "transpose",
    "swapdims_": "swapdims",
    "swapaxes_": "swapaxes",
    "t_": "t",
}

#: The graph nodes that compute a tensor inside the graph (not an input, nor a module's attribute, whose
#: new shape would have to outlive the call).
COMPUTED = ("call_function", "call_method", "call_module")


def rewrite(graph_module: Any) -> int:
    """Rewrite ``graph_module``'s in-place view calls on intermediate tensors; returns how many."""
    graph = graph_module.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_method" or node.target not in OUT_OF_PLACE:
            continue
        tensor = node.args[0]
        if getattr(tensor, "op", None) not in COMPUTED:
            continue
        with graph.inserting_before(node):
            view = graph.call_method(OUT_OF_PLACE[node.target], node.args, node.kwargs)
        view.meta = dict(node.meta)
        node.replace_all_uses_with(view)
        later = [user for user in tensor.users if order.get(user, -1) > order[node]]
        for user in later:
            user.replace_input_with(tensor, view)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.lint()
        graph_module.recompile()
    return rewritten


def openxla_backend() -> Callable[..., Any]:
    """torch_xla's ``openxla`` dynamo backend, run on the graph after :func:`rewrite`."""
    from torch._dynamo.backends.registry import lookup_backend

    openxla = lookup_backend("openxla")

    def compile_graph(graph_module: Any, example_inputs: list[Any]) -> Any:
        rewrite(graph_module)
        return openxla(graph_module, example_inputs)

    return compile_graph
