"""Walking a torch module's parameters and buffers, tied ones included, without importing torch, and the
layout a sharding plan gives them.

``Module.to`` gives every module its own copy of a tied weight when the device's tensor type differs from
the CPU's (XLA, torchax), so backends move tensors slot by slot, once per distinct tensor.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from hfax.specs import Layout, Placement, ShardingPlan


def tensor_slots(model: Any) -> Iterator[tuple[str, dict[str, Any], str, Any]]:
    """Every parameter and buffer slot: ``(state name, the module's registry, key in it, tensor)``.

    A tied weight appears once per module that holds it, under each module's name.
    """
    for prefix, module in model.named_modules():
        for registry in (module._parameters, module._buffers):
            for name, tensor in list(registry.items()):
                if tensor is not None:
                    yield (f"{prefix}.{name}" if prefix else name), registry, name, tensor


def distinct_tensors(model: Any) -> dict[str, Any]:
    """Every parameter and buffer once (a tied weight under its first name): the names
    ``torch.func.functional_call`` expects."""
    named: dict[str, Any] = {}
    seen: set[int] = set()
    for full_name, _, _, tensor in tensor_slots(model):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            named[full_name] = tensor
    return named


def plan_layout(
    model: Any,
    plan: ShardingPlan,
    sizes: Mapping[str, int],
    device_memory: int | None = None,
    memory_source: str = "",
) -> Layout:
    """The layout ``model``'s tensors (real or on torch's ``meta`` device) get on a mesh of axis ``sizes``
    (empty: one device) from a backend that places each weight by ``plan.spec_on``."""
    placements = []
    for name, tensor in distinct_tensors(model).items():
        shape = tuple(tensor.shape)
        spec = plan.spec_on(name, shape, sizes) if sizes else (None,) * len(shape)
        whole = tensor.numel() * tensor.element_size()
        split = 1
        for axis in spec:
            split *= sizes[axis] if axis is not None else 1
        placements.append(
            Placement(
                name, shape, str(tensor.dtype).removeprefix("torch."), spec, whole, whole // split
            )
        )
    return Layout(tuple(sizes.items()), tuple(placements), device_memory, memory_source)
