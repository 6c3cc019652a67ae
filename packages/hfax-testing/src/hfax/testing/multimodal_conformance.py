"""The multimodal part of the generate conformance suite: LLaVA, Qwen2-VL, Gemma 3 with images and Whisper
with audio (:data:`hfax.testing.MULTIMODAL`), a processor's output going in as it is, and transformers'
tokens coming out (its own ``generate`` on CPU, same weights), on every backend.

A backend's multimodal test module runs it, and its own tests take the same models::

    # packages/hfax-<backend>/tests/test_generate_multimodal.py
    from hfax.testing.multimodal_conformance import *  # noqa: F403 (pytest collects what it imports)

    BACKEND = "jax"

    def test_something_only_this_backend_does(multimodal):
        name, reference, model = multimodal  # built once per module and model

The models come from :func:`multimodal`, once per module (a backend's programs for them compile once);
:func:`multilingual_whisper` is a Whisper whose decoder prompt holds language and task tokens.

Tested by: packages/hfax-jax/tests/test_generate_multimodal.py,
packages/hfax-torchxla/tests/test_generate_multimodal.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hfax.testing.batches import multimodal_inputs
from hfax.testing.checkpoints import save_tiny
from hfax.testing.configs import MULTIMODAL, tiny_multimodal_config

__all__ = [
    "NEW_TOKENS",
    "backend",
    "multilingual_whisper",
    "multimodal",
    "pytest_generate_tests",
    "reference_generate",
    "test_greedy_matches_transformers",
    "test_one_prompt_alone_gives_its_row_of_the_batch",
    "test_whisper_language_and_task_tokens",
]

NEW_TOKENS = 8


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The module's models once each, for every test that takes :func:`multimodal`."""
    if "multimodal_case" in metafunc.fixturenames:
        metafunc.parametrize("multimodal_case", sorted(MULTIMODAL), scope="module")


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest) -> str:
    """The backend the module that runs the suite names (its ``BACKEND``)."""
    return request.module.BACKEND


@pytest.fixture(scope="module")
def multimodal(
    backend: str, multimodal_case: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Any, Any]:
    """``(name, transformers reference, hfax model)`` of a tiny multimodal model with spread weights; the
    checkpoint's folder is the model's ``name_or_path``."""
    import hfax

    directory = tmp_path_factory.mktemp(multimodal_case)
    config = tiny_multimodal_config(multimodal_case)
    reference = save_tiny(config, directory, MULTIMODAL[multimodal_case], spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(directory), backend=backend)
    return multimodal_case, reference, model


@pytest.fixture(scope="module")
def multilingual_whisper(backend: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """A Whisper whose decoder prompt holds language and task tokens (four tokens, not one): English and
    French (tokens 20, 21), transcribe and translate (22, 23), no timestamps (24)."""
    import hfax

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
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend=backend)


def reference_generate(reference: Any, inputs: dict[str, np.ndarray], **options: Any) -> np.ndarray:
    """transformers' greedy tokens for a processor's ``inputs``."""
    import torch

    with torch.no_grad():
        tensors = {name: torch.as_tensor(value) for name, value in inputs.items()}
        return reference.generate(**tensors, do_sample=False, **options).numpy()


def test_greedy_matches_transformers(multimodal: tuple[str, Any, Any]) -> None:
    """Two prompts with an image each (or two clips), one left-padded: transformers' tokens."""
    name, reference, model = multimodal
    inputs = multimodal_inputs(name)
    expected = reference_generate(reference, inputs, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(
        np.asarray(model.generate(**inputs, max_new_tokens=NEW_TOKENS)), expected
    )


def test_one_prompt_alone_gives_its_row_of_the_batch(multimodal: tuple[str, Any, Any]) -> None:
    """A batch of one (no padding row to fill the bucket's rows with an image of its own)."""
    name, reference, model = multimodal
    alone = multimodal_inputs(name, seed=4, batch=1)
    expected = reference_generate(reference, alone, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(
        np.asarray(model.generate(**alone, max_new_tokens=NEW_TOKENS)), expected
    )


@pytest.mark.parametrize("language, task", [("en", "transcribe"), ("fr", "translate")])
def test_whisper_language_and_task_tokens(
    multilingual_whisper: tuple[Any, Any], language: str, task: str
) -> None:
    """Whisper's forced decoder prompt (start, language, task, no timestamps) and transformers' tokens."""
    reference, model = multilingual_whisper
    inputs = multimodal_inputs("whisper", seed=5)
    options = dict(language=language, task=task, max_new_tokens=6)
    expected = reference_generate(reference, inputs, **options)
    np.testing.assert_array_equal(np.asarray(model.generate(**inputs, **options)), expected)
    full = model.generate(**inputs, **options, return_dict_in_generate=True).sequences
    prompt = [1, 20 if language == "en" else 21, 22 if task == "transcribe" else 23, 24]
    assert np.asarray(full)[:, :4].tolist() == [prompt, prompt]
