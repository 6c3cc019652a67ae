"""The fixtures themselves: every name is reachable from ``hfax.testing``, the configs are tiny, and importing
them pulls neither torch nor jax (the torch_xla environment's torch is another release)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import hfax.testing
from hfax.testing import shrunk_config, tiny_config

#: The fixture modules. The conformance suites (``conformance``, ``multimodal_conformance``) are test
#: modules a backend's tests import whole, not fixtures the package re-exports.
MODULES = [
    importlib.import_module(f"hfax.testing.{info.name}")
    for info in pkgutil.iter_modules(hfax.testing.__path__)
    if not info.name.endswith("conformance")
]


def test_every_public_name_is_reachable_from_the_package():
    defined = {
        name
        for module in MODULES
        if module.__name__
        != "hfax.testing.shrink"  # its sizes are reached as hfax.testing.shrink.VOCAB
        for name, value in vars(module).items()
        if not name.startswith("_")
        and getattr(value, "__module__", module.__name__) == module.__name__
        and not isinstance(value, type(sys))
        and name != "annotations"
    }
    assert defined | {"shrunk_config"} == set(hfax.testing.__all__)


@pytest.mark.parametrize(
    "name",
    ["llama", "gemma", "mistral", "gemma2", "gemma3", "gpt2", "gpt_neo", "moshi", "mamba", "bert"],
)
def test_named_configs_have_two_layers(name):
    assert tiny_config(name).num_hidden_layers == 2


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "t5", "mixtral", "qwen2_vl"])
def test_shrunk_configs_are_tiny(model_type):
    config = shrunk_config(model_type)
    text = config.get_text_config()
    assert text.num_hidden_layers == 2 and text.hidden_size <= 64 and text.vocab_size <= 256


def test_importing_the_fixtures_imports_neither_torch_nor_jax():
    code = "import sys, hfax.testing; print(sorted({'torch', 'jax'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
