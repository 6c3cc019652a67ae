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
from hfax.testing import multimodal_inputs, save_tiny, tiny_multimodal_config
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


@pytest.fixture(scope="module")
def eager_whisper(tmp_path_factory):
    """Whisper's transformers model and hfax's, both with eager attention (which returns its weights)."""
    directory = tmp_path_factory.mktemp("whisper-eager")
    save_tiny(
        tiny_multimodal_config("whisper"), directory, "AutoModelForSpeechSeq2Seq", spread=True
    )
    reference = transformers.AutoModelForSpeechSeq2Seq.from_pretrained(
        directory, attn_implementation="eager"
    ).eval()
    model = hfax.AutoModelForTPU.from_pretrained(
        str(directory), backend=BACKEND, attn_implementation="eager"
    )
    return reference, model


def assert_output_is(got, want, path="", beams=False):
    """``got`` is transformers' output ``want``: its type and fields, every tensor's shape and dtype, values
    within 1e-4 (infinite ones equal). Beam search's cache is compared at the decoder prompt's position:
    which beams run on past ``max_length``, all tied, is how ``topk`` breaks ties (torch's and XLA's
    differ; test_an_encoder_decoders_cache_is_transformers in tests/test_generate_features.py)."""
    if isinstance(want, torch.Tensor):
        got = torch.as_tensor(np.asarray(got))
        assert (got.shape, got.dtype) == (want.shape, want.dtype), (path, got.shape, want.shape)
        if want.dtype.is_floating_point:
            assert torch.equal(got.isinf(), want.isinf()), path
            got, want = got.nan_to_num(posinf=0, neginf=0), want.nan_to_num(posinf=0, neginf=0)
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4, err_msg=path)
        else:
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=path)
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (path, type(got), len(got))
        for index, (mine, theirs) in enumerate(zip(got, want)):
            assert_output_is(mine, theirs, f"{path}[{index}]", beams)
    elif isinstance(want, transformers.EncoderDecoderCache):
        assert type(got) is type(want) and got.get_seq_length() == want.get_seq_length(), path
        for part in ("self_attention_cache", "cross_attention_cache"):
            pairs = zip(getattr(got, part).layers, getattr(want, part).layers, strict=True)
            for index, (mine, theirs) in enumerate(pairs):
                for name in ("keys", "values"):
                    a, b = getattr(mine, name), getattr(theirs, name)
                    if beams and part == "self_attention_cache":
                        assert a.shape == b.shape, (path, part, a.shape, b.shape)
                        a, b = a[:, :, :1], b[:, :, :1]
                    assert_output_is(a, b, f"{path}.{part}[{index}].{name}")
    elif isinstance(want, transformers.utils.ModelOutput):
        assert type(got) is type(want) and list(got.keys()) == list(want.keys()), (
            path, type(got), list(got.keys()), list(want.keys()),
        )  # fmt: skip
        for name in want.keys():
            assert_output_is(got[name], want[name], f"{path}.{name}", beams)
    else:
        assert got == want, (path, got, want)


DICT = dict(
    return_dict_in_generate=True, output_scores=True, output_logits=True,
    output_attentions=True, output_hidden_states=True,
)  # fmt: skip
BEAMS = dict(num_beams=2, num_return_sequences=2, length_penalty=2.0, early_stopping=False)


@pytest.mark.parametrize(
    "options",
    [
        dict(force_unique_generate_call=True),
        dict(**DICT, use_cache=False),
        dict(**DICT, force_unique_generate_call=True),
        dict(**BEAMS),
        dict(**BEAMS, force_unique_generate_call=True),
        dict(**BEAMS, **DICT, force_unique_generate_call=True),
        dict(do_sample=True, top_k=3),
        dict(do_sample=True, temperature=0.0, top_k=3, **BEAMS, **DICT),
        dict(decoder_input_ids=np.array([[1, 7, 9], [1, 11, 12]])),
        dict(decoder_input_ids=np.array([[1, 7, 9], [1, 11, 12]]), **DICT),
    ],
    ids=[
        "unique", "dict-no-cache", "dict-cache", "beams", "beams-unique", "beams-dict",
        "do_sample-without-temperature", "temperature-0-beams-dict", "decoder_input_ids",
        "decoder_input_ids-dict",
    ],
)  # fmt: skip
def test_whisper_gives_what_its_generate_returns(eager_whisper, options):
    """What transformers' Whisper ``generate`` returns for short-form audio, field by field: the full
    sequences with ``force_unique_generate_call``, the output of its one underlying call re-assembled per
    row with ``return_dict_in_generate`` (the first rows of each beam step's outputs, the scores of each
    sequence's beam, the encoder's outputs once per input), ``num_return_sequences`` as separate runs of
    one beam search each, greedy search unless a ``temperature`` above 0 is given (``do_sample`` is not
    read there), and the call's ``decoder_input_ids`` as its prompt."""
    reference, model = eager_whisper
    inputs = multimodal_inputs("whisper", seed=11)
    options = dict(max_new_tokens=5, repetition_penalty=1.2, bad_words_ids=[[3, 4]], **options)
    with torch.no_grad():
        want = reference.generate(
            input_features=torch.as_tensor(inputs["input_features"]),
            **{
                k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v
                for k, v in options.items()
            },
        )
    got = model.generate(**{k: torch.as_tensor(v) for k, v in inputs.items()}, **options)
    assert_output_is(got, want, beams="num_beams" in options)


