"""The long-tail families as plugins: one per entry point, each claiming below a dedicated family, patching
the models whose configs hold its model types, blocked by its name; and neither hfax-core nor a backend
naming any of them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

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
    assert {"xlm", "xlnet", "git"} <= {info.name for info in infos} and len(infos) >= 25
    for info in infos:
        assert (info.status, info.families) == ("loaded", (info.name,)), info
    for name, spec in longtail_families().items():
        assert spec.model_types and spec.transformers == ">=5.23,<5.26", name
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


def bound(model, class_name, method="forward"):
    """Whether hfax patched ``method`` of ``model``'s modules of class ``class_name`` (there are some)."""
    modules = [module for module in model.modules() if type(module).__name__ == class_name]
    assert modules, class_name
    return all(method in vars(module) for module in modules)


def patched(config, auto="AutoModelForCausalLM", backend="none"):
    """A model of ``config`` (on the meta device) after every plugin's ``hfax_patch_model`` for
    ``backend``."""
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(config)
    plugins.get_plugin_manager().hook.hfax_patch_model(
        model=model, family=hfax.detect_family(config), backend=backend, patcher=Patcher(model)
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


XLNET = transformers.XLNetConfig(d_model=32, n_layer=1, n_head=4, d_inner=64, vocab_size=64)
GIT = transformers.GitConfig(
    vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                   "num_attention_heads": 4, "image_size": 32, "patch_size": 16},
    vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
)  # fmt: skip
XLM = transformers.XLMConfig(vocab_size=64, emb_dim=32, n_layers=1, n_heads=4)


def torch_xla_patches():
    """Whether XLNet's memory, GIT's model and XLM's lengths are patched, for torch_xla."""
    return (
        bound(patched(XLNET, backend="torch_xla"), "XLNetModel", "cache_mem"),
        bound(patched(GIT, backend="torch_xla"), "GitModel"),
        bound(patched(XLM, "AutoModelForMaskedLM", backend="torch_xla"), "XLMModel"),
    )


@pytest.mark.parametrize(
    ("blocked", "expected"),
    [(None, (True, True, True)), ("xlnet", (False, True, True)), ("git", (True, False, True)),
     ("xlm", (True, True, False))],
)  # fmt: skip
def test_blocking_xlnet_git_or_xlm_drops_exactly_its_patch(fresh_plugins, blocked, expected):
    if blocked:
        fresh_plugins.setenv("HFAX_BLOCK_PLUGINS", blocked)
    plugins.reset_plugins()
    assert hfax.detect_family(XLNET) == ("generic" if blocked == "xlnet" else "xlnet")
    assert torch_xla_patches() == expected


def test_xlnet_and_git_patch_on_torch_xla_alone_and_xlm_everywhere():
    # torch_xla refuses XLNet's slice and GIT's branch on a tensor count; JAX runs transformers' code.
    assert not bound(patched(XLNET, backend="jax"), "XLNetModel", "cache_mem")
    assert not bound(patched(GIT, backend="jax"), "GitModel")
    assert bound(patched(XLM, "AutoModelForMaskedLM", backend="jax"), "XLMModel")


#: The distributions that serve every model, and the package each puts into the ``hfax`` namespace.
THIN = {
    "hfax-core": "hfax",
    "hfax-jax": "hfax.backends.jax",
    "hfax-torchxla": "hfax.backends.torchxla",
}


def sources(distribution):
    """The ``.py`` files of ``distribution``'s package: as the distribution records them (installed from
    a wheel, the hfax folder also holds the other distributions of the namespace), or, from an editable
    install, which records none, its package's folders (hfax-core's hfax folder is its own alone)."""
    package = THIN[distribution]
    relative = package.replace(".", "/")
    recorded = [
        Path(file.locate())
        for file in importlib.metadata.files(distribution) or []
        if file.suffix == ".py" and file.as_posix().startswith(relative + "/")
    ]
    if recorded:
        return recorded
    folders = importlib.util.find_spec(package).submodule_search_locations or []
    return [path for folder in folders for path in Path(folder).rglob("*.py")]


def always_tuple(names):
    """A mapping's value: one class name or several."""
    return (names,) if isinstance(names, str) else tuple(names)


@pytest.mark.parametrize("distribution", sorted(THIN))
def test_core_and_the_backends_name_no_long_tail_model_type(distribution):
    # hfax-core and the backends hold what serves every model: a long-tail family's model type or one of
    # transformers' classes for it (an identifier or a string) in their source would be a branch or table
    # for one architecture, which belongs in the family's plugin.
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed")
    types = sorted({t for spec in longtail_families().values() for t in spec.model_types})
    assert {"prophetnet", "xlm", "flaubert", "xlnet", "git", "whisper"} <= set(types)
    classes = {
        name
        for key, mapping in vars(modeling_auto).items()
        if key.endswith("_MAPPING_NAMES")
        for model_type in types
        for name in always_tuple(mapping.get(model_type, ()))
    }
    assert {"XLMModel", "FlaubertModel", "XLNetModel", "GitModel"} <= classes
    # a model type between non-alphanumerics: "bart", transformers.models.bart, bart_classifier; a class
    # name whole: "XLMModel"
    pattern = re.compile(
        r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, types)) + r")(?![A-Za-z0-9])"
        r"|(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, sorted(classes))) + r")(?![A-Za-z0-9_])"
    )
    paths = sources(distribution)
    assert {"auto.py", "plugin.py"} & {path.name for path in paths}, paths
    found = [
        f"{path}:{number}: {line.strip()}"
        for path in sorted(paths)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, f"{distribution} names long-tail architectures:\n" + "\n".join(found)


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
