"""hfax's first-party families installed together: loaded from their distributions, claims that never
collide, and patches that only apply on the transformers versions they were tested with."""

from __future__ import annotations

import sys

import pytest
import transformers

import hfax
from hfax.auto import UntestedVersionWarning, check_family_version
from hfax.plugins import families, plugin_infos, reset_plugins
from hfax.testing import assert_same_logits, save_tiny, tiny_config

FAMILIES = {"llama": "hfax-patches-llama", "gemma": "hfax-patches-gemma"}
#: Each family's tiny config (hfax.testing's): Llama's, and Gemma 3's text model.
CONFIGS = {"llama": lambda: tiny_config("llama"), "gemma": lambda: tiny_config("gemma3")}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_loaded_from_its_distribution(family):
    info = next(info for info in plugin_infos() if info.name == family)
    assert (info.distribution, info.status, info.families) == (
        FAMILIES[family],
        "loaded",
        (family,),
    )


def test_every_claimed_model_type_goes_to_exactly_its_family():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # the dedicated families beside hfax-patches-longtail's, one per architecture of the long tail
    claimed = {
        model_type: name for name, spec in families().items() for model_type in spec.model_types
    }
    assert set(FAMILIES) <= set(claimed.values())
    # A family may claim an architecture that only newer releases of the tested range have (kolibri1_1
    # from 5.25 on); the pinned release, the newest, has every one.
    absent = sorted(model_type for model_type in claimed if model_type not in CONFIG_MAPPING)
    if transformers.__version__ == pinned_transformers():
        assert not absent, f"transformers {transformers.__version__} has no model types {absent}"
    for model_type, family in claimed.items():
        if model_type in absent:
            continue
        assert (
            hfax.detect_family(CONFIG_MAPPING[model_type]()) == family
        )  # no PluginConflictError either
    assert hfax.detect_family(transformers.GPT2Config()) == "generic"


def pinned_transformers() -> str:
    """The transformers release constraints.txt pins, which the full suites run on."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / "constraints.txt").read_text().splitlines()
    (pinned,) = [line.split("==")[1] for line in lines if line.startswith("transformers==")]
    return pinned.strip()


@pytest.mark.parametrize("family", FAMILIES)
def test_untested_transformers_versions_warn_and_strict_mode_raises(family, monkeypatch):
    check_family_version(family)  # the installed transformers is a tested one: silent
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.99.0")
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "0")
    with pytest.warns(
        UntestedVersionWarning, match=rf"family '{family}' was tested with transformers>=5.23,<5.26"
    ):
        check_family_version(family)
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    with pytest.raises(RuntimeError, match=f"family '{family}'"):
        check_family_version(family)


def test_declared_ranges_say_what_ci_tests():
    # Every pyproject that names transformers declares the same range, whose lower bound is what the
    # `transformers_oldest` session installs; every family's tested range (and hfax-core's own, the generic
    # family's) starts there and holds the pinned release, which the full suites run on.
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    root = Path(__file__).resolve().parents[1]
    declared = {}
    for path in sorted(root.glob("packages/*/pyproject.toml")):
        for spec in tomllib.loads(path.read_text())["project"]["dependencies"]:
            if Requirement(spec).name == "transformers":
                declared[path.parent.name] = str(Requirement(spec).specifier)
    assert set(declared) >= {"hfax-core", *FAMILIES.values()}
    assert len(set(declared.values())) == 1, declared
    (oldest,) = [s.version for s in SpecifierSet(declared["hfax-core"]) if s.operator == ">="]
    pinned = pinned_transformers()
    xla_pins = (root / "constraints-torchxla.txt").read_text()
    assert f"transformers=={pinned} " in xla_pins  # both stacks run the full suites on one release
    for name, spec in families().items():
        tested = SpecifierSet(spec.transformers)
        assert oldest in tested and pinned in tested, (name, spec.transformers)
        assert [s.version for s in tested if s.operator == ">="] == [oldest], (
            name,
            spec.transformers,
        )


def test_an_untested_version_stops_loading_before_any_weight_in_strict_mode(monkeypatch, tmp_path):
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.99.0")
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    transformers.LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    ).save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="family 'llama' was tested with"):
        hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batches_match_pytorch_with_and_without_the_attention_patch(
    family, tmp_path, monkeypatch
):
    """Both families switch JAX attention to `hfax_jax`; blocked, transformers' default (sdpa) runs through
    hfax-jax's lowering, which gives the padding queries that see no key zeros (as PyTorch does) instead of
    NaN. Both must give PyTorch's logits for a left-padded batch."""
    reference = save_tiny(CONFIGS[family](), tmp_path)
    prompts = [[5, 17, 33], [5, 17, 33, 2, 99, 64, 7, 8]]
    patched = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    assert (patched.family, patched.config._attn_implementation) == (family, "hfax_jax")
    assert_same_logits(patched, reference, prompts)
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", family)
    reset_plugins()
    generic = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    assert (generic.family, generic.config._attn_implementation) == ("generic", "sdpa")
    assert_same_logits(generic, reference, prompts)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_families_keep_transformers_sharding_plan(family):
    """No family answers hfax_sharding_plan: transformers' tp_plan, hfax-core's default, already fits them."""
    import torch

    from hfax import _builtin

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family]())
    plan = hfax.get_plugin_manager().hook.hfax_sharding_plan(
        model=model, config=model.config, family=family
    )
    assert plan == _builtin.hfax_sharding_plan(model=model, config=model.config, family=family)
    assert plan.spec_for("model.layers.0.self_attn.q_proj.weight", 2) == ("model", None)
    assert plan.spec_for("model.layers.0.mlp.down_proj.weight", 2) == (None, "model")
    assert plan.spec_for("model.embed_tokens.weight", 2) == (
        "model",
        None,
    )  # the vocabulary, shared by lm_head
