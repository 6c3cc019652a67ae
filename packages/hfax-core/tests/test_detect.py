"""Which family runs a model: claims, priorities, conflicts and the generic path."""

from __future__ import annotations

import pytest
import transformers

import hfax
from hfax.plugins import GENERIC_FAMILY, PluginConflictError


@pytest.fixture(autouse=True)
def only_test_plugins(monkeypatch):
    """Load only the plugins these tests install, whatever else is installed beside core."""
    monkeypatch.setenv("HFAX_PLUGINS", "a,b,c")


def test_unclaimed_config_runs_generic(install, family_plugin):
    install("hfax-a", {"a": "a_family"}, {"a_family": family_plugin("fam_a")})
    assert hfax.detect_family(transformers.GPT2Config()) == GENERIC_FAMILY == "generic"


def test_no_plugins_at_all_runs_generic(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")
    assert hfax.detect_family(transformers.LlamaConfig()) == "generic"


def test_equal_claims_by_different_families_are_rejected(install, family_plugin):
    install("hfax-a", {"a": "a_family"}, {"a_family": family_plugin("fam_a")})
    install("hfax-b", {"b": "b_family"}, {"b_family": family_plugin("fam_b")})
    with pytest.raises(PluginConflictError) as raised:
        hfax.detect_family(transformers.LlamaConfig())
    message = str(raised.value)
    assert "'llama'" in message
    assert "'fam_a' (plugin 'hfax-a:a')" in message and "'fam_b' (plugin 'hfax-b:b')" in message
    assert "HFAX_BLOCK_PLUGINS" in message and "hfax.Claim" in message


@pytest.mark.parametrize("winner_first", [True, False])
def test_higher_priority_claim_wins_whatever_the_order(install, family_plugin, winner_first):
    winner = family_plugin("special", claim="hfax.Claim('special', priority=10)")
    loser = family_plugin("plain")
    # Distribution names decide load order; try the winner both first and last.
    install("hfax-a", {"a": "a_family"}, {"a_family": winner if winner_first else loser})
    install("hfax-b", {"b": "b_family"}, {"b_family": loser if winner_first else winner})
    install("hfax-c", {"c": "c_family"}, {"c_family": family_plugin("other_plain")})
    assert hfax.detect_family(transformers.LlamaConfig()) == "special"


def test_two_plugins_claiming_the_same_family_agree(install, family_plugin):
    install("hfax-a", {"a": "a_family"}, {"a_family": family_plugin("shared")})
    install("hfax-b", {"b": "b_family"}, {"b_family": family_plugin("shared")})
    assert hfax.detect_family(transformers.LlamaConfig()) == "shared"


def test_claim_hook_may_take_no_arguments(install):
    source = """
        import hfax

        @hfax.hookimpl
        def hfax_detect_model():
            return "always"
    """
    install("hfax-a", {"a": "a_always"}, {"a_always": source})
    assert hfax.detect_family(transformers.GPT2Config()) == "always"
