"""Model inputs whose values fix shapes, which compiled programs hold as constants.

A VLM's image sizes (Qwen2-VL's ``image_grid_thw``, LLaVA-NeXT's ``image_sizes``, Idefics3's
``pixel_attention_mask``) decide how many patches each image has: the model reads them in Python
(``grid_thw.tolist()``) to build shapes. Traced, they would have no values to read; as constants they key the
program, so images of the same size share one program and a new size compiles a new one. Inside
:func:`folding`, what the model computes from constants alone is computed while tracing, as its Python needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

#: Integer inputs that hold per-token values or labels, never sizes, whatever their shape (and any ``*_ids``).
NOT_SIZES = frozenset(
    {"attention_mask", "decoder_attention_mask", "encoder_attention_mask", "labels", "cache_position",
     "head_mask", "decoder_head_mask", "cross_attn_head_mask"}
)  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class Constant:
    """A model input held by the program (hashable by value: part of the program's static key)."""

    name: str
    value: np.ndarray

    def _key(self) -> tuple[Any, ...]:
        return (self.name, self.value.dtype.str, self.value.shape, self.value.tobytes())

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self._key() == other._key()

    def __repr__(
        self,
    ) -> str:  # whole, as the on-disk program cache keys by it (numpy's repr elides)
        digest = hashlib.sha256(self.value.tobytes()).hexdigest()[:16]
        return f"Constant({self.name}, {self.value.dtype}{list(self.value.shape)}, {digest})"

    def array(self) -> jax.Array:
        """The value as a concrete JAX array, also while tracing."""
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self.value)


def is_size(name: str, value: Any, ids_shape: tuple[int, ...] | None) -> bool:
    """Whether the input ``name`` describes sizes: integers or booleans not laid out like the prompt's ids
    (``ids_shape``), and not per-token values by name."""
    if hasattr(value, "is_floating_point"):  # a torch tensor
        integral = not (value.is_floating_point() or value.is_complex())
    else:
        dtype = np.asarray(value).dtype if not hasattr(value, "dtype") else value.dtype
        integral = np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_)
    per_token = name in NOT_SIZES or name.endswith("_ids")
    return integral and not per_token and tuple(np.shape(value)) != tuple(ids_shape or ())


@contextlib.contextmanager
def folding(active: bool) -> Iterator[None]:
    """While tracing with constants: operations on concrete values run at once (see the module docstring)."""
    if not active:
        yield
        return
    with jax.ensure_compile_time_eval():
        yield
