"""A family plugin from outside hfax, built and installed by pip from tests/plugins/, is found and used."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

import hfax
from hfax.plugins import plugin_infos, reset_plugins

EXAMPLE = Path(__file__).parent / "plugins" / "hfax-patches-example"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pip builds the example (its pyproject, its entry point) and installs it into a folder put on sys.path."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(EXAMPLE),
        ],
        check=True,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    reset_plugins()
    yield
    sys.path.remove(str(target))
    sys.modules.pop("hfax_patches_example", None)
    importlib.invalidate_caches()
    reset_plugins()


def test_the_example_family_is_listed(installed):
    info = next(info for info in plugin_infos() if info.name == "example")
    assert (info.distribution, info.status, info.families) == (
        "hfax-patches-example",
        "loaded",
        ("example",),
    )


def test_the_example_family_detects_and_patches_its_model(installed, tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    assert hfax.detect_family(config) == "example"
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    assert model.family == "example"
    assert model.module.patched_by_example == "jax"
    hfax.unpatch(model.module)
    assert not hasattr(model.module, "patched_by_example")
