"""generate with images and audio on PyTorch/XLA: a processor's output goes in as it is, the image or audio
encoder runs in the prefill graph, and the tokens are transformers' own (LLaVA, Qwen2-VL, Gemma 3, Whisper
from its ``input_features`` alone, with its forced decoder prompt)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import hfax
from hfax.backends.torchxla import runtime
from hfax.testing import MULTIMODAL, save_tiny, tiny_multimodal_config
from hfax.testing import multimodal_inputs as processed

NEW_TOKENS = 8


@pytest.fixture(scope="module", params=sorted(MULTIMODAL))
def models(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    config = tiny_multimodal_config(request.param)
    reference = save_tiny(config, directory, MULTIMODAL[request.param], spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")
    return request.param, reference, model


def reference_generate(reference: Any, inputs: dict[str, np.ndarray], **options: Any) -> np.ndarray:
    with torch.no_grad():
        tensors = {name: torch.as_tensor(value) for name, value in inputs.items()}
        return reference.generate(**tensors, do_sample=False, **options).numpy()


def test_greedy_matches_transformers(models):
    name, reference, model = models
    inputs = processed(name)
    expected = reference_generate(reference, inputs, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(
        np.asarray(model.generate(**inputs, max_new_tokens=NEW_TOKENS)), expected
    )


def test_a_new_image_of_the_same_size_compiles_nothing(models):
    name, reference, model = models
    model.generate(**processed(name, seed=2), max_new_tokens=NEW_TOKENS)
    other = processed(name, seed=3)
    before = runtime.counters()
    actual = np.asarray(model.generate(**other, max_new_tokens=NEW_TOKENS))
    assert (runtime.counters() - before).compiles == 0
    np.testing.assert_array_equal(
        actual, reference_generate(reference, other, max_new_tokens=NEW_TOKENS)
    )


def test_one_prompt_alone_gives_its_row_of_the_batch(models):
    name, reference, model = models
    alone = processed(name, seed=4, batch=1)
    expected = reference_generate(reference, alone, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(
        np.asarray(model.generate(**alone, max_new_tokens=NEW_TOKENS)), expected
    )


@pytest.fixture(scope="module")
def multilingual_whisper(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """A Whisper whose decoder prompt holds language and task tokens (four tokens, not one)."""
    directory = tmp_path_factory.mktemp("whisper-multilingual")
    reference = save_tiny(
        tiny_multimodal_config("whisper"), directory, "AutoModelForSpeechSeq2Seq", spread=True
    )
    generation = reference.generation_config
    generation.lang_to_id = {"<|en|>": 20, "<|fr|>": 21}
    generation.task_to_id = {"transcribe": 22, "translate": 23}
    generation.no_timestamps_token_id = 24
    generation.is_multilingual = True
    generation._from_model_config = False  # else loading builds it again from the model's config
    generation.save_pretrained(directory)
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")


def test_whisper_language_and_task_tokens(multilingual_whisper):
    reference, model = multilingual_whisper
    inputs = processed("whisper", seed=5)
    options = dict(language="fr", task="translate", max_new_tokens=6)
    expected = reference_generate(reference, inputs, **options)
    np.testing.assert_array_equal(np.asarray(model.generate(**inputs, **options)), expected)


def test_whisper_refusals_come_before_compiling(multilingual_whisper):
    _, model = multilingual_whisper
    inputs = processed("whisper")
    before = runtime.counters()
    with pytest.raises(NotImplementedError, match="return_timestamps"):
        model.generate(**inputs, language="en", return_timestamps=True)
    with pytest.raises(NotImplementedError, match="language="):
        model.generate(**inputs)
    with pytest.raises(ValueError, match="Long-form"):
        model.generate(input_features=np.zeros((1, 8, 64), np.float32), language="en")
    assert (runtime.counters() - before).compiles == 0
