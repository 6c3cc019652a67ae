"""Generate and forward on the JAX backend for what the conformance suite (packages/hfax-jax/tests/
test_conformance.py, :mod:`hfax.testing.conformance`) does not hold: models that decode without a cache,
a family's generation traits, a cache refused, X-MOD's per-row adapters, an eager expert loop.

Tiny models with spread random weights (a broken cache changes their tokens), a batch with a left-padded
row, the tokens of transformers' own ``generate`` on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import transformers

import hfax
from hfax.testing import (
    conformance,
    eager_experts_batch,
    looping_config,
    save_tiny,
    tiny_config,
)


def assert_generates_like_transformers(config: Any, directory, **options: Any) -> None:
    conformance.assert_generates_like_transformers(config, directory, "jax", **options)


def test_indexer_choosing_keys_per_query_in_a_loop(tmp_path):
    # Qwen4-Exp's indexer lists each query's visible keys with nonzero (no static shape) and its cache keeps
    # the keys' positions, read from their end: hfax.patches.longtail.qwen4_exp chooses the same keys for all queries
    # at once, and the model decodes without a cache (each step re-reads the sequence).
    config = looping_config("qwen4_exp")
    with pytest.warns(UserWarning, match="decodes without a cache: its indexer"):
        assert_generates_like_transformers(config, tmp_path)


@pytest.mark.skipif(
    not hasattr(transformers, "Kolibri1_1Config"), reason="Kolibri 1.1 came with transformers 5.25"
)
def test_kolibri1_1_indexer_choosing_keys_per_group_of_queries_in_a_loop(tmp_path):
    # Kolibri 1.1's indexer loops over the queries' first visible keys (left padding makes two groups):
    # hfax.patches.longtail.kolibri1_1 chooses the same pool and keys for every query at once, through the
    # static cache, and the layer sharing the indexer's keys reads its pool.
    assert_generates_like_transformers(looping_config("kolibri1_1"), tmp_path)


def test_a_family_trait_changes_what_generate_does(tmp_path):
    # What a plugin answers through hfax_generation_traits reaches generate: a reason against a static cache
    # makes the model decode without one (transformers' tokens still), a refusal stops the call before
    # anything compiles.
    from hfax.backends.jax import monitor
    from hfax.generation.traits import GenerationTraits

    class Traits:
        traits = GenerationTraits(no_static_cache="a test plugin keeps its state elsewhere")

        @hfax.hookimpl
        def hfax_generation_traits(self, model, config):
            return self.traits if config.model_type == "llama" else None

    hfax.register(Traits(), name="test-traits")
    try:
        with pytest.warns(UserWarning, match="decodes without a cache: a test plugin keeps"):
            assert_generates_like_transformers(tiny_config("llama"), tmp_path)
        Traits.traits = GenerationTraits(refused="this test refuses it; run it elsewhere")
        model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
        compiles = monitor.snapshot().compiles
        with pytest.raises(NotImplementedError, match="this test refuses it"):
            model.generate(np.array([[5, 9, 13]]), max_new_tokens=2)
        assert monitor.snapshot().compiles == compiles
    finally:
        hfax.unregister("test-traits")


def test_a_cache_of_another_kind_is_refused(tmp_path):
    # RWKV keeps its recurrent state in `state`: re-reading the sequence every step would not give its tokens.
    config = transformers.RwkvConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
    )
    save_tiny(config, tmp_path)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    with pytest.raises(NotImplementedError, match="takes 'state'"):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=2)


def test_language_adapters_chosen_per_row(tmp_path):
    # X-MOD runs each row through its own language's adapter; rows of two languages in one batch give
    # transformers' logits, in the jitted forward too (the boolean gather had no static shape).
    import jax
    import torch

    reference = save_tiny(looping_config("xmod"), tmp_path, spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    ids, languages = np.array([[5, 9, 13, 2, 44], [3, 8, 21, 7, 30]]), np.array([2, 0])
    with torch.no_grad():
        expected = reference(
            input_ids=torch.as_tensor(ids), lang_ids=torch.as_tensor(languages)
        ).logits.numpy()
    forward = jax.jit(lambda i, lang: model(input_ids=i, lang_ids=lang).logits)
    np.testing.assert_allclose(np.asarray(forward(ids, languages)), expected, atol=1e-4, rtol=0)


def test_experts_of_a_class_that_defaults_to_its_eager_loop(tmp_path):
    # OpenAI Privacy Filter picks transformers' eager expert loop when nobody asks (`nonzero` of the experts
    # a batch hits, which jit cannot size); hfax runs its experts by the grouped path JAX lowers instead,
    # with transformers' logits for a padded batch.
    import jax

    expected, inputs, real = eager_experts_batch(tmp_path)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    forward = jax.jit(lambda i, m: model(input_ids=i, attention_mask=m).logits)
    got = np.asarray(forward(inputs["input_ids"], inputs["attention_mask"]))
    np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=0)
