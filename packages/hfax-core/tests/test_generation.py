"""hfax.generation.shapes, hfax.generation.traits and hfax.masks: what every backend's generate shares,
checked without torch or jax."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import transformers

import hfax
from hfax import masks
from hfax.generation import shapes as generation
from hfax.generation.traits import Appended, GenerationTraits, asked_once, generation_traits
from hfax.plugins import PluginConflictError, PluginHookError


def test_pad_prompts_left_right_and_to_a_length():
    ids, mask = np.array([[3, 4, 5]]), np.ones((1, 3), bool)
    left, left_mask = generation.pad_prompts(ids, mask, 0, row_multiple=2)
    assert (
        left.shape == (2, generation.MIN_LENGTH_BUCKET)
        and left[0, -3:].tolist() == [3, 4, 5]
        and left_mask[0, :-3].sum() == 0
    )
    right, _ = generation.pad_prompts(ids, mask, 0, left=False)
    assert right[0, :3].tolist() == [3, 4, 5]
    exact, _ = generation.pad_prompts(ids, mask, 0, length=3)
    assert exact.tolist() == [[3, 4, 5]]
    with pytest.raises(ValueError, match="cannot pad 3 tokens into 2"):
        generation.pad_prompts(ids, mask, 0, length=2)


def test_layer_spans_by_layer_type():
    gemma2 = transformers.Gemma2Config(num_hidden_layers=2, sliding_window=5)
    assert masks.layer_spans(gemma2) == {
        "sliding_attention": masks.Span(window=5),
        "full_attention": masks.Span(),
    }
    llama4 = transformers.Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=8)
    spans = masks.layer_spans(llama4)
    assert (
        spans["chunked_attention"] == masks.Span(chunk=8)
        and spans["full_attention"] == masks.Span()
    )
    assert masks.layer_windows(transformers.MistralConfig(sliding_window=7)) == {
        "full_attention": 7
    }


class TraitsPlugin:
    """A family plugin whose ``hfax_generation_traits`` describes the models of model_type "traited"."""

    def __init__(self, traits):
        self.traits = traits

    @hfax.hookimpl
    def hfax_generation_traits(self, config):
        return self.traits if config.model_type == "traited" else None


class TraitedModel:
    """What generation reads of a transformers model here: its config and its forward's parameters, the
    cache annotated with a ``Cache`` class as transformers' forwards annotate it (so found without torch,
    where the installed release's own name for it cannot be read)."""

    def __init__(self, model_type="traited"):
        self.config = SimpleNamespace(model_type=model_type)

    def forward(self, input_ids, attention_mask=None, cache: Cache | None = None):  # noqa: F821
        raise AssertionError("generation's decisions do not run the model")


def test_a_family_trait_decides_how_generate_decodes():
    # hfax_generation_traits' answers reach generation: a reason against a static cache or a local window
    # makes the model decode without one (warning why), a refusal stops it, and models it does not
    # describe are left alone.
    model, other = TraitedModel(), TraitedModel("plain")
    cache = generation.cache_argument(model, 64)
    assert cache == "cache"
    hfax.register(TraitsPlugin(GenerationTraits(no_static_cache="its state lives elsewhere")), "a")
    with pytest.warns(UserWarning, match="decodes without a cache: its state lives elsewhere"):
        assert generation.cache_argument(model, 64) == ""
    assert generation.cache_argument(other, 64) == cache
    hfax.unregister("a")
    hfax.register(TraitsPlugin(GenerationTraits(local_attention_window=32)), "a")
    assert generation.no_static_cache(model, 32) == ""
    assert "within its window_size 32" in generation.no_static_cache(model, 64)
    hfax.register(TraitsPlugin(GenerationTraits(refused="it cannot; run it elsewhere")), "b")
    with pytest.raises(NotImplementedError, match="it cannot; run it elsewhere"):
        generation.cache_argument(model, 64)


def test_generation_traits_merge_and_conflict():
    model = TraitedModel()
    for name, traits in [
        ("a", GenerationTraits(no_static_cache="one", local_attention_window=8, options=("x",))),
        (
            "b",
            GenerationTraits(no_static_cache="two", local_attention_window=4, options=("x", "y")),
        ),
        ("c", GenerationTraits(appended=Appended(3, None))),
    ]:
        hfax.register(TraitsPlugin(traits), name)
    merged = generation_traits(model)
    assert (merged.no_static_cache, merged.local_attention_window) == ("one; two", 4)
    assert (merged.options, merged.appended) == (("x", "y"), Appended(3, None))
    hfax.register(TraitsPlugin(GenerationTraits(appended=Appended(4, None))), "d")
    with pytest.raises(PluginConflictError, match=r"\['c', 'd'\].*'appended'"):
        generation_traits(model)


class CountingTraitsPlugin(TraitsPlugin):
    """A :class:`TraitsPlugin` that counts the models it was asked about."""

    def __init__(self, traits):
        super().__init__(traits)
        self.asked = []

    @hfax.hookimpl
    def hfax_generation_traits(self, config):
        self.asked.append(config.model_type)
        return self.traits if config.model_type == "traited" else None


def test_one_generate_call_asks_each_models_traits_once():
    # Inside asked_once (each generate call) the plugins answer once per model; outside it, and in the
    # next call, they are asked again, so a plugin registered between calls is heard.
    model, other = TraitedModel(), TraitedModel("plain")
    plugin = CountingTraitsPlugin(GenerationTraits(local_attention_window=8))
    hfax.register(plugin, "counting")
    with asked_once():
        windows = [
            generation_traits(m).local_attention_window for m in (model, model, other, model)
        ]
    assert windows == [8, 8, None, 8] and plugin.asked == ["traited", "plain"]
    with asked_once():
        generation_traits(model)
    generation_traits(model)
    assert plugin.asked == ["traited", "plain", "traited", "traited"]
    hfax.register(TraitsPlugin(GenerationTraits(local_attention_window=4)), "narrower")
    with asked_once():
        assert generation_traits(model).local_attention_window == 4


def test_a_generation_traits_answer_of_another_type_fails_the_call():
    hfax.register(TraitsPlugin("decode without a cache"), "wrong")
    with pytest.raises(PluginHookError, match="hfax_generation_traits returned str"):
        generation_traits(TraitedModel())


def test_attentions_over_a_static_cache_span_its_slots_and_a_rolled_window_is_refused():
    """transformers' attentions over a ``StaticCache`` have a key per slot (zero where nothing is written
    yet), a layer of no fixed length (``-1``) the positions so far; a sliding layer whose window the
    positions outgrew has keys in a rolling order, refused naming the setting to drop."""
    from hfax.generation import layer_outputs

    step0 = (np.ones((1, 2, 3, 3)), np.ones((1, 2, 3, 3)))
    step1 = (np.ones((1, 2, 1, 4)), np.ones((1, 2, 1, 4)))
    extras = {"attentions": (step0, step1), "hidden_states": ((np.ones((1, 3, 8)),),)}
    layer_outputs.over_static_cache(extras, [6, -1])
    assert [a.shape for a in extras["attentions"][1]] == [(1, 2, 1, 6), (1, 2, 1, 4)]
    assert (
        extras["attentions"][0][0][..., 3:].sum() == 0 and extras["attentions"][0][0][..., :3].all()
    )
    assert extras["hidden_states"][0][0].shape == (1, 3, 8)  # not an attention: left as it is
    with pytest.raises(
        NotImplementedError, match="layer 0 keeps 3 slots.*leave cache_implementation"
    ):
        layer_outputs.over_static_cache({"decoder_attentions": (step0, step1)}, [3, 6])