def test_whisper_continues_from_the_cache_it_returned(eager_whisper):
    """An earlier result's cache, sequences and a decoder mask of ones over them continue Whisper's
    decoding as one call would, as transformers' Whisper does (its ``decoder_input_ids`` taken as they
    are, not replaced by the start tokens)."""
    reference, model = eager_whisper
    features = torch.as_tensor(multimodal_inputs("whisper", seed=12)["input_features"])
    options = dict(
        return_dict_in_generate=True, output_scores=True, eos_token_id=-1, pad_token_id=-1
    )
    whole = model.generate(input_features=features, max_new_tokens=4, **options)
    first = model.generate(input_features=features, max_new_tokens=3, **options)
    mask = torch.ones_like(first.sequences)
    rest = model.generate(
        input_features=features, decoder_input_ids=first.sequences, decoder_attention_mask=mask,
        past_key_values=first.past_key_values, max_new_tokens=1, **options,
    )  # fmt: skip
    with torch.no_grad():
        want = reference.generate(input_features=features, max_new_tokens=4, **options)
    np.testing.assert_array_equal(whole.sequences.numpy(), want.sequences.numpy())
    np.testing.assert_array_equal(rest.sequences.numpy(), want.sequences.numpy())
    scores = torch.stack([*first.scores, *rest.scores])
    np.testing.assert_allclose(scores.numpy(), torch.stack(want.scores).numpy(), atol=1e-4)


def test_a_cache_over_an_image_continues_without_the_image(multimodal):
    """An earlier result's cache over an image's tokens continues as transformers continues it: without
    the image, as transformers' own callers do (hfax loads the cache's keys and values and prefills only
    the tokens after them), tokens equal and scores within 1e-4 of transformers' continuation from its own
    cache, and of one call; with the image given again too (the prefill then computes the cached tokens
    again from the ids and the image, and checks the cache). Qwen2-VL's multimodal positions come from
    what places the image (``image_grid_thw``, and ``mm_token_type_ids`` over the first call's prompt,
    which transformers extends with text's zeros, as its own test_generate_continue_from_past_key_values
    passes them), without the pixels."""
    import copy

    name, reference, model = multimodal
    if name not in ("gemma3", "llava", "qwen2_vl"):
        pytest.skip("a decoder-only model with one image per prompt")
    inputs = multimodal_inputs(name, seed=13)
    options = dict(return_dict_in_generate=True, output_scores=True, do_sample=False)
    tensors = {key: torch.as_tensor(value) for key, value in inputs.items()}
    with torch.no_grad():
        whole = reference.generate(**tensors, max_new_tokens=4, **options)
        theirs = reference.generate(**tensors, max_new_tokens=3, **options)
    first = model.generate(**inputs, max_new_tokens=3, **options)
    sequences = np.asarray(first.sequences)
    np.testing.assert_array_equal(sequences, theirs.sequences.numpy())
    added = sequences.shape[1] - inputs["attention_mask"].shape[1]
    grown = {  # the new tokens: real, and text
        key: np.pad(inputs[key], ((0, 0), (0, added)), constant_values=key == "attention_mask")
        for key in ("attention_mask", "token_type_ids")
        if key in inputs
    }
    grown.update(
        {key: inputs[key] for key in ("image_grid_thw", "mm_token_type_ids") if key in inputs}
    )
    then = dict(input_ids=sequences, max_new_tokens=1, **options)
    with torch.no_grad():
        want = reference.generate(
            **{key: torch.as_tensor(value) for key, value in grown.items()},
            **{**then, "input_ids": torch.as_tensor(sequences)},
            past_key_values=copy.deepcopy(theirs.past_key_values),
        )
    np.testing.assert_array_equal(want.sequences.numpy(), whole.sequences.numpy())
    for cache in (first.past_key_values, copy.deepcopy(theirs.past_key_values)):
        rest = model.generate(**grown, **then, past_key_values=cache)
        np.testing.assert_array_equal(np.asarray(rest.sequences), want.sequences.numpy())
        np.testing.assert_allclose(np.asarray(rest.scores[0]), want.scores[0].numpy(), atol=1e-4)
    again = model.generate(
        pixel_values=inputs["pixel_values"], **grown, **then, past_key_values=first.past_key_values
    )
    np.testing.assert_array_equal(np.asarray(again.sequences), whole.sequences.numpy())
