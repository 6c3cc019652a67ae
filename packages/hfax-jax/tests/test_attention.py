"""The ``hfax_jax`` attention function against transformers' sdpa attention, whose place it takes, and its
eager attention, run by PyTorch on CPU."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import eager_attention_forward

from hfax.backends.jax import attention
from hfax.backends.jax.runtime import env, to_array, to_tensor

BATCH, HEADS, KV_HEADS, LENGTH, DIM = 2, 4, 2, 6, 8
MODULE = types.SimpleNamespace(
    num_key_value_groups=HEADS // KV_HEADS, is_causal=True, training=False
)


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(BATCH, HEADS, LENGTH, DIM, generator=generator)
    key, value = (torch.randn(BATCH, KV_HEADS, LENGTH, DIM, generator=generator) for _ in range(2))
    return query, key, value


def allowed(window: int | None = None, padding: int = 0) -> torch.Tensor:
    """``[BATCH, 1, LENGTH, LENGTH]``: causal, optionally windowed; row 0 left-padded by ``padding``."""
    q, k = torch.arange(LENGTH)[:, None], torch.arange(LENGTH)[None, :]
    mask = (k <= q) & ((k > q - window) if window else True)
    mask = mask.expand(BATCH, 1, LENGTH, LENGTH).clone()
    mask[0, :, :, :padding] = False
    return mask


def additive(mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, 0.0, torch.finfo(torch.float32).min)


def hfax_jax(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, **kwargs
) -> np.ndarray:
    jax_inputs = [None if t is None else jnp.asarray(t.numpy()) for t in (query, key, value, mask)]
    with env():
        output, _ = attention.attention_forward(
            MODULE, *to_tensor(jax_inputs), scaling=DIM**-0.5, **kwargs
        )
    return np.asarray(to_array(output))


def eager(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
) -> np.ndarray:
    output, _ = eager_attention_forward(
        MODULE, query, key, value, additive(mask), scaling=DIM**-0.5
    )
    return output.numpy()


def sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
) -> np.ndarray:
    output, _ = sdpa_attention_forward(MODULE, query, key, value, mask, scaling=DIM**-0.5)
    return output.numpy()


@pytest.mark.parametrize("kind", ["additive", "boolean"])
def test_masks_with_grouped_heads_match_sdpa_and_eager(kind):
    """Left padding leaves padding queries with no key to see: there torch's sdpa gives zeros (and so
    does hfax_jax; torchax's own sdpa lowering gives NaN), eager the mean of every value; elsewhere all
    agree."""
    mask = allowed(padding=3)
    assert not mask[0, 0, 0].any()
    got = hfax_jax(*inputs(), additive(mask) if kind == "additive" else mask)
    np.testing.assert_allclose(got, sdpa(*inputs(), mask), atol=1e-5)
    assert (got[0, 0] == 0).all()
    sees = mask.any(-1)[:, 0]  # [batch, queries]
    np.testing.assert_allclose(got[sees.numpy()], eager(*inputs(), mask)[sees.numpy()], atol=1e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_without_a_mask_causality_and_the_window_are_applied(window):
    expected = eager(*inputs(), allowed(window))
    np.testing.assert_allclose(
        hfax_jax(*inputs(), None, sliding_window=window), expected, atol=1e-5
    )


def test_soft_capping_is_refused():
    with pytest.raises(ValueError, match="soft-capping"):
        hfax_jax(*inputs(), None, softcap=50.0)


@pytest.mark.parametrize("sizes", [None, {"data": 4, "model": 2}], ids=["one-device", "mesh"])
def test_a_sliding_layer_decodes_over_its_window_only(tiny, sizes):
    """A decode step of a sliding layer reads the ``sliding_window`` slots that end at the new token, not
    the whole row: in the tiny Gemma 3 (a sliding layer of window 4, a full one; 4 query heads over one
    key/value head) decoding 32-slot rows, the loop's scores over the cache are a product over 4 slots
    beside one over 32 (on one device, where the cache is updated in place, and on a mesh, where it is
    not). The tokens are transformers', also once a row is longer than the window."""
    import re

    import hfax
    from hfax.backends.jax import generation
    from hfax.testing import left_padded, reference_generate

    directory, reference, model = tiny("gemma3")
    if sizes is not None:
        model = hfax.AutoModelForCausalLM.from_pretrained(
            str(directory), backend="jax", mesh=hfax.make_mesh(**sizes)
        )
    ids, mask = left_padded([[1, 17, 30, 42, 9, 77, 5], [1, 3, 4]])
    hlo = generation.lower(model, ids, mask, max_new_tokens=16).compile().as_text()
    products = set(re.findall(r"= f32\[([\d,]+)\]\{[\d,]+\} dot\(", hlo))
    whole = [shape[: -len(",32")] for shape in products if shape.endswith(",32")]
    assert any(f"{lead},4" in products for lead in whole), products
    got = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    np.testing.assert_array_equal(
        np.asarray(got), reference_generate(reference, ids, mask, max_new_tokens=16)
    )
