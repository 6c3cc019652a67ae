"""A compiled training step over a :class:`~hfax.backends.jax.train.module.TransformersModule`.

The module and its optimizer are split once into a graph and a state; every step is one ``jax.jit``
program over the state (donated, so the old weights and optimizer state are reused in place) and the
batch, compiled once per batch shape. Gradient accumulation runs ``accumulate`` micro-batches inside that
program and weighs each by its scored tokens, so the update equals one step over the whole batch. On a
mesh the weights and optimizer state keep the placement the sharding plan gave them and the batch rows
are split over the ``data`` and ``fsdp`` axes; GSPMD inserts the collectives.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hfax.backends.jax.mesh import batch_multiple, shard_batch
from hfax.backends.jax.train.module import check_labels

#: Label of tokens that carry no loss (transformers' ``ignore_index``).
IGNORE = -100


class Trainer:
    """Train ``module`` with ``tx`` (an optax transformation) on the variables ``wrt`` selects
    (``nnx.Param``: every weight; ``nnx.LoRAParam``: the adapters alone).

    ``trainer.step(batch)`` takes ``input_ids`` and ``labels`` (and ``attention_mask``), ``[rows,
    tokens]`` host or JAX arrays, and returns the step's loss (a JAX scalar: reading it waits for the
    step). ``module`` holds the trained weights after every step.
    """

    def __init__(
        self,
        module: Any,
        tx: optax.GradientTransformation,
        *,
        wrt: Any = nnx.Param,
        accumulate: int = 1,
    ) -> None:
        if not isinstance(accumulate, int) or accumulate < 1:
            raise ValueError(f"accumulate must be a positive integer, got {accumulate!r}")
        self.module = module
        _own_weights(module)
        self.optimizer = nnx.Optimizer(module, tx, wrt=wrt)
        self.wrt = wrt
        self.accumulate = accumulate
        self.graphdef, state = nnx.split((module, self.optimizer))
        # Committed: the optimizer's fresh scalars are not, the step's outputs are, and a program's
        # cache key includes that, so the second step would compile again.
        self.state = jax.tree.map(functools.partial(_committed, module.model.mesh), state)
        self._step = jax.jit(self._train_step, donate_argnums=0)

    def step(self, batch: dict[str, Any]) -> jax.Array:
        batch = self.check(batch)
        self.state, loss = self._step(self.state, shard_batch(batch, self.module.model.mesh))
        nnx.update((self.module, self.optimizer), self.state)
        # The step donated the arrays the loaded model holds too (the module wraps them without a copy):
        # it holds the new ones, so it keeps working, with the trained weights and without the adapters
        # (``module.to_model()`` merges those).
        self.module.model.params.update(
            {name: variable[...] for name, variable in self.module.weights.items()}
        )
        return loss

    def check(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Refuse a batch the step cannot take, before anything compiles."""
        missing = {"input_ids", "labels"} - set(batch)
        if missing:
            raise ValueError(f"a training batch needs {sorted(missing)}; got {sorted(batch)}")
        check_labels(batch)
        rows = np.shape(batch["input_ids"])[0]
        multiple = self.accumulate * batch_multiple(self.module.model.mesh)
        if rows % multiple:
            raise ValueError(
                f"a batch of {rows} rows does not split into {self.accumulate} micro-batches over the "
                f"mesh's batch axes; give a multiple of {multiple} rows"
            )
        return batch

    def _train_step(self, state: Any, batch: dict[str, jax.Array]) -> tuple[Any, jax.Array]:
        module, optimizer = nnx.merge(self.graphdef, state)
        scored = jnp.maximum(scored_tokens(batch["labels"]), 1)
        micro_batches = jax.tree.map(lambda x: x.reshape(self.accumulate, -1, *x.shape[1:]), batch)

        def weighted_loss(module: Any, micro: dict[str, jax.Array]) -> jax.Array:
            # transformers averages over a micro-batch's scored tokens; weigh it by their share
            return module.loss(**micro) * scored_tokens(micro["labels"]) / scored

        grad_fn = nnx.value_and_grad(weighted_loss, argnums=nnx.DiffState(0, self.wrt))
        loss, grads = jnp.zeros((), jnp.float32), None
        for index in range(self.accumulate):  # unrolled: nnx threads the dropout keys through
            micro = {name: array[index] for name, array in micro_batches.items()}
            value, step_grads = grad_fn(module, micro)
            loss = loss + value
            grads = step_grads if grads is None else jax.tree.map(jnp.add, grads, step_grads)
        optimizer.update(module, grads)
        return nnx.state((module, optimizer)), loss


def scored_tokens(labels: jax.Array) -> jax.Array:
    """How many tokens a causal LM loss averages over: labels after the first column, not ignored."""
    return jnp.sum(labels[:, 1:] != IGNORE).astype(jnp.float32)


def _own_weights(module: Any) -> None:
    """Give every CPU weight a buffer of XLA's own, one weight at a time, releasing the loaded one.

    On CPU the loader's arrays are the very bytes it read from the checkpoint, a buffer XLA did not
    allocate and so cannot reuse for the step's donated output: the first step would copy every weight
    while the loaded ones still live, a peak of one more copy of the model in both full and LoRA
    training. The loaded model's arrays go the way the step's donation sends them anyway; ``step``
    gives it the trained ones.
    """
    copies: dict[int, jax.Array] = {}  # by the loaded array's id: one weight under two names
    loaded_arrays = []  # keeps each id taken until the loop ends
    for name, variable in module.weights.items():
        loaded = variable.get_value()
        if not isinstance(loaded, jax.Array) or {d.platform for d in loaded.devices()} != {"cpu"}:
            continue
        if id(loaded) not in copies:
            copies[id(loaded)] = jnp.copy(loaded)
            loaded_arrays.append(loaded)
        variable.set_value(copies[id(loaded)])
        module.model.params[name] = copies[id(loaded)]
        loaded.delete()


def _committed(mesh: Any, value: Any) -> Any:
    """``value`` committed to its devices; on a mesh, a value on one device whole on every device."""
    if not isinstance(value, jax.Array):
        return value
    if mesh is not None and len(value.sharding.device_set) == 1 and mesh.size > 1:
        return jax.device_put(value, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return jax.device_put(value, value.sharding)
