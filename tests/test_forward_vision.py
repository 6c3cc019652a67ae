"""Vision encoders' forward on every installed backend within 1e-4 of transformers: ViT image classification, CLIP's
image-text similarities; and two image-text models of the coverage sweep compiled against transformers: Ovis2's
visual indicators, Florence-2's images merged into its encoder's embeddings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

import hfax
from hfax.plugins import backends
from hfax.testing import ENCODER_SIZES as ENCODER
from hfax.testing import as_numpy, save_tiny

BACKENDS = [name for name in ("jax", "torch_xla") if name in backends()]
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no hfax backend is installed")

TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def loaded(config: Any, auto_class: str, directory: Any, backend: str) -> tuple[Any, Any]:
    reference = save_tiny(config, directory, auto_class, spread=True)
    return reference, hfax.AutoModelForTPU.from_pretrained(str(directory), backend=backend)


def images(seed: int, count: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 3, 16, 16)).astype(np.float32)


def assert_close(actual: Any, expected: torch.Tensor) -> None:
    np.testing.assert_allclose(as_numpy(actual), expected.numpy(), atol=TOLERANCE, rtol=0)


def test_vit_image_classification(tmp_path, backend):
    config = transformers.ViTConfig(**ENCODER, image_size=16, patch_size=4, num_labels=5)
    reference, model = loaded(config, "AutoModelForImageClassification", tmp_path, backend)
    pixels = images(0)
    with torch.no_grad():
        expected = reference(pixel_values=torch.as_tensor(pixels)).logits
    assert_close(model(pixel_values=pixels).logits, expected)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory, backend: str) -> tuple[Any, Any]:
    config = transformers.CLIPConfig(
        text_config=dict(**ENCODER, vocab_size=64, max_position_embeddings=16),
        vision_config=dict(**ENCODER, image_size=16, patch_size=4),
        projection_dim=16,
    )
    return loaded(
        config, "AutoModelForZeroShotImageClassification", tmp_path_factory.mktemp("clip"), backend
    )


def test_clip_image_text_similarities(clip):
    reference, model = clip
    ids = np.array([[0, 5, 9, 12, 2], [0, 7, 2, 1, 1]])
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    pixels = images(1, count=3)
    with torch.no_grad():
        expected = reference(
            input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
            pixel_values=torch.as_tensor(pixels),
        )  # fmt: skip
    actual = model(input_ids=ids, attention_mask=mask, pixel_values=pixels)
    assert_close(actual.logits_per_image, expected.logits_per_image)
    assert_close(actual.logits_per_text, expected.logits_per_text)
    assert_close(actual.image_embeds, expected.image_embeds)
    assert_close(
        actual.vision_model_output.last_hidden_state,
        expected.vision_model_output.last_hidden_state,
    )


def sweep_image_text_model(name: str, directory: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """The coverage sweep's tiny image-text model ``name`` saved to ``directory`` (the reference, loaded
    back) and its inputs: a left-padded batch with one image per prompt (tools/coverage_checks.py)."""
    tools = str(Path(__file__).resolve().parents[1] / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import coverage_checks

    from hfax.testing import shrunk_config

    model_class, config_class = coverage_checks.model_classes("image_text_to_text", name)
    config = shrunk_config(name, config_class=config_class)
    reference = coverage_checks._saved(model_class, config, str(directory))
    ids, mask, _ = coverage_checks.prompt_ids(reference.config)
    return reference, coverage_checks._image_text_inputs(reference, ids, mask)


def test_ovis2_places_its_visual_indicators_compiled(tmp_path, backend):
    # Ovis2 writes each visual indicator's embedding under `if mask.any()` (jit cannot branch on it);
    # hfax.patches.longtail.ovis2 writes it by torch.where. Prompts with an indicator before and after their image: the
    # compiled forward within 1e-4 and greedy tokens equal to transformers'.
    reference, inputs = sweep_image_text_model("ovis2", tmp_path)
    ids = inputs["input_ids"]
    image = (ids[0] == reference.config.image_token_id).nonzero()[:, 0]
    before, after = reference.config.visual_indicator_token_ids[:2]
    ids[:, image[0] - 1], ids[:, image[-1] + 1] = before, after  # real tokens of both rows
    with torch.no_grad():
        expected = reference(**inputs).logits.numpy()
        tokens = reference.generate(**inputs, max_new_tokens=6, do_sample=False).numpy()
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    arrays = {name: value.numpy() for name, value in inputs.items()}
    real = arrays["attention_mask"].astype(bool)
    np.testing.assert_allclose(
        as_numpy(model(**arrays).logits)[real], expected[real], atol=TOLERANCE, rtol=0
    )
    np.testing.assert_array_equal(as_numpy(model.generate(**arrays, max_new_tokens=6)), tokens)


def test_florence2_generates_from_an_image(tmp_path, backend):
    # Florence-2 is an encoder-decoder whose encoder takes text embeddings only: the image's features
    # replace the image tokens' embeddings before the encoder runs (hfax.generation.inputs.encode), in
    # prefill; then the decoder's loop. Greedy tokens of a left-padded batch equal transformers'.
    reference, inputs = sweep_image_text_model("florence2", tmp_path)
    with torch.no_grad():
        tokens = reference.generate(**inputs, max_new_tokens=8, do_sample=False).numpy()
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend=backend)
    arrays = {name: value.numpy() for name, value in inputs.items()}
    np.testing.assert_array_equal(as_numpy(model.generate(**arrays, max_new_tokens=8)), tokens)
