"""The model users get from ``hfax.AutoModelForTPU.from_pretrained(..., backend="torch_xla")``."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from hfax import forward_buckets, validation
from hfax.backends.torchxla import generation, runtime, sharding
from hfax.model import BackendModel


class TorchXlaModel(BackendModel):
    """A transformers model whose weights live on an XLA device, with the JAX backend's surface.

    * ``model(**inputs)`` runs the forward compiled through the compile-step hook (once per input shape and set
      of Python flags) and returns the transformers output type with tensors on the XLA device. Compiled,
      transformers' mask code sees a traced tensor and skips its host syncs (``padding_mask.all()``). A
      language model's call of token ids runs padded into a bucket shape, its logits cut back
      (:mod:`hfax.forward_buckets`; ``pad_forward``), so calls of many lengths share a program: torch_xla
      on CPU compiles only so many programs in a process.
    * ``model.params`` holds the weights by ``state_dict`` name (tied weights once).
    * ``model.generate(...)`` decodes with a static KV cache and one compiled decode program per shape bucket
      (see :mod:`hfax.backends.torchxla.generation`); ``model.last_generate_stats`` says what it cost.
    """

    def __init__(
        self, module: torch.nn.Module, params: dict[str, torch.Tensor], **options: Any
    ) -> None:
        super().__init__(module, params, **options)
        #: The shape buckets this model compiled for ``generate``.
        self.buckets: set[generation.Bucket] = set()

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the weights."""
        return self.module.dtype

    @property
    def device(self) -> torch.device:
        return runtime.device()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def host_params(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().cpu() for name, tensor in self.params.items()}

    def sharding_report(self) -> Any:
        """Where every weight lives: an :class:`hfax.Layout` whose ``str`` is the table (tensor, shape, dtype,
        spec, bytes per device) and whose ``bytes_per_device`` is the total a device holds."""
        return sharding.plan_layout(self.module, self.plan, self.mesh)

    def program(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` compiled once per model through the compile-step hook."""
        return self.compiled(
            name, lambda: self._compile_step(fn, name=name, static_argnames=(), donate_argnames=())
        )

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """Run the forward on the XLA device. Arrays may be numpy or torch tensors on any device."""
        device = runtime.device()
        inputs = self.named_inputs(args, inputs)
        validation.check_forward_inputs(inputs, validation.vocab_size(self.module), self.module)
        forward = self.program("forward", _forward)
        if self.pad_forward and forward_buckets.pads(self.module, inputs):
            padded, padding = forward_buckets.padded(inputs)
            with torch.no_grad():
                whole = forward(self.module, _on_device(padded, device))
            output = forward_buckets.cut(whole, padding)
            if output is not None:
                return output
            # Its output holds more than logits: this call and every later one run at their own shape.
            self.pad_forward = False
        with torch.no_grad():
            return forward(self.module, _on_device(inputs, device))

    def generate(self, input_ids: Any = None, attention_mask: Any = None, **options: Any) -> Any:
        """transformers' ``generate`` on device, returning the type ``input_ids`` has (torch in, torch out;
        an encoder's features instead, for Whisper's ``input_features``); see
        :mod:`hfax.backends.torchxla.generation`."""
        self.check_can_generate()
        return generation.generate(self, input_ids, attention_mask, **options)


def _forward(module: torch.nn.Module, inputs: dict[str, Any]) -> Any:
    return module(**inputs)


def _on_device(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {name: _to_device(value, device) for name, value in inputs.items()}


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    return value.to(device) if isinstance(value, torch.Tensor) else value
