"""The entry points' input checks (``hfax.validation``), shared by both backends (numpy here: hfax-core
is tested without torch; the backends' tests pass torch tensors)."""

from __future__ import annotations

import numpy as np
import pytest

from hfax import validation


def test_ids_inside_the_vocabulary_pass_whatever_the_array_type():
    for ids in (np.array([[0, 5, 9]]), np.array([[9]], np.int32), np.array([[3]], np.uint8)):
        validation.check_ids("input_ids", ids, vocab_size=10)


@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_ids_outside_the_vocabulary_raise_index_error(bad):
    with pytest.raises(IndexError, match=rf"input_ids holds token id {bad}, outside"):
        validation.check_ids("input_ids", np.array([[1, bad]], np.int64), vocab_size=10)


def test_float_ids_and_tuples_are_refused():
    with pytest.raises(TypeError, match="dtype float32"):
        validation.check_ids("input_ids", np.array([[1.0]], np.float32), vocab_size=10)
    with pytest.raises(TypeError, match="got a tuple"):
        validation.check_ids("input_ids", (1, 2), vocab_size=10)


def test_masks_of_the_ids_shape_or_4d_pass():
    inputs = {"input_ids": np.ones((2, 3), np.int64), "attention_mask": np.ones((2, 3))}
    validation.check_forward_inputs(inputs, vocab_size=10)
    validation.check_forward_inputs({**inputs, "attention_mask": np.ones((2, 1, 3, 3))}, 10)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(3, 2\)"):
        validation.check_forward_inputs({**inputs, "attention_mask": np.ones((3, 2))}, 10)


def test_decoder_ids_are_checked_too():
    with pytest.raises(IndexError, match="decoder_input_ids"):
        validation.check_forward_inputs({"decoder_input_ids": np.array([[11]])}, vocab_size=10)
