"""Fine-tuning hfax models in JAX: the model as a Flax NNX module, LoRA, train steps, checkpoints.

Needs the ``train`` extra (``pip install "hfax-jax[train]"``: flax and optax)::

    from hfax.backends.jax import train

    module = train.from_pretrained(path, mesh=mesh)          # or train.to_nnx(hfax_model)
    train.add_lora(module, ["q_proj", "v_proj"], rank=8)
    optimizer = nnx.Optimizer(module, optax.adamw(1e-4), wrt=nnx.LoRAParam)
"""

from hfax.backends.jax.train.checkpoints import load_adapter, save_adapter, save_pretrained
from hfax.backends.jax.train.lora import LoraConfig, add_lora, merge_lora, unmerge_lora
from hfax.backends.jax.train.module import Buffer, TransformersModule, from_pretrained, to_nnx
from hfax.backends.jax.train.step import Trainer

__all__ = [
    "Buffer",
    "LoraConfig",
    "Trainer",
    "TransformersModule",
    "add_lora",
    "from_pretrained",
    "load_adapter",
    "merge_lora",
    "save_adapter",
    "save_pretrained",
    "to_nnx",
    "unmerge_lora",
]
