"""hfax: run Hugging Face transformers models on XLA devices (TPU, GPU, CPU) through JAX or PyTorch/XLA.

from hfax import AutoModelForTPU
model = AutoModelForTPU.from_pretrained("google/gemma-3-270m", backend="jax")
ids = model.generate(input_ids, max_new_tokens=64)
"""

from __future__ import annotations

# hfax is shared by several distributions (hfax.backends.jax, hfax.patches.llama, ...): only hfax-core ships
# this file, and it lets the others extend the package.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from typing import Any

from hfax.auto import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTPU,
    BackendNotInstalledError,
    get_backend,
)
from hfax.hookspecs import hookimpl
from hfax.patching import Patcher, unpatch
from hfax.plugins import detect_family, get_plugin_manager, register, unregister
from hfax.specs import (
    Backend,
    BackendSpec,
    Claim,
    DeviceMemoryError,
    FamilySpec,
    Layout,
    Placement,
    ShardingPlan,
)


def make_mesh(backend: str = "jax", **axis_sizes: int) -> Any:
    """A device mesh with axes among ``data``, ``fsdp`` and ``model``, e.g. ``make_mesh(data=2, model=4)``:
    built by ``backend`` (:meth:`Backend.make_mesh`; the JAX backend's is a ``jax.sharding.Mesh`` over every
    device)."""
    return get_backend(backend).make_mesh(**axis_sizes)


__all__ = [
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoModelForMaskedLM",
    "AutoModelForSeq2SeqLM",
    "AutoModelForSequenceClassification",
    "AutoModelForTPU",
    "Backend",
    "BackendNotInstalledError",
    "BackendSpec",
    "Claim",
    "DeviceMemoryError",
    "FamilySpec",
    "Layout",
    "Patcher",
    "Placement",
    "ShardingPlan",
    "detect_family",
    "get_backend",
    "get_plugin_manager",
    "hookimpl",
    "make_mesh",
    "register",
    "unpatch",
    "unregister",
]
