"""generate with images and audio on PyTorch/XLA: the multimodal conformance suite
(:mod:`hfax.testing.multimodal_conformance`: a processor's output goes in as it is, the image or audio
encoder runs in the prefill graph, the tokens are transformers' own), a new image of the same size
compiling nothing, and Whisper's refusals, with the same models."""

from __future__ import annotations

import numpy as np
import pytest

from hfax.backends.torchxla import runtime
from hfax.testing import multimodal_inputs
from hfax.testing.multimodal_conformance import *  # noqa: F403 (the suite's tests, fixtures, hook)
from hfax.testing.multimodal_conformance import NEW_TOKENS, reference_generate

BACKEND = "torch_xla"


def test_a_new_image_of_the_same_size_compiles_nothing(multimodal):
    name, reference, model = multimodal
    model.generate(**multimodal_inputs(name, seed=2), max_new_tokens=NEW_TOKENS)
    other = multimodal_inputs(name, seed=3)
    before = runtime.counters()
    actual = np.asarray(model.generate(**other, max_new_tokens=NEW_TOKENS))
    assert (runtime.counters() - before).compiles == 0
    np.testing.assert_array_equal(
        actual, reference_generate(reference, other, max_new_tokens=NEW_TOKENS)
    )


def test_whisper_refusals_come_before_compiling(multilingual_whisper):
    _, model = multilingual_whisper
    inputs = multimodal_inputs("whisper")
    before = runtime.counters()
    with pytest.raises(NotImplementedError, match="return_timestamps"):
        model.generate(**inputs, language="en", return_timestamps=True)
    with pytest.raises(NotImplementedError, match="language="):
        model.generate(**inputs)
    with pytest.raises(ValueError, match="Long-form"):
        model.generate(input_features=np.zeros((1, 8, 64), np.float32), language="en")
    assert (runtime.counters() - before).compiles == 0
