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
    """A 2-layer random Llama saved to a folder, and the PyTorch reference loaded back from it."""
    import transformers

    from hfax.testing import save_tiny

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    path = tmp_path / "tiny-llama"
    return path, save_tiny(config, path)
