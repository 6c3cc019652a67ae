import os

# Before torch_xla is imported anywhere: its CPU client, strict plugins.
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("HFAX_STRICT_PLUGINS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ.setdefault("HFAX_CACHE", str(tmp_path_factory.mktemp("hfax-cache")))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """``tiny(name, auto_class)`` -> (checkpoint dir, PyTorch reference model, hfax PyTorch/XLA model), built once."""
    from hfax.testing import tiny_models

    return tiny_models(tmp_path_factory.mktemp, backend="torch_xla")
