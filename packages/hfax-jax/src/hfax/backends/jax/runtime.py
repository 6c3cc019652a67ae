"""The torchax environment hfax runs torch code in, and conversions between torch and JAX values."""

from __future__ import annotations

import functools
from typing import Any

import jax

from hfax.backends.jax import lowerings
from hfax.backends.jax._torchax_compat import import_torchax

torchax = import_torchax()  # the only import of torchax in hfax: it must go through the bridge


@functools.cache
def env() -> Any:
    """torchax's environment: inside ``with env():`` torch operations on torchax tensors run as JAX."""
    environment = torchax.default_env()
    lowerings.install(environment, torchax.tensor.Tensor, torchax.view.View)
    return environment


def to_tensor(tree: Any) -> Any:
    """JAX arrays (concrete or traced) anywhere in ``tree`` as torchax tensors."""
    return env().j2t_iso(tree)


def to_array(tensor: Any) -> jax.Array:
    """A torchax tensor's JAX array."""
    return env().t2j_iso(tensor)
