"""Batched decode loops on CPU read 16-bit linear weights from a transposed copy and multiply float32 ones
columns first (``[out, rows]`` products), and still choose transformers' tokens."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import hfax
from hfax.backends.jax import decode_layout, generation
from hfax.testing import left_padded, reference_generate, save_tiny

PROMPTS = [[1, 17, 300, 42, 9, 77, 5], [1, 250, 3, 88]]
NEW = decode_layout.TRANSPOSE_FROM_STEPS
PROJECTIONS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]


def llama(directory, tied: bool, dtype: str = "float32"):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    reference = save_tiny(config, directory, spread=True)
    return reference, hfax.AutoModelForCausalLM.from_pretrained(
        str(directory), backend="jax", dtype=dtype
    )


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    os.environ.setdefault(
        "HFAX_CACHE", str(tmp_path_factory.mktemp("hfax-cache"))
    )  # not the user's cache
    return llama(tmp_path_factory.mktemp("llama-untied"), tied=False)


def steps(model, prompts, new):
    """The steps the decode loop ``generate`` runs for ``new`` tokens can run (the bucket's)."""
    return generation.start(
        model, *left_padded(prompts), max_new_tokens=new
    ).static.decoding.capacity


def test_which_loops_transpose_which_weights(untied, tmp_path):
    _, model = untied
    loop = steps(model, PROMPTS, NEW)
    expected = {f"model.layers.{i}.{p}.weight" for i in range(2) for p in PROJECTIONS} | {
        "lm_head.weight"
    }
    # float32: multiplied columns first, which a copy would defeat.
    assert decode_layout.transposed_weights(model, rows=2, steps=loop) == frozenset()
    assert decode_layout.transposed_weights(model, rows=8, steps=loop) == frozenset()
    # 16-bit weights: from eight rows (two and four measured no faster), in loops long enough to pay.
    _, half = llama(tmp_path / "bf16", tied=False, dtype="bfloat16")
    assert decode_layout.transposed_weights(half, rows=4, steps=loop) == frozenset()
    assert decode_layout.transposed_weights(half, rows=8, steps=loop) == expected
    short = steps(model, PROMPTS, NEW // 2)
    assert decode_layout.transposed_weights(half, rows=8, steps=short) == frozenset()
    # Tied: the table serves the embedding (rows gathered) and the output layer; it keeps its layout.
    _, tied = llama(tmp_path / "tied", tied=True, dtype="bfloat16")
    assert decode_layout.transposed_weights(tied, rows=8, steps=loop) == expected - {
        "lm_head.weight"
    }


def _loop_products(hlo: str) -> list[tuple[str, str, str]]:
    """Every linear layer's product inside the decode loop: its result shape and contracted dimensions."""
    return re.findall(
        r"= f32\[([\d,]+)\][^\n]* dot\([^\n]*lhs_contracting_dims=\{(\d)\}, rhs_contracting_dims=\{(\d)\}"
        r"[^\n]*op_name=\"[^\"]*/while/body/linear/",
        hlo,
    )


def test_decode_loop_multiplies_by_the_transposed_copy(tmp_path):
    # The copy is made once, before the loop; XLA must not fold it back into [out, in] products inside.
    _, half = llama(tmp_path / "bf16", tied=False, dtype="bfloat16")
    prompts = PROMPTS * 4  # eight rows
    hlo = generation.lower(half, *left_padded(prompts), max_new_tokens=NEW).compile().as_text()
    # Contracted dimension of the weight in every linear layer's product inside the loop: 0 for [in, out].
    products = re.findall(
        r"rhs_contracting_dims=\{(\d)\}, [^\n]*op_name=\"[^\"]*/while/body/linear/", hlo
    )
    assert products == ["0"] * (2 * len(PROJECTIONS) + 1), products


def test_float32_loop_multiplies_columns_first(untied):
    # [out, in] weight times [rows, in] rows, contracted over both ins: an [out, rows] product.
    _, model = untied
    hlo = generation.lower(model, *left_padded(PROMPTS), max_new_tokens=NEW).compile().as_text()
    products = _loop_products(hlo)
    assert len(products) == 2 * len(PROJECTIONS) + 1, products
    assert all(
        shape.endswith(",2") and (left, right) == ("1", "1") for shape, left, right in products
    ), products


def test_tokens_are_transformers_tokens(untied):
    reference, model = untied
    ids, mask = left_padded(PROMPTS)
    options = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    expected = reference_generate(reference, ids, mask, **options)
    np.testing.assert_array_equal(np.asarray(model.generate(ids, mask, **options)), expected)
