"""A transformers model as a Flax NNX module: its weights are ``nnx.Param``s, its forward is hfax's.

The module holds the :class:`~hfax.backends.jax.model.JaxModel` it came from as a static attribute and
calls its :meth:`~hfax.backends.jax.model.JaxModel.apply` (the torchax bridge) with the current values of
its variables, so the unmodified transformers forward runs and its output type comes back, ``.loss``
included when ``labels`` are given.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from hfax.backends.jax.model import JaxModel, as_jax
from hfax.backends.jax.train import lora
from hfax.backends.jax.train import loss as chunked_loss
from hfax.backends.jax.train import remat as remat_layers

#: Positions (rows x tokens) whose logits the chunked loss holds at a time.
DEFAULT_LOSS_CHUNK = 256


class Buffer(nnx.Variable):
    """A tensor the model holds but training leaves alone (rotary frequencies, position ids)."""


class TransformersModule(nnx.Module):
    """A loaded hfax JAX model as an ``nnx.Module``.

    * ``module.weights[state_name]`` is an ``nnx.Param`` per trainable tensor (tied weights once, under
      their first name) and a :class:`Buffer` per buffer, holding the arrays the sharding plan placed;
    * ``module.adapters[layer_name]`` holds the LoRA adapters :func:`~hfax.backends.jax.train.add_lora`
      attached (``nnx.LoRAParam``s);
    * ``module(**inputs)`` runs the transformers forward and returns its output (``.logits``, ``.loss``
      with ``labels``); ``compute_dtype`` casts floating weights for the forward only (mixed precision:
      float32 weights and optimizer state, 16-bit matrix products); ``remat=True`` recomputes each
      decoder layer's activations in the backward pass instead of keeping them (``remat.py``);
    * ``module.loss(**inputs)`` is transformers' causal LM loss of ``inputs`` (``labels`` given),
      computed ``loss_chunk`` positions (rows x tokens) at a time without the whole logits where the
      model's head allows it (``loss.py``), by the plain forward otherwise or with ``loss_chunk=None``.

    ``nnx.split`` / ``nnx.merge``, ``nnx.jit``, ``nnx.grad`` and ``nnx.Optimizer(module, tx, wrt=nnx.Param)``
    work on it as on any NNX module.
    """

    def __init__(
        self,
        model: JaxModel,
        *,
        compute_dtype: Any = None,
        remat: bool = False,
        loss_chunk: int | None = DEFAULT_LOSS_CHUNK,
    ) -> None:
        if not isinstance(model, JaxModel):
            raise TypeError(
                f"TransformersModule needs an hfax JAX model, got {type(model).__name__}; load one with "
                'hfax.AutoModelForTPU.from_pretrained(path, backend="jax")'
            )
        check_loss_chunk(loss_chunk)
        self.model = model
        self.loss_chunk = loss_chunk
        self.compute_dtype = None if compute_dtype is None else jnp.dtype(compute_dtype)
        self.remat = remat
        if remat:
            remat_layers.install(model.module)
        trainable = {name for name, _ in model.module.named_parameters()}
        self.weights = nnx.Dict(
            {
                name: (nnx.Param if name in trainable else Buffer)(array)
                for name, array in model.params.items()
            }
        )
        self.adapters = nnx.Dict()
        self.lora_config: lora.LoraConfig | None = None

    @property
    def config(self) -> Any:
        return self.model.config

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """The transformers forward on ``inputs`` (numpy, JAX or torch arrays; flags as Python values)."""
        inputs = self.model.named_inputs(args, inputs)
        check_labels(inputs)
        torch_module = self.model.module
        with (
            lora.active(torch_module, self.adapters),
            remat_layers.active(torch_module, self.remat),
        ):
            return self.model.apply(self.values(), **inputs)

    def loss(self, *args: Any, **inputs: Any) -> jax.Array:
        """transformers' causal LM loss of ``inputs`` (``labels`` required; ``num_items_in_batch``,
        ``ignore_index`` and ``shift_labels`` as transformers' loss takes them)."""
        inputs = self.model.named_inputs(args, inputs)
        if inputs.get("labels") is None:
            raise ValueError("module.loss needs labels; give labels=input_ids to score every token")
        check_labels(inputs)
        spec = self.loss_head()
        if spec is None:
            return self(**inputs).loss
        labels = as_jax(inputs.pop("labels"))
        loss_kwargs = {
            name: inputs.pop(name) for name in chunked_loss.LOSS_KWARGS if name in inputs
        }
        torch_module = self.model.module
        with chunked_loss.chunked(
            torch_module, spec, labels, self.loss_chunk, loss_kwargs
        ) as result:
            self(**inputs)
        return result.value

    def loss_head(self) -> chunked_loss.Head | None:
        """The output layer :meth:`loss` chunks over; ``None`` when it computes the plain loss."""
        if self.loss_chunk is None:
            return None
        return chunked_loss.head(self.model.module, set(self.adapters))

    def values(self) -> dict[str, jax.Array]:
        """Every weight's current value by state name; with a ``compute_dtype``, floating parameters are
        cast to it (buffers such as rotary frequencies keep their precision)."""
        return {name: self._compute_value(variable) for name, variable in self.weights.items()}

    def _compute_value(self, variable: nnx.Variable) -> jax.Array:
        value = variable[...]
        if (
            self.compute_dtype is None
            or not isinstance(variable, nnx.Param)
            or not jnp.issubdtype(value.dtype, jnp.floating)
        ):
            return value
        return value.astype(self.compute_dtype)

    def to_model(self) -> JaxModel:
        """An hfax model (``generate``, compiled forward) over these weights with the adapters merged in."""
        values = lora.merged_values(self)
        return JaxModel(
            self.model.module,
            values,
            family=self.model.family,
            plan=self.model.plan,
            mesh=self.model.mesh,
            compile_step=self.model._compile_step,
        )


