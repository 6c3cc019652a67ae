"""The generate conformance suite (:mod:`hfax.testing.conformance`) on the JAX backend: every case."""

from hfax.testing.conformance import *  # noqa: F403 (pytest collects the suite's tests and hooks)

BACKEND = "jax"
