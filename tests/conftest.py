"""Cross-package tests: every package installed together (the `integration` nox session)."""

from __future__ import annotations

from typing import Iterator

import pytest

from hfax.plugins import reset_plugins


@pytest.fixture(autouse=True)
def fresh_plugins() -> Iterator[None]:
    """Each test loads plugins afresh, under the switches it sets, and leaves none loaded behind."""
    reset_plugins()
    yield
    reset_plugins()


@pytest.fixture
def tiny_llama(tmp_path):
    """hfax.testing's tiny Llama saved to a folder, and the PyTorch reference loaded back from it."""
    from hfax.testing import save_tiny, tiny_config

    path = tmp_path / "tiny-llama"
    return path, save_tiny(tiny_config("llama"), path)
