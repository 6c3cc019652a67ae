import os

# Before jax is imported anywhere: eight CPU devices for sharding tests, strict plugins.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HFAX_STRICT_PLUGINS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """``tiny(name, auto_class)`` -> (checkpoint dir, PyTorch reference model, hfax JAX model), built once."""
    from hfax.testing import tiny_models

    return tiny_models(tmp_path_factory.mktemp, backend="jax")
