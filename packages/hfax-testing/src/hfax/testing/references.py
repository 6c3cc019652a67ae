"""transformers on PyTorch/CPU as the reference, and the comparisons of hfax with it: logits within a
tolerance at every real position, greedy tokens identical."""

from __future__ import annotations

from typing import Any

import numpy as np

from hfax.testing.batches import left_padded


def as_numpy(value: Any) -> np.ndarray:
    """A backend's result (a JAX array, a torch tensor on any device, numpy) as a numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def reference_forward(model: Any, **inputs: Any) -> Any:
    """The PyTorch reference's output for numpy (or torch) inputs, without gradients."""
    import torch

    with torch.no_grad():
        return model(**{name: torch.as_tensor(value) for name, value in inputs.items()})


def reference_generate(
    model: Any, input_ids: np.ndarray, attention_mask: np.ndarray | None = None, **options: Any
) -> np.ndarray:
    """transformers' own ``generate`` on PyTorch/CPU (greedy unless told otherwise), as numpy."""
    import torch

    options.setdefault("do_sample", False)
    mask = None if attention_mask is None else torch.as_tensor(attention_mask)
    with torch.no_grad():
        return model.generate(torch.as_tensor(input_ids), attention_mask=mask, **options).numpy()


def assert_same_continuation(expected: np.ndarray, actual: Any, pad_token_id: int) -> None:
    """hfax returns ``prompt + max_new_tokens`` columns, padded after EOS; transformers stops once every row
    finished. The common columns must match exactly and hfax's extra columns must be padding."""
    actual = as_numpy(actual)
    width = expected.shape[1]
    np.testing.assert_array_equal(actual[:, :width], expected)
    assert (actual[:, width:] == pad_token_id).all(), (
        f"tokens after transformers stopped are not padding: {actual[:, width:]}"
    )


def assert_same_greedy(
    model: Any, reference: Any, prompt: list[int], max_new_tokens: int
) -> np.ndarray:
    """hfax's greedy ``generate`` gives exactly transformers' tokens for ``prompt``, every one of the
    ``max_new_tokens`` (EOS stops neither side). Returns them."""
    ids = np.asarray([prompt], np.int64)
    options = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    expected = reference_generate(reference, ids, **options)
    np.testing.assert_array_equal(
        as_numpy(model.generate(ids, **options)),
        expected,
        err_msg="greedy tokens differ from PyTorch",
    )
    return expected


def assert_same_logits(
    model: Any, reference: Any, prompts: list[list[int]], atol: float = 1e-4
) -> np.ndarray:
    """A forward over ``prompts`` as one left-padded batch: logits finite everywhere, and within ``atol`` of
    transformers' on PyTorch at every real (not padding) position. Returns hfax's logits."""
    import torch

    ids, mask = left_padded(prompts)
    with torch.no_grad():
        expected = (
            reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
            .logits.float()
            .numpy()
        )
    actual = as_numpy(model(input_ids=ids, attention_mask=mask).logits).astype(np.float32)
    assert np.isfinite(actual).all(), (
        f"non-finite logits at (row, position) {np.argwhere(~np.isfinite(actual).all(-1)).tolist()}"
    )
    real = mask.astype(bool)
    np.testing.assert_allclose(
        actual[real], expected[real], atol=atol, rtol=0, err_msg="logits differ from PyTorch"
    )
    return actual
