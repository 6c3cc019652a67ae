"""hfax.signatures against the installed transformers (5.23 spells the cache ``past_key_values`` and
``cache_params``, 5.24 ``cache``): the cache parameter of transformers' own classes is found, whichever
release runs (the ``transformers_oldest`` and ``transformers_newest`` sessions run this file on both ends)."""

from __future__ import annotations

import pytest
import transformers
from packaging.version import Version

from hfax.signatures import cache_parameter, release_cache_name

NEW_NAMES = Version(transformers.__version__) >= Version("5.24.0.dev0")


def test_the_release_names_its_cache_as_generate_passes_it():
    assert release_cache_name() == ("cache" if NEW_NAMES else "past_key_values")


@pytest.mark.parametrize(
    "cls, named_523",
    [
        ("LlamaForCausalLM", "past_key_values"),
        ("MambaForCausalLM", "cache_params"),
        ("BartForConditionalGeneration", "past_key_values"),
        (
            "RobertaForCausalLM",
            "past_key_values",
        ),  # annotated tuple[tuple[Tensor]]: the release's name
        ("GPT2LMHeadModel", "past_key_values"),
    ],
)
def test_each_forward_names_its_cache_whatever_the_release_calls_it(cls, named_523):
    forward = getattr(transformers, cls).forward
    assert cache_parameter(forward) == ("cache" if NEW_NAMES else named_523)
