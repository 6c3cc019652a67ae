import os

# Before torch_xla is imported anywhere: its CPU client, strict plugins.
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("HFAX_STRICT_PLUGINS", "1")
# The tests build dozens of tiny models, whose programs are small: far more of them fit in host memory than
# of the 134M model the default budget is set for. The budget's own test lowers it.
os.environ.setdefault("HFAX_TORCHXLA_COMPILE_BUDGET", "1000")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def hfax_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """hfax's cache in a folder of the run, set before any test starts torch_xla's runtime (which fixes its
    persistent cache folder once per process), whichever file runs first."""
    os.environ.setdefault("HFAX_CACHE", str(tmp_path_factory.mktemp("hfax-cache")))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """``tiny(name, auto_class)`` -> (checkpoint dir, PyTorch reference model, hfax PyTorch/XLA model), built once."""
    from hfax.testing import tiny_models

    return tiny_models(tmp_path_factory.mktemp, backend="torch_xla")
