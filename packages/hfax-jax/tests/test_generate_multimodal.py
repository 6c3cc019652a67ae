"""generate with images and audio on the JAX backend: the multimodal conformance suite
(:mod:`hfax.testing.multimodal_conformance`: a processor's output goes in as it is, the tokens are
transformers' own), and what only this backend does with the same models: the forward, torch inputs,
programs reused for a new image, beams, an 8-device mesh, Whisper's length rule and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax.testing import multimodal_inputs, tiny_multimodal_config
from hfax.testing.multimodal_conformance import *  # noqa: F403 (the suite's tests, fixtures, hook)
from hfax.testing.multimodal_conformance import NEW_TOKENS, reference_generate

BACKEND = "jax"


def test_qwen2_vl_without_token_types_is_transformers(multimodal):
    """Qwen2-VL's processor returns ``mm_token_type_ids``; a caller who leaves them out gets what
    transformers' generate gives then (on 5.24: the prompt at its text positions), not an error."""
    name, reference, model = multimodal
    if name != "qwen2_vl":
        pytest.skip("Qwen2-VL's token types only")
    inputs = multimodal_inputs(name)
    del inputs["mm_token_type_ids"]
    expected = reference_generate(reference, inputs, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(
        np.asarray(model.generate(**inputs, max_new_tokens=NEW_TOKENS)), expected
    )


def test_forward_matches_transformers(multimodal):
    """The forward takes the same inputs: logits within 1e-4 (image sizes held as constants)."""
    name, reference, model = multimodal
    inputs = multimodal_inputs(name, seed=8)
    if name == "whisper":
        inputs["decoder_input_ids"] = np.array([[1, 5, 6], [1, 7, 8]])
    with torch.no_grad():
        expected = reference(**{key: torch.as_tensor(value) for key, value in inputs.items()})
    real = inputs.get("attention_mask", np.ones((2, 3))).astype(
        bool
    )  # padding has no defined logits
    actual = np.asarray(model(**inputs).logits)[real]
    np.testing.assert_allclose(actual, expected.logits.numpy()[real], atol=1e-4, rtol=0)


def test_torch_inputs_give_torch_tokens(multimodal):
    name, reference, model = multimodal
    inputs = {key: torch.as_tensor(value) for key, value in multimodal_inputs(name, seed=1).items()}
    actual = model.generate(**inputs, max_new_tokens=4)
    assert isinstance(actual, torch.Tensor)
    np.testing.assert_array_equal(
        actual.numpy(),
        reference_generate(reference, multimodal_inputs(name, seed=1), max_new_tokens=4),
    )


def test_a_new_image_of_the_same_size_compiles_nothing(multimodal):
    name, reference, model = multimodal
    model.generate(**multimodal_inputs(name, seed=2), max_new_tokens=NEW_TOKENS)
    other = multimodal_inputs(name, seed=3)
    actual = np.asarray(model.generate(**other, max_new_tokens=NEW_TOKENS))
    assert model.last_generate_stats.compiles == 0
    np.testing.assert_array_equal(
        actual, reference_generate(reference, other, max_new_tokens=NEW_TOKENS)
    )


def test_beam_search_repeats_one_image_per_prompt(multimodal):
    name, reference, model = multimodal
    inputs, options = multimodal_inputs(name, seed=6), dict(max_new_tokens=6, num_beams=2)
    if name == "qwen2_vl":  # its pixel_values hold patches, not one image per prompt
        with pytest.raises(NotImplementedError, match="pixel_values has 32 for 2 prompts"):
            model.generate(**inputs, **options)
        return
    expected = reference_generate(reference, inputs, **options)
    np.testing.assert_array_equal(np.asarray(model.generate(**inputs, **options)), expected)


def test_sharded_over_eight_devices_gives_the_same_tokens(multimodal):
    name, reference, model = multimodal
    sharded = hfax.AutoModelForTPU.from_pretrained(
        model.name_or_path, backend="jax", mesh=hfax.make_mesh(data=2, model=4)
    )
    inputs = multimodal_inputs(name, seed=7)
    expected = reference_generate(reference, inputs, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(
        np.asarray(sharded.generate(**inputs, max_new_tokens=NEW_TOKENS)), expected
    )


def test_gemma3_image_tokens_see_each_other():
    """Without its image blocks in the mask (``token_type_ids``), Gemma 3 gives other tokens: the parity
    above covers them."""
    torch.manual_seed(0)
    config = tiny_multimodal_config("gemma3")
    model = transformers.AutoModelForImageTextToText.from_config(config).eval()
    inputs = {name: torch.as_tensor(value) for name, value in multimodal_inputs("gemma3").items()}
    with torch.no_grad():
        with_blocks = model(**inputs).logits
        inputs.pop("token_type_ids")
        without = model(**inputs).logits
    assert (with_blocks - without).abs().max() > 1e-3


def test_whisper_default_length_and_an_early_eos(multilingual_whisper):
    """Whisper's own length rule (20 new tokens), and rows cut at their EOS then padded as it pads them."""
    reference, model = multilingual_whisper
    inputs = multimodal_inputs("whisper", seed=9)
    full = reference_generate(reference, inputs, language="en")
    np.testing.assert_array_equal(np.asarray(model.generate(**inputs, language="en")), full)
    assert full.shape[1] == 20
    options = dict(language="en", eos_token_id=int(full[0, 2]))  # row 0 ends early
    expected = reference_generate(reference, inputs, **options)
    np.testing.assert_array_equal(np.asarray(model.generate(**inputs, **options)), expected)


def test_whisper_refusals_name_the_fix(multilingual_whisper):
    _, model = multilingual_whisper
    inputs = multimodal_inputs("whisper")
    compiles = hfax.backends.jax.monitor.snapshot().compiles
    with pytest.raises(NotImplementedError, match="return_timestamps"):
        model.generate(**inputs, language="en", return_timestamps=True)
    with pytest.raises(NotImplementedError, match="language="):
        model.generate(**inputs)
    with pytest.raises(ValueError, match="Long-form"):
        model.generate(input_features=np.zeros((1, 8, 64), np.float32), language="en")
    with pytest.raises(NotImplementedError, match="prompt_ids"):
        model.generate(**inputs, language="en", prompt_ids=np.array([5]))
    assert hfax.backends.jax.monitor.snapshot().compiles == compiles


def test_inputs_the_model_does_not_take_are_named(multimodal):
    name, _, model = multimodal
    with pytest.raises(TypeError, match="pixel_valeus"):
        model.generate(**multimodal_inputs(name), pixel_valeus=np.zeros(3), max_new_tokens=2)
