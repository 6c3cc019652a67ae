"""torch operations hfax lowers itself (hfax.backends.jax.lowerings) agree with PyTorch on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hfax.backends.jax.runtime import env, to_array, to_tensor


def on_jax(fn, *tensors, **kwargs) -> np.ndarray:
    """``fn`` run by torchax on copies of CPU ``tensors``, as numpy."""
    import jax.numpy as jnp

    with env():
        return np.asarray(
            to_array(fn(*to_tensor([jnp.asarray(t.numpy()) for t in tensors]), **kwargs))
        )


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_attention_row_that_sees_no_key_is_zero_like_pytorch(mask_kind):
    # The row of a left-padding token may attend to nothing: PyTorch returns zeros, plain softmax NaN.
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=generator) for _ in range(3))
    allowed = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    allowed[1, :, :2, :] = False
    mask = allowed if mask_kind == "bool" else torch.where(allowed, 0.0, float("-inf"))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    actual = on_jax(torch.nn.functional.scaled_dot_product_attention, q, k, v, mask)
    assert not np.isnan(actual).any()
    np.testing.assert_allclose(actual, expected.numpy(), atol=1e-6)


def test_grouped_mm_matches_pytorch():
    # transformers' mixture-of-experts path: tokens sorted by expert, `offs` the cumulative rows per expert.
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randn(7, 8, generator=generator)
    experts = torch.randn(
        3, 8, 4, generator=generator
    )  # PyTorch's CPU kernel wants 16-byte strides
    offs = torch.tensor(
        [2, 2, 6], dtype=torch.int32
    )  # an empty group, and a row past the last group
    expected = torch._grouped_mm(tokens, experts, offs=offs)
    actual = on_jax(torch._grouped_mm, tokens, experts, offs)
    np.testing.assert_allclose(actual[:6], expected[:6].numpy(), atol=1e-5)


def test_copy_from_a_view():
    # Mamba's conv-state update: `conv_state.copy_(hidden[:, :, -kernel:])`, whose source is a torchax view.
    import jax.numpy as jnp

    with env():
        target = to_tensor(jnp.zeros((2, 3)))
        source = to_tensor(jnp.arange(10.0).reshape(2, 5))
        target.copy_(source[:, -3:])
        copied = np.asarray(to_array(target))
    np.testing.assert_array_equal(copied, [[2, 3, 4], [7, 8, 9]])


@pytest.mark.parametrize("compiled", [False, True])
def test_a_boolean_mask_writes_through_a_view_like_pytorch(compiled):
    # Longformer's `extended_mask[:, 0, 0, :][attention_mask == 2] = max`: the write reaches the source,
    # eagerly and inside jax.jit (where a boolean index has no static shape).
    import jax

    source = torch.arange(24.0).reshape(2, 3, 4)
    mask = torch.tensor([[True, False, False, True], [False, True, False, False]])

    def write(values, where):
        values[:, 0, :][where] = -1.0
        values[:, 1][where[:, :1].expand(2, 4)] = 7.0
        return values

    expected = write(source.clone(), mask).numpy()

    def on_torchax(values, where):
        with env():
            return to_array(write(to_tensor(values), to_tensor(where)))

    run = jax.jit(on_torchax) if compiled else on_torchax
    written = run(jax.numpy.asarray(source.numpy()), jax.numpy.asarray(mask.numpy()))
    np.testing.assert_array_equal(np.asarray(written), expected)


def test_type_as_converts_a_copy_and_takes_a_view():
    import jax.numpy as jnp

    with env():
        halves = to_tensor(jnp.ones((2, 3), jnp.bfloat16))
        floats = to_tensor(jnp.zeros((2, 5), jnp.float32))
        converted = halves.type_as(floats[:, :3])  # `other` a torchax view
        assert (
            converted.dtype == torch.float32 and halves.dtype == torch.bfloat16
        )  # `self` unchanged


def test_indexing_by_cpu_index_tensors_like_pytorch():
    # GOT-OCR2's (SAM's) relative positions: `table[coords.long()]`, coords made by a device-less arange.
    table = torch.arange(20.0).reshape(5, 4)
    rows = torch.arange(3)[:, None] - torch.arange(3)[None, :] + 2
    columns = torch.tensor([3, 0, 1])
    for index in (rows, (rows, columns), (slice(None), columns), [columns]):
        np.testing.assert_array_equal(
            on_jax(lambda t, index=index: t[index], table), table[index].numpy()
        )


def test_a_slice_between_two_counts_of_a_decode_step_is_gathered():
    # BERT's `position_ids[:, past : past + n]` at a decode step's traced count (CacheLength): a slice of
    # n elements wherever the count points, the same elements PyTorch slices.
    import jax
    import jax.numpy as jnp

    from hfax.backends.jax.cache import CacheLength

    table = np.arange(40).reshape(1, 40)

    def sliced(slot):
        with env():
            past = CacheLength(slot, 0, (1, 31))
            return to_array(to_tensor(jnp.asarray(table))[:, past : past + 5])

    for slot in (1, 7, 31):
        got = np.asarray(jax.jit(sliced)(jnp.int32(slot)))
        np.testing.assert_array_equal(got, table[:, slot : slot + 5])


@pytest.mark.parametrize("size", [4096, 32000, 50257, 262144])
def test_argmax_over_a_vocabulary_is_pytorchs_first_largest_index(size):
    # Blocked on XLA:CPU from 4096 elements (lowerings.argmax): the index is still the first largest
    # value's, ties across and inside blocks, NaN ranked first and minus infinity included.
    import jax

    from hfax.backends.jax import lowerings

    generator = torch.Generator().manual_seed(size)
    logits = torch.randn(6, size, generator=generator)
    logits[1, [5, size // 2, size - 1]] = 9.0  # a tie across blocks: the first wins
    logits[2, [size - 2, size - 1]] = 9.0  # a tie inside the last (padded) block
    logits[3, size - 1] = 9.0  # the largest in the last element
    logits[4] = float("-inf")  # nothing larger than minus infinity: index 0
    logits[5, [7, size - 3]] = float("nan")  # NaN ranks first, as in PyTorch
    logits[5, 3] = float("inf")
    for dim, keepdim, x in [
        (-1, False, logits),
        (1, True, logits),
        (0, False, logits.T.contiguous()),
    ]:
        expected = torch.argmax(x, dim=dim, keepdim=keepdim)
        actual = on_jax(torch.argmax, x, dim=dim, keepdim=keepdim)
        np.testing.assert_array_equal(actual, expected.numpy())
    expected = torch.argmax(logits[1])
    np.testing.assert_array_equal(on_jax(lambda t: torch.argmax(t), logits[1]), expected.numpy())
    np.testing.assert_array_equal(on_jax(lambda t: t.argmax(-1), logits), logits.argmax(-1).numpy())

    # The blocked form is what torch.argmax runs: the array is reduced as [rows, blocks, block].
    def traced(x):
        with env():
            return to_array(torch.argmax(to_tensor(x), dim=-1))

    block = 1 << (int(np.log2(size)) // 2)
    assert lowerings.BLOCKED_ARGMAX_FROM <= size
    text = jax.jit(traced).lower(np.zeros((2, size), np.float32)).as_text()
    assert f"tensor<2x{-(-size // block)}x{block}xf32>" in text
