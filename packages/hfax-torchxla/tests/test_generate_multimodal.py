"""generate with images on PyTorch/XLA: a processor's output goes in as it is, the image encoder runs in the
prefill graph, and the tokens are transformers' own (LLaVA, Qwen2-VL, Gemma 3). Whisper is an
encoder-decoder, which this backend's generate refuses."""

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
IMAGE_MODELS = sorted(name for name in MULTIMODAL if name != "whisper")


@pytest.fixture(scope="module", params=IMAGE_MODELS)
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
