"""The long-tail families as plugins: one per entry point, each claiming below a dedicated family, patching
the models whose configs hold its model types, blocked by its name; and hfax-core naming none of them."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
import torch
import transformers

import hfax
from hfax import plugins
from hfax.patches.longtail.family import model_types
from hfax.patching import Patcher
from hfax.testing import bert2bert_config, prophetnet_config, reformer_config

DISTRIBUTION = "hfax-patches-longtail"


def longtail_families():
    names = {
        family
        for info in plugins.plugin_infos()
        if info.distribution == DISTRIBUTION
        for family in info.families
    }
    return {name: spec for name, spec in plugins.families().items() if name in names}


def test_each_entry_point_is_one_loaded_family():
    infos = [info for info in plugins.plugin_infos() if info.distribution == DISTRIBUTION]
    assert len(infos) >= 23
    for info in infos:
        assert (info.status, info.families) == ("loaded", (info.name,)), info
    for name, spec in longtail_families().items():
        assert spec.model_types and spec.transformers == ">=5.23,<5.25", name
        for model_type in spec.model_types:  # each claims its own model types
            config = transformers.AutoConfig.for_model(model_type)
            assert hfax.detect_family(config) == name


def test_a_dedicated_family_outranks_a_long_tail_claim(fresh_plugins):
    class Dedicated:
        @hfax.hookimpl
        def hfax_detect_model(self, config):
            return "my-prophetnet" if config.model_type == "prophetnet" else None

    config = transformers.ProphetNetConfig()
    assert hfax.detect_family(config) == "prophetnet"
    plugins.register(Dedicated(), name="dedicated")
    assert hfax.detect_family(config) == "my-prophetnet"


def test_model_types_are_read_from_sub_configs():
    assert model_types(bert2bert_config(0)) == {"encoder-decoder", "bert"}
    vision = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.ViTConfig(), transformers.TrOCRConfig()
    )
    assert {"vision-encoder-decoder", "vit", "trocr"} <= model_types(vision)


def bound(model, class_name):
    """Whether hfax patched the forward of ``model``'s modules of class ``class_name`` (there are some)."""
    modules = [module for module in model.modules() if type(module).__name__ == class_name]
    assert modules, class_name
    return all("forward" in vars(module) for module in modules)


def patched(config, auto="AutoModelForCausalLM"):
    """A model of ``config`` (on the meta device) after every plugin's ``hfax_patch_model``."""
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(config)
    plugins.get_plugin_manager().hook.hfax_patch_model(
        model=model, family=hfax.detect_family(config), backend="none", patcher=Patcher(model)
    )
    return model


@pytest.mark.parametrize("blocked", [None, "prophetnet", "hfax-patches-longtail:prophetnet"])
def test_blocking_one_family_drops_exactly_its_patches(fresh_plugins, blocked):
    if blocked:
        fresh_plugins.setenv("HFAX_BLOCK_PLUGINS", blocked)
    plugins.reset_plugins()
    prophetnet = patched(prophetnet_config())
    expected = blocked is None
    for name in (
        "ProphetNetDecoder",
        "ProphetNetPositionalEmbeddings",
        "ProphetNetNgramSelfAttention",
    ):
        assert bound(prophetnet, name) is expected, name
    assert bound(patched(reformer_config()), "AxialPositionEmbeddings")
    # A BERT decoder inside an encoder-decoder model: patched by the family of its sub-config.
    bert2bert = patched(bert2bert_config(0), "AutoModelForSeq2SeqLM")
    assert hfax.detect_family(bert2bert.config) == "generic" and bound(bert2bert, "BertEmbeddings")


def test_hfax_core_names_no_long_tail_model_type():
    # hfax-core holds what serves every model: a long-tail family's model type (an identifier or a string)
    # in its source would be a branch or table for one architecture, which belongs in the family's plugin.
    types = sorted({t for spec in longtail_families().values() for t in spec.model_types})
    assert {"prophetnet", "gpt_neo", "recurrent_gemma", "xlm", "flaubert", "whisper"} <= set(types)
    # a model type between non-alphanumerics: "bart", transformers.models.bart, bart_classifier
    pattern = re.compile(
        r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, types)) + r")(?![A-Za-z0-9])"
    )
    # hfax-core's own files, as its distribution records them: installed from a wheel, the hfax folder also
    # holds the other distributions of the namespace (this one among them).
    sources = [
        Path(file.locate())
        for file in importlib.metadata.files("hfax-core") or []
        if file.suffix == ".py" and file.parts[0] == "hfax"
    ]
    if not sources:  # an editable install records no sources: its hfax folder is hfax-core's alone
        core = Path(hfax.__file__).parent
        sources = list(core.rglob("*.py"))
    assert any(path.name == "auto.py" for path in sources), sources
    found = [
        f"{path}:{number}: {line.strip()}"
        for path in sorted(sources)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "hfax-core names long-tail architectures:\n" + "\n".join(found)


def on_meta(config, model_class):
    """A model of ``model_class`` (a transformers class name) for ``config``, on the meta device."""
    with torch.device("meta"):
        return getattr(transformers, model_class)(config)


def test_generation_traits_of_the_families(fresh_plugins):
    # What generate learns from the families that hold no patch: GPT-Neo's window, RecurrentGemma's state
    # outside the cache, XLM's appended token (a causal XLM refused), Whisper's prompt and options.
    from hfax.generation.shapes import no_static_cache
    from hfax.generation.traits import Appended, generation_traits
    from hfax.patches.longtail import whisper

    neo = transformers.GPTNeoConfig(
        num_layers=2, attention_types=[[["global", "local"], 1]], window_size=40
    )
    gpt_neo = on_meta(neo, "GPTNeoForCausalLM")
    assert no_static_cache(gpt_neo, 32) == "" and "window_size 40" in no_static_cache(gpt_neo, 64)
    assert "conv1d_state" in no_static_cache(
        on_meta(transformers.RecurrentGemmaConfig(), "RecurrentGemmaForCausalLM"), 16
    )
    xlm = transformers.XLMConfig(mask_token_id=5, lang_id=1)
    assert generation_traits(on_meta(xlm, "XLMWithLMHeadModel")).appended == Appended(5, 1)
    with pytest.raises(NotImplementedError, match="XLMWithLMHeadModel with causal=True"):
        generation_traits(on_meta(transformers.XLMConfig(causal=True), "XLMWithLMHeadModel"))
    traits = generation_traits(
        on_meta(transformers.WhisperConfig(), "WhisperForConditionalGeneration")
    )
    assert traits.decoder_prompt is whisper.prompt and "language" in traits.options
    assert "prompt_ids" in traits.refused_options
    fresh_plugins.setenv("HFAX_BLOCK_PLUGINS", "xlm")
    plugins.reset_plugins()
    assert generation_traits(on_meta(xlm, "XLMWithLMHeadModel")).appended is None
