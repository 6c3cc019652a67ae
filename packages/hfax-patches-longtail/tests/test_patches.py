"""Each long-tail family's patches give transformers' outputs, in PyTorch on the CPU (the backends' own
tests run the same models compiled): a tiny random model, its output before and after the family's patch."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest
import torch
import transformers
from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashExperts

from hfax.patches.longtail import families
from hfax.patching import Patcher
from hfax.testing import (
    bert2bert_config,
    eos_classifier,
    fsmt_config,
    led_config,
    left_padded,
    longformer_batch,
    looping_config,
    prophetnet_config,
    reference_forward,
    reformer_batch,
    spread_weights,
    switch_config,
)
from hfax.validation import CHECK_IDS


def patch(model, family, backend="none"):
    """``model`` patched for ``backend`` by the long-tail family ``family`` alone; fails when nothing was
    patched."""
    patcher = Patcher(model)
    getattr(families, family).hfax_patch_model(model=model, backend=backend, patcher=patcher)
    assert patcher.patched, f"the {family} family patched nothing"
    return model


def tiny(config, auto="AutoModelForCausalLM"):
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(config)
    spread_weights(model)
    return model.eval()


def assert_patch_keeps(model, family, backend="none", **inputs):
    """The model's logits for ``inputs`` are the same before and after ``family``'s patch for
    ``backend``."""
    expected = reference_forward(model, **inputs).logits.float().numpy()
    actual = reference_forward(patch(model, family, backend), **inputs).logits.float().numpy()
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)


IDS, MASK = left_padded([[5, 9, 13, 2, 44, 7, 11], [3, 8, 21, 30]])


#: LongCat-Flash's experts loop in Python before transformers 5.25; from 5.25 on the class is under
#: `@use_experts_implementation`, which gives it `_apply_gate` (see the test after this one).
LONGCAT = [] if hasattr(LongcatFlashExperts, "_apply_gate") else ["longcat_flash"]


#: Kolibri 1.1 came with transformers 5.25 (the oldest release of the tested range has no such model).
KOLIBRI = ["kolibri1_1"] if hasattr(transformers, "Kolibri1_1Config") else []


@pytest.mark.parametrize("family", ["dbrx", "jetmoe", *LONGCAT, "qwen4_exp", *KOLIBRI])
def test_static_loops_give_transformers_logits(family):
    # Experts (and Qwen4-Exp's indexer) chosen per batch by a Python loop, replaced by static code.
    model = tiny(looping_config(family))
    assert_patch_keeps(model, family, input_ids=IDS, attention_mask=MASK)


def packed_visible(starts, width, padding=0):
    """``[1, width, width]``: causal attention within documents packed into one row, each starting at one
    of ``starts``, after ``padding`` left-padded keys that nothing sees; queries of the padding see nothing."""
    position = torch.arange(width)
    document = torch.bucketize(position, torch.tensor(starts), right=True)
    visible = (document[:, None] == document[None]) & (position[None] <= position[:, None])
    visible &= (position >= padding)[None] & (position >= padding)[:, None]
    return visible[None]


@pytest.mark.skipif(not KOLIBRI, reason="transformers before 5.25 has no Kolibri 1.1")
@pytest.mark.parametrize("compression, pool, topk", [(2, 4, 2), (3, 6, 3), (4, 8, 2)])
def test_kolibri1_1_indexer_chooses_transformers_keys_without_its_loop(compression, pool, topk):
    # Documents packed into a row give queries different first keys, so different block grids; the
    # integer-valued queries and keys tie scores, which transformers breaks towards earlier keys.
    from transformers.models.kolibri1_1.modeling_kolibri1_1 import Kolibri1_1Indexer

    from hfax.patches.longtail.kolibri1_1 import kolibri1_1_pool, kolibri1_1_tokens

    config = looping_config("kolibri1_1")
    config.index_compression, config.index_pool_size, config.index_topk = compression, pool, topk
    indexer = Kolibri1_1Indexer(config, layer_idx=1)
    width = 23
    visible = torch.cat(
        [
            packed_visible([0], width),
            packed_visible([2, 9, 13], width, padding=2),
            packed_visible([0, 5, 6, 17], width),
        ]
    )
    visible[2, 20, 18] = False  # a masked key between visible ones keeps its position
    generator = torch.Generator().manual_seed(0)
    queries = torch.randint(-2, 3, (3, 4, width, 16), generator=generator).float()
    keys = torch.randint(-2, 3, (3, 2, width, 16), generator=generator).float()
    expected_pool = indexer.select_pool(queries, keys, visible)
    expected = indexer.select_tokens(queries, keys, visible, expected_pool)
    assert (expected_pool != visible).any() and (expected != expected_pool).any()  # both choose
    assert torch.equal(kolibri1_1_pool(indexer, queries, keys, visible), expected_pool)
    assert torch.equal(kolibri1_1_tokens(indexer, queries, keys, visible, expected_pool), expected)
    # a decode step: one query over the row's keys
    last = visible[:, -1:]
    pool = indexer.select_pool(queries[:, :, -1:], keys, last)
    assert torch.equal(kolibri1_1_pool(indexer, queries[:, :, -1:], keys, last), pool)
    assert torch.equal(
        kolibri1_1_tokens(indexer, queries[:, :, -1:], keys, last, pool),
        indexer.select_tokens(queries[:, :, -1:], keys, last, pool),
    )


def test_longcat_flash_experts_under_transformers_experts_interface_are_left_to_core():
    # From transformers 5.25 on, LongCat-Flash's experts layer is under `@use_experts_implementation`
    # (core's generic static path serves it, test_conformance's longcat_flash case checks the tokens); the
    # family binds its own forward only to the older layer, which loops over routed and identity experts.
    model = tiny(looping_config("longcat_flash"))
    experts = [m for m in model.modules() if type(m).__name__ == "LongcatFlashExperts"]
    patcher = Patcher(model)
    families.longcat_flash.hfax_patch_model(model=model, backend="none", patcher=patcher)
    looping = [m for m in experts if hasattr(m, "num_routed_experts")]
    assert experts and [target for target, _ in patcher.patched] == looping


def test_qwen4_exp_decodes_without_a_cache(fresh_plugins):
    # The family's generation traits say so; blocking the family takes them away.
    from hfax import plugins
    from hfax.generation.shapes import no_static_cache

    model = tiny(looping_config("qwen4_exp"))
    assert "its indexer keeps its keys' positions" in no_static_cache(model, 16)
    fresh_plugins.setenv("HFAX_BLOCK_PLUGINS", "qwen4_exp")
    plugins.reset_plugins()
    assert no_static_cache(model, 16) == ""


def test_language_adapters_chosen_per_row():
    inputs = dict(input_ids=IDS[:, :5], lang_ids=np.array([2, 0]))
    assert_patch_keeps(tiny(looping_config("xmod")), "xmod", **inputs)


def test_switch_transformers_experts_and_router():
    model = tiny(switch_config(0), "AutoModelForSeq2SeqLM")
    decoder = np.array([[0, 5, 9, 13], [0, 8, 21, 30]])
    inputs = dict(input_ids=IDS, attention_mask=MASK, decoder_input_ids=decoder)
    assert_patch_keeps(model, "switch_transformers", **inputs)


def test_prophetnet_positions_and_streams_over_its_padding_mask():
    model = tiny(prophetnet_config())
    assert_patch_keeps(model, "prophetnet", input_ids=IDS, attention_mask=MASK)


@pytest.mark.parametrize(
    ("family", "batch", "auto"),
    [
        ("longformer", longformer_batch, "AutoModelForMaskedLM"),
        ("reformer", reformer_batch, "AutoModelForCausalLM"),
    ],
)
def test_static_lookups_give_transformers_logits(tmp_path, family, batch, auto):
    expected, inputs, real = batch(tmp_path)
    model = patch(getattr(transformers, auto).from_pretrained(tmp_path).eval(), family)
    actual = reference_forward(model, **inputs).logits.float().numpy()
    np.testing.assert_allclose(actual[real], expected[real], atol=1e-4, rtol=1e-4)


def test_led_encoder_gives_transformers_logits():
    model = tiny(led_config(0), "AutoModelForSeq2SeqLM")
    ids, mask = left_padded([list(range(5, 22)), list(range(30, 41))])
    decoder = np.array([[2, 5, 9], [2, 8, 21]])
    assert_patch_keeps(model, "led", input_ids=ids, attention_mask=mask, decoder_input_ids=decoder)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_classifiers_pool_the_last_eos_and_check_the_counts(tmp_path, family):
    reference, inputs = eos_classifier(tmp_path, family)
    assert_patch_keeps(reference, family, **inputs)
    eos = reference.config.eos_token_id
    getattr(reference, CHECK_IDS)(np.array([[5, eos, 7, eos], [eos, 6, 7, eos]]))
    with pytest.raises(ValueError, match="same number of <eos> tokens"):
        getattr(reference, CHECK_IDS)(np.array([[5, eos, 7, eos], [5, 6, 7, 8]]))


@pytest.mark.parametrize("config_class", ["XLMConfig", "FlaubertConfig"])
def test_lengths_checked_from_the_rows_widths(config_class):
    # Given a padding mask, XLM's and Flaubert's lengths serve only checks, answered by the rows' widths.
    config = getattr(transformers, config_class)(
        vocab_size=64, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64
    )
    model = tiny(config, "AutoModelForMaskedLM")
    assert_patch_keeps(model, "xlm", input_ids=IDS, attention_mask=MASK)


def test_xlnet_memory_kept_by_a_clamped_slice():
    # mem_len 512 over 7 positions: transformers' x[-512:] clamps in PyTorch; the patch clamps itself.
    config = transformers.XLNetConfig(
        d_model=32, n_layer=2, n_head=4, d_inner=64, vocab_size=64, mem_len=512
    )
    model = tiny(config)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor(IDS), use_mems=True)
        actual = patch(model, "xlnet", "torch_xla")(input_ids=torch.tensor(IDS), use_mems=True)
    torch.testing.assert_close(actual.logits, expected.logits)
    for got, want in zip(actual.mems, expected.mems, strict=True):
        torch.testing.assert_close(got, want)


def test_a_fixed_count_view_writes_to_the_cache_it_stands_for():
    # MPT, ProphetNet and GIT hand their forwards this view (hfax.patches.longtail.fixed_count).
    from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache

    from hfax.patches.longtail.fixed_count import fixed_count

    config = transformers.GitConfig(num_hidden_layers=2)
    cache = DynamicCache(config=config)
    view = fixed_count(cache, 1)
    assert isinstance(view, Cache) and view.layers is cache.layers and view.get_seq_length() == 1
    keys = torch.ones(1, 2, 3, 4)
    view.update(keys, keys, 0)
    assert cache.get_seq_length() == 3 and view.get_seq_length() == 1
    cross = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    view = fixed_count(cross, 0)
    assert isinstance(view, EncoderDecoderCache) and view.get_seq_length() == 0
    assert view.self_attention_cache is cross.self_attention_cache
    assert view.cross_attention_cache is cross.cross_attention_cache
    assert view.is_updated is cross.is_updated


def module_of(modeling, name, *args):
    return getattr(importlib.import_module(f"transformers.models.{modeling}"), name)(*args)


def counted_keyword(module) -> str:
    """The keyword under which ``module``'s forward takes the count of cached tokens: ``cache_length`` on
    transformers 5.24, ``past_key_values_length`` on 5.23 (FSMT's is keyword-only)."""
    return next(
        name
        for name in inspect.signature(type(module).forward).parameters
        if name.endswith("length")
    )


#: family -> (the embedding, how it is called with a count).
COUNTED = {
    "mvp": (lambda: module_of("mvp.modeling_mvp", "MvpLearnedPositionalEmbedding", 64, 16),
            lambda module, ids, count: module(ids, count)),
    "trocr": (lambda: module_of("trocr.modeling_trocr", "TrOCRLearnedPositionalEmbedding", 64, 16),
              lambda module, ids, count: module(ids, count)),
    "roformer": (lambda: module_of("roformer.modeling_roformer", "RoFormerSinusoidalPositionalEmbedding", 64, 16),
                 lambda module, ids, count: module(ids.shape, count)),
    "led": (lambda: module_of("led.modeling_led", "LEDLearnedPositionalEmbedding", 64, 16),
            lambda module, ids, count: module(ids.shape, count)),
    "fsmt": (lambda: module_of("fsmt.modeling_fsmt", "SinusoidalPositionalEmbedding", 64, 16, 1),
             lambda module, ids, count: module(ids, **{counted_keyword(module): count})),
    "bert": (lambda: module_of("bert.modeling_bert", "BertEmbeddings", transformers.BertConfig(
                 vocab_size=64, hidden_size=16, max_position_embeddings=64)),
             lambda module, ids, count: module(ids, None, None, None, count)),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(COUNTED))
def test_positions_counted_from_a_tensor_count(family):
    # hfax's static cache counts its tokens with a tensor; transformers' positions take a Python count.
    build, call = COUNTED[family]
    torch.manual_seed(0)
    module = build().eval()
    ids = torch.tensor([[5, 9, 13], [3, 8, 21]])
    expected = call(module, ids, 3)
    patches = importlib.import_module(f"hfax.patches.longtail.{family}").PATCHES
    Patcher(module).bind_by_class(module, patches)
    assert "forward" in vars(module), f"the {family} family does not patch {type(module).__name__}"
    torch.testing.assert_close(call(module, ids, torch.tensor(3)), expected)


GENERATING = {
    "mpt": lambda: tiny(transformers.MptConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, expansion_ratio=2)),
    "fsmt": lambda: tiny(fsmt_config(0), "AutoModelForSeq2SeqLM"),
    "led": lambda: tiny(led_config(0), "AutoModelForSeq2SeqLM"),
    "bert": lambda: tiny(bert2bert_config(0), "AutoModelForSeq2SeqLM"),
    "prophetnet": lambda: tiny(prophetnet_config(), "AutoModelForSeq2SeqLM"),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(GENERATING))
def test_greedy_tokens_of_transformers_generate(family):
    # transformers' own generate over its dynamic cache: the patched decoders give the same tokens.
    model = GENERATING[family]()
    ids = torch.tensor([[5, 9, 13, 7, 11], [3, 8, 21, 30, 6]])
    settings = dict(max_new_tokens=6, do_sample=False, min_new_tokens=6)
    if model.config.is_encoder_decoder:
        settings["decoder_start_token_id"] = 2
    with torch.no_grad():
        expected = model.generate(ids, **settings)
        actual = patch(model, family).generate(ids, **settings)
    torch.testing.assert_close(actual, expected)
