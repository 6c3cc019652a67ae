"""Generation, written once for every backend (see :mod:`hfax.generation.driver` for the path of a call).

``settings`` asks transformers what a call means; ``processors``, ``search``, ``beams`` and ``tokens``
are the token choice in torch ops that every backend's compiled loop runs; ``driver`` runs a backend's
engine and ``outputs`` shapes the result as transformers does. Importing this package imports neither
torch nor jax.
"""
