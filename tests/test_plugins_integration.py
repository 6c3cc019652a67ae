"""Plugins in a full install: a broken one is reported and skipped while the real backend keeps working."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import hfax
from hfax.cli import app
from hfax.plugins import PluginLoadError, PluginLoadWarning
from hfax.testing import installed_distribution

BROKEN = "raise ImportError('this plugin is broken on purpose')\n"


@pytest.fixture
def broken_plugin(tmp_path):
    modules = {"hfax_broken_plugin": BROKEN}
    with installed_distribution(
        tmp_path / "broken", "hfax-broken", {"broken": "hfax_broken_plugin"}, modules
    ):
        yield


def test_broken_plugin_does_not_stop_automodel(tiny_llama, broken_plugin, monkeypatch):
    path, reference = tiny_llama
    monkeypatch.delenv("HFAX_STRICT_PLUGINS", raising=False)
    input_ids = np.array([[1, 5, 9, 33, 2, 7]], dtype=np.int64)
    with pytest.warns(PluginLoadWarning, match="'broken' from distribution 'hfax-broken'"):
        model = hfax.AutoModelForTPU.from_pretrained(str(path), backend="jax")
    logits = np.asarray(model(input_ids=input_ids).logits)

    with torch.no_grad():
        expected = reference(input_ids=torch.from_numpy(input_ids)).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)

    listing = CliRunner().invoke(app, ["plugins"]).output
    rows = {
        line.split()[0]: line.split()
        for line in listing.splitlines()
        if line and not line.startswith(" ")
    }
    assert rows["broken"][1:4] == ["hfax-broken", "0.0.0", "failed"]
    assert "ImportError: this plugin is broken on purpose" in listing
    assert "backend jax" in listing
    assert all(row[3] in ("builtin", "loaded") for name, row in rows.items() if name != "broken")


def test_strict_mode_refuses_to_run_with_a_broken_plugin(tiny_llama, broken_plugin, monkeypatch):
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="HFAX_BLOCK_PLUGINS=hfax-broken:broken"):
        hfax.AutoModelForTPU.from_pretrained(str(tiny_llama[0]), backend="jax")


def test_blocking_the_broken_plugin_runs_strict(tiny_llama, broken_plugin, monkeypatch):
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "broken")
    model = hfax.AutoModelForTPU.from_pretrained(str(tiny_llama[0]), backend="jax")
    assert model(input_ids=np.array([[1, 2, 3]])).logits.shape == (1, 3, 128)
