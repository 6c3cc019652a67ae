"""The model users get from ``hfax.AutoModelForTPU.from_pretrained(..., backend="jax")``."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hfax import forward_buckets, masks, validation
from hfax.backends.jax import constants, generation, layout, programs, pytrees
from hfax.backends.jax.mesh import shard_batch
from hfax.backends.jax.runtime import env, to_array, to_tensor
from hfax.backends.jax.weights import host_tensor
from hfax.generation import inputs as model_inputs
from hfax.model import BackendModel


class JaxModel(BackendModel):
    """A transformers model whose weights live in JAX arrays and whose calls run as compiled XLA programs.

    * ``model(**inputs)`` runs the jitted forward and returns the transformers output type with ``jax.Array``
      fields (CPU torch tensors when the inputs are torch tensors, as transformers' pipelines pass them);
      Python flags (``use_cache``, ``return_dict``, ...) are static, arrays are traced. Inside a user's
      ``jax.jit`` / ``jax.grad`` / ``jax.vmap`` it runs :meth:`apply` on the traced values.
    * ``model.params`` is the weight pytree and ``model.apply(params, *args, **kwargs)`` the pure forward, for
      ``jax.jit`` / ``jax.grad``.
    * ``model.generate(...)`` runs prefill and the whole decode loop on device (see ``generate.py``).

    Built by :class:`~hfax.backends.jax.backend.JaxBackend` with the arguments of :class:`hfax.model.BackendModel`.
    """

    @property
    def dtype(self) -> Any:
        """The floating dtype of the weights."""
        floats = [p.dtype for p in self.params.values() if jnp.issubdtype(p.dtype, jnp.floating)]
        return floats[0] if floats else jnp.float32

    @property
    def device(self) -> torch.device:
        """The torch device callers keep inputs on: the CPU (the weights live on ``platform``'s devices)."""
        return torch.device("cpu")

    @property
    def platform(self) -> str:
        """Where the weights live: ``"cpu"``, ``"tpu"``, ``"gpu"``."""
        first = next(iter(self.params.values()), None)
        return next(iter(first.devices())).platform if first is not None else jax.default_backend()

    def num_parameters(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.params.values())

    def host_params(self) -> dict[str, torch.Tensor]:
        return {name: host_tensor(array) for name, array in self.params.items()}

    def sharding_report(self) -> Any:
        """Where every weight lives: an :class:`hfax.Layout` whose ``str`` is the table (tensor, shape,
        dtype, spec, bytes per device) and whose ``bytes_per_device`` is the total a device holds."""
        return layout.array_layout(self.params, self.mesh)

    def apply(self, params: dict[str, jax.Array], *args: Any, **kwargs: Any) -> Any:
        """The pure forward: run the model with ``params`` on JAX values and return JAX values.

        Traceable by ``jax.jit``, ``jax.grad`` and ``jax.vmap``; non-array keyword flags are passed through.
        """
        args, kwargs = jax.tree_util.tree_map(_host_to_jax, (args, kwargs))
        targs, tkwargs, tparams = to_tensor((args, kwargs, params))
        with env():
            output = torch.func.functional_call(
                self.module, tparams, targs, tkwargs, tie_weights=True, strict=False
            )
        return pytrees.to_jax(output, to_array)

    def program(
        self, name: str, fn: Callable[..., Any], donate: tuple[str, ...] = ()
    ) -> Callable[..., Any]:
        """``fn(self, ...)`` compiled through the compile-step hook; ``static`` is static. Traced once per argument
        signature, and kept traced on disk for later processes (see ``programs.py``)."""

        def make() -> Callable[..., Any]:
            jitted = self._compile_step(
                functools.partial(fn, self),
                name=name,
                static_argnames=("static",),
                donate_argnames=donate,
            )
            positional = [p for p in list(inspect.signature(fn).parameters)[1:] if p != "static"]
            fingerprint = functools.partial(programs.model_fingerprint, self.module, self.family)
            return programs.Program(
                name,
                jitted,
                fingerprint,
                tuple(positional.index(d) for d in donate),
                label=fn.__name__,
            )

        return self.compiled(name, make)

    def _forward(
        self,
        params: dict[str, jax.Array],
        arrays: dict[str, Any],
        static: tuple[tuple[str, Any], ...],
    ) -> Any:
        held = {name: v.array() for name, v in static if isinstance(v, constants.Constant)}
        flags = {name: value for name, value in static if name not in held}
        if "token_type_ids" in arrays and masks.block_ids(self.module) is not None:
            arrays = {**arrays, "attention_mask": self._block_mask(arrays)}
        with constants.folding(bool(held)):
            return self.apply(params, **arrays, **held, **flags)

    def _block_mask(self, arrays: dict[str, Any]) -> Any:
        """The attention masks of a prompt whose images' tokens see each other (Gemma 3's
        ``token_type_ids``), from :mod:`hfax.masks`: transformers builds them with ``vmap``, which torchax
        does not trace."""
        ids, types = arrays["input_ids"], arrays["token_type_ids"]
        valid = arrays.get("attention_mask", jnp.ones(ids.shape, bool)).astype(bool)
        tvalid, ttypes = to_tensor((valid, types))
        with env():
            blocks = masks.block_ids(self.module)(ttypes)
            form = masks.form(self.config, self.module)
            tslots = to_tensor(jnp.arange(ids.shape[1]))
            mask = masks.attention_mask(form, tvalid, tslots, self.module.dtype, blocks)
        return to_array(mask)

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """Run the compiled forward. Arrays may be numpy, JAX or torch; integer ids stay integers."""
        inputs = self.named_inputs(args, inputs)
        validation.check_forward_inputs(inputs, validation.vocab_size(self.module), self.module)
        inputs = model_inputs.with_positions(self.module, inputs)
        arrays, static = {}, {}
        ids_shape = np.shape(inputs["input_ids"]) if "input_ids" in inputs else None
        for name, value in inputs.items():
            if isinstance(value, (np.ndarray, jax.Array, torch.Tensor)):
                arrays[name] = as_jax(value)
            else:
                static[name] = value
        if any(isinstance(value, jax.core.Tracer) for value in arrays.values()):
            # Inside the caller's jit / grad / vmap: their transformation traces the pure forward.
            return self.apply(self.params, **arrays, **static)
        for name in [name for name in arrays if constants.is_size(name, arrays[name], ids_shape)]:
            static[name] = constants.Constant(name, np.asarray(arrays.pop(name)))  # image sizes
        if self.pad_forward and forward_buckets.pads(self.module, inputs):
            padded, padding = forward_buckets.padded(inputs)
            padded_arrays = {**arrays, **_as_jax_all(padded, self._signature)}
            whole = self._run_forward(padded_arrays, static)
            given = (self.params, padded_arrays)
            output = forward_buckets.cut(_like_inputs(whole, inputs, given), padding)
            if output is not None:
                return output
            # Its output holds more than logits: this call and every later one run at their own shape.
            self.pad_forward = False
        return _like_inputs(self._run_forward(arrays, static), inputs, (self.params, arrays))

    def _run_forward(self, arrays: dict[str, Any], static: dict[str, Any]) -> Any:
        arrays = shard_batch(arrays, self.mesh)
        return self.program("forward", JaxModel._forward)(
            self.params, arrays, static=tuple(sorted(static.items()))
        )

    def generate(self, input_ids: Any = None, attention_mask: Any = None, **options: Any) -> Any:
        """transformers' ``generate`` on device (:mod:`hfax.generation`): the result has the array type
        of ``input_ids`` (numpy, torch or JAX), or is transformers' ``Generate*Output``."""
        self.check_can_generate()
        return generation.generate(self, input_ids, attention_mask, **options)


def _like_inputs(output: Any, inputs: dict[str, Any], given: Any) -> Any:
    """``output`` with CPU torch tensors for its arrays when any of ``inputs`` is a torch tensor.

    An array on one CPU device becomes its tensor without a copy (DLPack): a forward's logits run to
    hundreds of megabytes. An array the program was ``given`` comes back as that same array when the program
    returns it unchanged, so it is copied: writing into the tensor then changes neither the weights nor
    the caller's arrays.
    """
    if not any(isinstance(value, torch.Tensor) for value in inputs.values()):
        return output
    given_ids = {id(leaf) for leaf in jax.tree.leaves(given)}

    def tensor(array: Any) -> Any:
        if not isinstance(array, jax.Array):
            return array
        if id(array) in given_ids or not _on_one_cpu(array):
            return host_tensor(array)
        return torch.from_dlpack(array)

    return jax.tree.map(tensor, output)


def _on_one_cpu(array: jax.Array) -> bool:
    devices = array.devices()
    return len(devices) == 1 and next(iter(devices)).platform == "cpu"


def _as_jax_all(padded: dict[str, Any], signature: Any) -> dict[str, jax.Array]:
    """The padded ids and, where the forward takes one, their mask, as JAX arrays."""
    names = ["input_ids", "attention_mask"] if "attention_mask" in signature else ["input_ids"]
    return {name: as_jax(padded[name]) for name in names}


def _host_to_jax(value: Any) -> Any:
    return as_jax(value) if isinstance(value, np.ndarray) or type(value) is torch.Tensor else value


def as_jax(value: Any) -> jax.Array:
    """numpy / torch / JAX arrays as JAX arrays (64-bit integers become int32, as JAX computes in 32 bits)."""
    if isinstance(value, jax.Array):
        return value.astype(jnp.int32) if value.dtype == jnp.int64 else value
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == np.int64:
        array = array.astype(
            np.int32
        )  # on the host: jnp would compile a conversion program per shape
    return jax.device_put(array)
