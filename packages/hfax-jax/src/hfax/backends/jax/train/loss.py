"""transformers' causal LM loss computed a chunk of positions at a time, never holding the whole logits.

The model's forward runs as usual up to its output projection (``get_output_embeddings()``). That layer's
``forward`` is swapped for the call: it receives the final hidden states, and instead of returning the
``[rows, tokens, vocab]`` logits it computes the loss over chunks of sequence positions in a
``jax.lax.scan`` whose body is under ``jax.checkpoint``: the projection, the model's final logit
soft-capping, the upcast to float32 and the cross-entropy of one chunk. Forward and backward hold one
chunk's logits at a time; the backward recomputes them from the chunk's hidden states.

The result is transformers' ``ForCausalLMLoss``: labels shifted left by one (or ``shift_labels`` as
given), ``ignore_index`` (-100) not scored, the mean over scored tokens or the sum over
``num_items_in_batch``. It applies to a model whose forward is transformers' standard causal LM head
(``logits = self.lm_head(hidden_states)``, optionally Gemma's ``final_logit_softcapping``, then
``self.loss_function``, which must be ``ForCausalLMLoss``), checked on its source; any other model (logit
scales, auxiliary losses, other loss functions) or a LoRA-adapted output layer keeps the plain forward's
loss (:func:`head` returns ``None``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import torch
from transformers.loss.loss_utils import ForCausalLMLoss

from hfax.backends.jax.runtime import to_array, to_tensor

#: The keyword arguments of ``ForCausalLMLoss`` the chunked loss takes besides the labels.
LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")

_SOFTCAP = (
    r"ifself\.config\.final_logit_softcapping isnotNone:"
    r"logits=logits/self\.config\.final_logit_softcapping"
    r"logits=torch\.tanh\(logits\)"
    r"logits=logits\*self\.config\.final_logit_softcapping"
).replace(" ", "")


@dataclasses.dataclass(frozen=True)
class Head:
    """A model's output layer as the chunked loss sees it: its attribute name and the soft-capping."""

    name: str
    softcap: float | None


def head(torch_module: torch.nn.Module, adapted: set[str]) -> Head | None:
    """``torch_module``'s output layer when its forward is transformers' standard causal LM head and
    its loss ``ForCausalLMLoss``; ``None`` (use the plain loss) otherwise or when the layer's name is in
    ``adapted`` (LoRA adapters on the output layer)."""
    output = getattr(torch_module, "get_output_embeddings", lambda: None)()
    if not isinstance(output, torch.nn.Linear):
        return None
    name = next((n for n, child in torch_module.named_children() if child is output), None)
    if name is None or name in adapted or torch_module.loss_function is not ForCausalLMLoss:
        return None
    if not _standard_forward(type(torch_module), name):
        return None
    softcap = getattr(torch_module.config, "final_logit_softcapping", None)
    return Head(name, None if softcap is None else float(softcap))


def _standard_forward(cls: type, name: str) -> bool:
    """Whether ``cls.forward`` goes from the output layer's logits to ``self.loss_function`` and its
    return with nothing but Gemma's soft-capping in between (no scale, no auxiliary loss)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    code = "".join(
        re.sub(r"#.*", "", line).strip().replace(" ", "") for line in source.splitlines()
    )
    pattern = (
        rf"logits=self\.{re.escape(name)}\(hidden_states(\[:,slice_indices,:\])?\)"
        rf"({_SOFTCAP})?"
        r"loss=Noneiflabelsis(not)?None:loss=self\.loss_function\([^()]*(\([^()]*\))?[^()]*\)return"
    )
    return re.search(pattern, code) is not None


class _Result:
    value: jax.Array | None = None


@contextlib.contextmanager
def chunked(
    torch_module: torch.nn.Module,
    spec: Head,
    labels: Any,
    chunk: int,
    loss_kwargs: dict[str, Any],
) -> Iterator[_Result]:
    """While active, ``torch_module``'s output layer returns a ``[rows, tokens, 1]`` zero placeholder
    for the logits and puts the chunked loss of ``labels`` into the yielded result's ``value``.
    ``chunk`` is how many positions (rows x tokens) one chunk scores."""
    layer = getattr(torch_module, spec.name)
    patched = vars(layer).get("forward")  # a recorded patch on the layer, if any
    projection = layer.forward
    result = _Result()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if result.value is not None:
            raise RuntimeError(
                f"{type(torch_module).__name__} called its output layer twice in one forward; "
                "train it with the plain loss (loss_chunk=None)"
            )
        result.value = causal_lm_loss(
            projection, to_array(hidden), jnp.asarray(labels), spec.softcap, chunk, **loss_kwargs
        )
        return hidden.new_zeros((*hidden.shape[:-1], 1))

    layer.forward = forward
    try:
        yield result
    finally:
        if patched is None:
            del layer.forward
        else:
            layer.forward = patched


def causal_lm_loss(
    projection: Any,
    hidden: jax.Array,
    labels: jax.Array,
    softcap: float | None,
    chunk: int,
    *,
    num_items_in_batch: Any = None,
    ignore_index: int = -100,
    shift_labels: Any = None,
) -> jax.Array:
    """``ForCausalLMLoss`` of the logits ``projection`` (a torch callable) makes of ``hidden``
    (``[rows, tokens, hidden]``), ``chunk`` positions at a time."""
    rows, tokens = hidden.shape[:2]
    if shift_labels is None:
        pad = jnp.full((rows, 1), ignore_index, labels.dtype)
        targets = jnp.concatenate([labels[:, 1:], pad], axis=1)
    else:
        targets = jnp.asarray(shift_labels).reshape(rows, tokens)
    width = max(1, min(tokens, chunk // rows))  # sequence positions per chunk
    count = -(-tokens // width)
    extra = count * width - tokens
    hidden = jnp.pad(hidden, ((0, 0), (0, extra), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, extra)), constant_values=ignore_index)
    hidden = hidden.reshape(rows, count, width, -1).swapaxes(0, 1)
    targets = targets.reshape(rows, count, width).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_loss(hidden: jax.Array, targets: jax.Array) -> jax.Array:
        logits = to_array(projection(to_tensor(hidden)))
        if softcap is not None:
            logits = jnp.tanh(logits / softcap) * softcap
        logits = logits.astype(jnp.float32)
        scored = targets != ignore_index
        picked = jnp.take_along_axis(logits, jnp.where(scored, targets, 0)[..., None], axis=-1)
        losses = jax.nn.logsumexp(logits, axis=-1) - picked[..., 0]
        return jnp.sum(jnp.where(scored, losses, 0.0))

    def body(total: jax.Array, pieces: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        return total + chunk_loss(*pieces), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (hidden, targets))
    if num_items_in_batch is None:
        return total / jnp.sum(targets != ignore_index)
    return total / jnp.asarray(num_items_in_batch)
