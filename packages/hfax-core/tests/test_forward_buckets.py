"""Which forward calls run padded into a bucket, how they are padded, and what comes back
(:mod:`hfax.forward_buckets`); the values against transformers are checked on the JAX backend
(packages/hfax-jax/tests/test_forward.py) and by the coverage sweep's compiled-forward column."""

import types

import numpy as np
import pytest

from hfax import forward_buckets


class _Module:
    """What :func:`forward_buckets.pads` reads of a transformers model (kept per model by weak reference)."""

    def __init__(self, encoder_decoder=False, generates=True, router_logits=False):
        self.config = types.SimpleNamespace(
            is_encoder_decoder=encoder_decoder, output_router_logits=router_logits
        )
        self.generates = generates

    def can_generate(self):
        return self.generates


_module = _Module


IDS = np.arange(15).reshape(3, 5)


@pytest.mark.parametrize(
    ("module", "inputs", "expected"),
    [
        (_module(), {"input_ids": IDS, "use_cache": False}, True),
        (_module(), {"input_ids": IDS, "attention_mask": np.ones_like(IDS)}, True),
        (_module(), {"input_ids": IDS, "attention_mask": np.ones((3, 4))}, False),
        (_module(), {"input_ids": IDS, "labels": IDS}, False),
        (_module(), {"input_ids": IDS, "output_hidden_states": True}, False),
        (_module(), {"input_ids": IDS, "use_cache": True}, False),
        (_module(), {"input_ids": IDS, "return_dict": False}, False),
        (_module(), {"input_ids": IDS[0]}, False),
        (_module(), {"input_ids": IDS.astype(np.float32)}, False),
        (_module(), {"attention_mask": IDS}, False),
        (_module(encoder_decoder=True), {"input_ids": IDS}, False),
        (_module(generates=False), {"input_ids": IDS}, False),
        (_module(router_logits=True), {"input_ids": IDS}, False),
    ],
)
def test_only_a_language_models_ids_and_mask_are_padded(module, inputs, expected):
    assert forward_buckets.pads(module, inputs) is expected


def test_ids_pad_right_into_a_bucket_with_the_first_row_repeated():
    mask = np.ones_like(IDS)
    mask[1, :2] = 0
    padded, padding = forward_buckets.padded({"input_ids": IDS, "attention_mask": mask})
    assert padding == forward_buckets.Padding(rows=3, length=5)
    assert padded["input_ids"].shape == padded["attention_mask"].shape == (4, 16)
    np.testing.assert_array_equal(padded["input_ids"][:3, :5], IDS)
    np.testing.assert_array_equal(padded["attention_mask"][:3, :5], mask)
    assert not padded["attention_mask"][:, 5:].any() and not padded["input_ids"][:3, 5:].any()
    np.testing.assert_array_equal(padded["input_ids"][3], padded["input_ids"][0])
    np.testing.assert_array_equal(padded["attention_mask"][3], padded["attention_mask"][0])
    alone, _ = forward_buckets.padded({"input_ids": IDS[:1, :3]})
    assert (
        alone["input_ids"].shape == (1, 16)
        and alone["attention_mask"][0].tolist() == [1] * 3 + [0] * 13
    )


class _Output(dict):
    def __init__(self, **fields):
        super().__init__(**fields)


def test_the_logits_are_cut_back_and_anything_else_is_not_cut():
    padding = forward_buckets.Padding(rows=3, length=5)
    logits = np.arange(4 * 16 * 2).reshape(4, 16, 2)
    cut = forward_buckets.cut(_Output(logits=logits, loss=None), padding)
    assert type(cut) is _Output and cut["logits"].shape == (3, 5, 2)
    np.testing.assert_array_equal(cut["logits"], logits[:3, :5])
    assert forward_buckets.cut(_Output(logits=logits, aux_loss=np.float32(1)), padding) is None
    assert forward_buckets.cut((logits,), padding) is None
