"""LoRA adapters on a :class:`~hfax.backends.jax.train.module.TransformersModule`'s linear layers.

Each adapted layer ``y = W x + b`` becomes ``y = W x + b + scaling * B(A(dropout(x)))``, as PEFT computes
it (``A`` is ``[rank, in]``, ``B`` is ``[out, rank]``, ``scaling = alpha / rank``; the input is cast to the
adapters' dtype and the sum back to the layer's). ``A`` and ``B`` are ``nnx.LoRAParam``s, so
``nnx.Optimizer(module, tx, wrt=nnx.LoRAParam)`` trains them alone; they are float32 whatever the base
weights' dtype.

The branch is added by a recorded patch on each adapted torch layer's ``forward`` (``hfax.unpatch``
removes it): the patch reads the adapters of the module being called, so a layer runs unchanged when no
adapters are active (the plain hfax model, eager calls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import torch
from flax import nnx
from transformers.pytorch_utils import Conv1D

from hfax.backends.jax.mesh import replicate
from hfax.backends.jax.runtime import to_array, to_tensor
from hfax.patching import Patcher

_SLOT = "_hfax_lora_slot"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """What :func:`add_lora` attached: PEFT's ``LoraConfig`` fields of the same meaning."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]
    rslora: bool = False  # PEFT's use_rslora: scaling alpha / sqrt(rank)

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

    def check(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(
                f"LoRA rank must be a positive integer, got {self.rank!r}; e.g. rank=8"
            )
        if self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be positive, got {self.alpha!r}; e.g. alpha=16")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        if not self.targets or isinstance(self.targets, str):
            raise ValueError(
                f"LoRA targets must be a list of layer names, got {self.targets!r}; "
                'e.g. targets=["q_proj", "v_proj"]'
            )


class LoraAdapter(nnx.Module):
    """``A`` (``lora_a``, ``[rank, in]``) and ``B`` (``lora_b``, ``[out, rank]``) of one linear layer."""

    def __init__(
        self,
        lora_a: jax.Array,
        lora_b: jax.Array,
        *,
        scaling: float,
        dropout: float,
        transposed: bool,
        rngs: nnx.Rngs,
    ) -> None:
        self.lora_a = nnx.LoRAParam(lora_a)
        self.lora_b = nnx.LoRAParam(lora_b)
        self.scaling = scaling
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.transposed = transposed  # transformers' Conv1D (GPT-2) keeps its weight as [in, out]
        self.merged = False

    def __call__(self, x: jax.Array) -> jax.Array:
        """The branch's output for layer input ``x``, in the adapters' dtype."""
        x = self.dropout(x.astype(self.lora_a.dtype))
        return (x @ self.lora_a[...].T) @ self.lora_b[...].T * self.scaling

    def delta(self) -> jax.Array:
        """What merging adds to the layer's weight, in its layout."""
        product = self.lora_b[...] @ self.lora_a[...] * self.scaling
        return product.T if self.transposed else product


class _Slot:
    """The adapters of the module being called, read by the patched ``forward`` of adapted layers."""

    adapters: Mapping[str, LoraAdapter] | None = None


def linear_layers(torch_module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every layer LoRA can adapt (``nn.Linear`` and transformers' ``Conv1D``), by module name."""
    return {
        name: layer
        for name, layer in torch_module.named_modules()
        if isinstance(layer, (torch.nn.Linear, Conv1D))
    }


def matches(name: str, targets: tuple[str, ...]) -> bool:
    """PEFT's rule for a list of target names: the module's name, or its last dotted parts."""
    return any(name == target or name.endswith("." + target) for target in targets)


def add_lora(
    module: Any,
    targets: list[str] | tuple[str, ...],
    *,
    rank: int = 8,
    alpha: float = 16,
    dropout: float = 0.0,
    seed: int = 0,
) -> LoraConfig:
    """Attach LoRA adapters to every linear layer of ``module`` named by ``targets`` (PEFT's matching:
    ``"q_proj"`` adapts every ``...q_proj``), initialised as PEFT does (``A`` Kaiming-uniform, ``B`` zero,
    so the model's output is unchanged). Returns the :class:`LoraConfig` kept on ``module``."""
    config = LoraConfig(rank, float(alpha), float(dropout), tuple(targets))
    config.check()
    layers = _chosen_layers(module, config.targets)
    rngs = nnx.Rngs(params=seed, dropout=seed + 1)
    shapes = {}
    for name, layer in layers.items():
        fan_in, fan_out = _fan(layer)
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)), PEFT's initialiser for A
        lora_a = jax.random.uniform(rngs.params(), (rank, fan_in), jnp.float32, -bound, bound)
        shapes[name] = (lora_a, jnp.zeros((fan_out, rank), jnp.float32))
    attach(module, config, shapes, rngs)
    return config


def attach(
    module: Any,
    config: LoraConfig,
    weights: Mapping[str, tuple[Any, Any]],
    rngs: nnx.Rngs,
) -> None:
    """Give ``module`` adapters with the given ``(A, B)`` per layer name and patch those layers."""
    if len(module.adapters):
        raise ValueError(
            "this module already has LoRA adapters; merge them (merge_lora) or load the module again "
            "before adding others"
        )
    torch_module = module.model.module
    layers = linear_layers(torch_module)
    slot = _install_slot(torch_module)
    patcher = Patcher(torch_module)
    for name, (lora_a, lora_b) in weights.items():
        if f"{name}.weight" not in module.weights:
            raise ValueError(
                f"layer {name!r} shares its weight with another layer (tied embeddings), which LoRA "
                "cannot adapt alone; leave it out of the targets"
            )
        layer = layers[name]
        module.adapters[name] = LoraAdapter(
            replicate(jnp.asarray(lora_a, jnp.float32), module.model.mesh),
            replicate(jnp.asarray(lora_b, jnp.float32), module.model.mesh),
            scaling=config.scaling,
            dropout=config.dropout,
            transposed=isinstance(layer, Conv1D),
            rngs=rngs,
        )
        if not getattr(layer.forward, "hfax_lora", False):  # patched once whatever the modules
            patcher.bind(layer, "forward", _adapted_forward(name, layer.forward, slot))
    module.lora_config = config


def _chosen_layers(module: Any, targets: tuple[str, ...]) -> dict[str, torch.nn.Module]:
    torch_module = module.model.module
    layers = linear_layers(torch_module)
    chosen = {name: layer for name, layer in layers.items() if matches(name, targets)}
    if chosen:
        return chosen
    others = [
        name
        for name, layer in torch_module.named_modules()
        if name and matches(name, targets) and name not in layers
    ]
    kinds = sorted({name.rsplit(".", 1)[-1] for name in layers})
    hint = f" ({', '.join(others[:3])} match but are not linear layers)" if others else ""
    raise ValueError(
        f"LoRA targets {list(targets)} match no linear layer{hint}; the model's linear layers are "
        f"named {kinds}"
    )


def _fan(layer: torch.nn.Module) -> tuple[int, int]:
    """``(in, out)`` features of a linear layer."""
    if isinstance(layer, Conv1D):
        return layer.weight.shape[0], layer.weight.shape[1]
    return layer.in_features, layer.out_features


def _install_slot(torch_module: torch.nn.Module) -> _Slot:
    slot = vars(torch_module).get(_SLOT)
    if slot is None:
        slot = _Slot()
        Patcher(torch_module).setattr(torch_module, _SLOT, slot)
    return slot


def _adapted_forward(name: str, original: Any, slot: _Slot) -> Any:
    def forward(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = original(x)
        adapter = (slot.adapters or {}).get(name)
        if adapter is None or adapter.merged:
            return out
        base = to_array(out)
        return to_tensor((base + adapter(to_array(x))).astype(base.dtype))

    forward.hfax_lora = True  # type: ignore[attr-defined]
    return forward


@contextlib.contextmanager
def active(torch_module: torch.nn.Module, adapters: Mapping[str, LoraAdapter]) -> Iterator[None]:
    """Within the block, the adapted layers of ``torch_module`` add ``adapters``' branches."""
    slot = vars(torch_module).get(_SLOT)
    if slot is None or not len(adapters):
        yield
        return
    slot.adapters = adapters
    try:
        yield
    finally:
        slot.adapters = None


def merged_values(module: Any) -> dict[str, jax.Array]:
    """``module``'s weights by state name with every unmerged adapter's product added in."""
    values = {name: variable[...] for name, variable in module.weights.items()}
    for name, adapter in module.adapters.items():
        if not adapter.merged:
            key = f"{name}.weight"
            values[key] = _add(values[key], adapter.delta())
    return values


def merge_lora(module: Any) -> None:
    """Add every adapter's product into its layer's weight; the adapters stop contributing until
    :func:`unmerge_lora` (a 16-bit weight rounds the sum to 16 bits)."""
    for name, adapter in module.adapters.items():
        if not adapter.merged:
            weight = module.weights[f"{name}.weight"]
            weight[...] = _add(weight[...], adapter.delta())
            adapter.merged = True


def unmerge_lora(module: Any) -> None:
    """Take every merged adapter's product back out of its layer's weight."""
    for name, adapter in module.adapters.items():
        if adapter.merged:
            weight = module.weights[f"{name}.weight"]
            weight[...] = _add(weight[...], -adapter.delta())
            adapter.merged = False


def _add(weight: jax.Array, delta: jax.Array) -> jax.Array:
    return (weight.astype(jnp.float32) + delta).astype(weight.dtype)
