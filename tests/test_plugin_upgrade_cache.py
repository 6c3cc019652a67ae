"""Upgrading a family plugin never serves the programs its old version traced (programs.py keys them by
each loaded plugin's code): pip installs two versions of a tiny plugin, and a process runs each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

PLUGIN = """
import hfax


def activation(x):
    return {body}


@hfax.hookimpl
def hfax_families():
    return [hfax.FamilySpec("upgraded", model_types=("gpt2",), transformers=">=5.23,<5.26")]


@hfax.hookimpl
def hfax_detect_model(config):
    return "upgraded" if config.model_type == "gpt2" else None


@hfax.hookimpl
def hfax_patch_model(model, family, backend, patcher):
    if family == "upgraded":
        for block in model.transformer.h:
            patcher.setattr(block.mlp.act, "forward", activation)
"""

PYPROJECT = """
[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "hfax-upgrade-probe"
version = "{version}"
requires-python = ">=3.10"

[project.entry-points.hfax]
upgraded = "hfax_upgrade_probe"

[tool.hatch.build.targets.wheel]
packages = ["src/hfax_upgrade_probe"]
"""

SCRIPT = """
import json, sys
import numpy as np, torch, transformers
import hfax, hfax_upgrade_probe

ids = np.array([[1, 5, 9, 3]])
model = hfax.AutoModelForCausalLM.from_pretrained(sys.argv[1], backend="jax")
assert model.family == "upgraded", model.family
code, traces = type(model.module).forward.__code__, []
sys.setprofile(lambda frame, event, _: traces.append(1) if event == "call" and frame.f_code is code else None)
logits = np.asarray(model(ids).logits)
sys.setprofile(None)
reference = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
for block in reference.transformer.h:
    block.mlp.act.forward = hfax_upgrade_probe.activation
expected = reference(torch.tensor(ids)).logits.detach().numpy()
print(json.dumps({"logits": logits.tolist(), "expected": expected.tolist(), "traces": len(traces)}))
"""


def _install(tmp_path, version: str, body: str):
    source = tmp_path / f"src-{version}"
    (source / "src" / "hfax_upgrade_probe").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT.format(version=version))
    (source / "src" / "hfax_upgrade_probe" / "__init__.py").write_text(PLUGIN.format(body=body))
    target = tmp_path / f"site-{version}"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, source],
        check=True,
    )
    return target


@pytest.fixture
def checkpoint(tmp_path):
    import transformers

    from hfax.testing import save_tiny

    save_tiny(
        transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=2, vocab_size=64, bos_token_id=1, eos_token_id=2
        ),
        tmp_path / "m",
    )
    return tmp_path / "m"


def test_an_upgraded_plugin_traces_its_own_program(tmp_path, checkpoint):
    old = _install(tmp_path, "0.1", "x * 0.5")
    new = _install(tmp_path, "0.2", "x * x")  # a changed patch under the same function name

    def run(site) -> dict:
        env = {**os.environ, "HFAX_CACHE": str(tmp_path / "cache"), "HFAX_STRICT_PLUGINS": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
        env.pop("HFAX_NO_COMPILATION_CACHE", None)
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCRIPT), str(checkpoint)],
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run(old)
    assert first["traces"] == 1
    np.testing.assert_allclose(first["logits"], first["expected"], atol=1e-4)
    assert run(old)["traces"] == 0  # the same plugin: its program came from disk
    upgraded = run(new)
    assert upgraded["traces"] == 1
    np.testing.assert_allclose(upgraded["logits"], upgraded["expected"], atol=1e-4)
    assert not np.allclose(upgraded["expected"], first["expected"], atol=1e-3)
