"""A checkpoint with its own code (``auto_map``): built with ``trust_remote_code=True``, never without."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch
import transformers

import hfax

CONFIGURATION = """
import os

from transformers import GPT2Config

with open(os.environ["HFAX_REMOTE_CODE_RAN"], "a") as mark:  # proof that this code ran
    mark.write("ran\\n")


class ProbeConfig(GPT2Config):
    model_type = "hfax-remote-probe"
"""

MODELING = """
from transformers import GPT2LMHeadModel

from .configuration_probe import ProbeConfig


class ProbeForCausalLM(GPT2LMHeadModel):
    config_class = ProbeConfig
"""


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A GPT-2 checkpoint re-labelled as a custom model type whose classes live in its folder."""
    folder = (
        tmp_path / f"probe{uuid.uuid4().hex[:8]}"
    )  # transformers imports remote code once per name
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    (folder / "configuration_probe.py").write_text(CONFIGURATION)
    (folder / "modeling_probe.py").write_text(MODELING)
    saved = json.loads((folder / "config.json").read_text())
    saved.update(
        model_type="hfax-remote-probe",
        architectures=["ProbeForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_probe.ProbeConfig",
            "AutoModelForCausalLM": "modeling_probe.ProbeForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(saved))
    monkeypatch.setenv("HFAX_REMOTE_CODE_RAN", str(tmp_path / "ran"))
    return folder


def test_without_the_flag_no_remote_code_runs(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", None)  # transformers must not ask [y/N]
    with pytest.raises(ValueError, match="trust_remote_code"):
        hfax.AutoModelForTPU.from_pretrained(str(checkpoint), backend="jax")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("auto", ["AutoModelForTPU", "AutoModelForCausalLM"])
def test_with_the_flag_the_checkpoints_own_model_runs(checkpoint, tmp_path, monkeypatch, auto):
    monkeypatch.setattr("sys.stdin", None)
    model = getattr(hfax, auto).from_pretrained(
        str(checkpoint), backend="jax", trust_remote_code=True
    )
    assert type(model.module).__name__ == "ProbeForCausalLM"
    assert (tmp_path / "ran").exists()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, trust_remote_code=True
    ).eval()
    ids = np.array([[1, 5, 9, 3]])
    expected = reference(torch.tensor(ids)).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model(ids).logits), expected, atol=1e-4)


def test_an_architecture_that_is_not_a_model_class_is_named(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "architectures": ["pipeline"]}))
    with pytest.raises(ValueError, match="'pipeline', which is not a transformers model class"):
        hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