def check_labels(inputs: dict[str, Any]) -> None:
    """Labels must have the shape of the ids they score, before anything is traced."""
    labels, ids = inputs.get("labels"), inputs.get("input_ids")
    if labels is None or ids is None:
        return
    if tuple(np.shape(labels)) != tuple(np.shape(ids)):
        raise ValueError(
            f"labels have shape {tuple(np.shape(labels))} but input_ids have {tuple(np.shape(ids))}; "
            "give one label per input token (-100 where no loss is wanted), transformers shifts them"
        )


def check_loss_chunk(loss_chunk: Any) -> None:
    if loss_chunk is not None and (not isinstance(loss_chunk, int) or loss_chunk < 1):
        raise ValueError(
            f"loss_chunk must be a positive number of positions or None (the plain loss), got "
            f"{loss_chunk!r}; e.g. loss_chunk={DEFAULT_LOSS_CHUNK}"
        )


def to_nnx(
    model: JaxModel,
    *,
    compute_dtype: Any = None,
    remat: bool = False,
    loss_chunk: int | None = DEFAULT_LOSS_CHUNK,
) -> TransformersModule:
    """``model`` (an hfax JAX model) as a :class:`TransformersModule` sharing its placed weights."""
    return TransformersModule(
        model, compute_dtype=compute_dtype, remat=remat, loss_chunk=loss_chunk
    )


def from_pretrained(
    name_or_path: str,
    *,
    mesh: Any = None,
    dtype: Any = None,
    compute_dtype: Any = None,
    remat: bool = False,
    loss_chunk: int | None = DEFAULT_LOSS_CHUNK,
    **hf_kwargs: Any,
) -> TransformersModule:
    """Load ``name_or_path`` with hfax's JAX backend (placed over ``mesh`` by the model's sharding plan)
    and return it as a :class:`TransformersModule`. ``dtype`` is the weights' (transformers'
    ``from_pretrained``); ``compute_dtype`` the forward's; ``remat`` checkpoints every decoder layer;
    ``loss_chunk`` is how many positions :meth:`TransformersModule.loss` scores at a time."""
    import hfax

    if dtype is not None:
        hf_kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = hfax.AutoModelForTPU.from_pretrained(
        name_or_path, backend="jax", mesh=mesh, **hf_kwargs
    )
    return to_nnx(model, compute_dtype=compute_dtype, remat=remat, loss_chunk=loss_chunk)
