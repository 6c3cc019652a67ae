import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

IDS = np.array([[1, 5, 9, 23, 7, 3, 44, 101], [1, 17, 2, 8, 90, 64, 33, 12]])


def test_inputs_may_be_numpy_jax_or_torch(tiny):
    _, _, model = tiny("llama")
    out = model(input_ids=IDS)
    assert isinstance(out.logits, jax.Array)
    want = np.asarray(out.logits)
    for ids in (jnp.asarray(IDS), torch.as_tensor(IDS)):
        np.testing.assert_array_equal(np.asarray(model(input_ids=ids).logits), want)


def test_apply_is_pure_and_jittable(tiny):
    _, _, model = tiny("llama")
    logits = jax.jit(
        lambda params, ids: model.apply(params, input_ids=ids, use_cache=False).logits
    )(model.params, IDS)
    np.testing.assert_allclose(
        np.asarray(logits), np.asarray(model(input_ids=IDS).logits), atol=1e-6
    )
    # Different weights through the same function give different answers: nothing was captured.
    halved = jax.tree_util.tree_map(lambda p: p * 0.5 if p.ndim == 2 else p, model.params)
    other = jax.jit(lambda params, ids: model.apply(params, input_ids=ids, use_cache=False).logits)(
        halved, IDS
    )
    assert not np.allclose(np.asarray(other), np.asarray(logits))


def test_apply_is_differentiable(tiny):
    _, ref, model = tiny("llama")

    def loss(params):
        return model.apply(params, input_ids=IDS, use_cache=False).logits.mean()

    grads = jax.grad(loss)(model.params)
    name = "model.layers.0.mlp.down_proj.weight"
    ref.zero_grad()
    ref(torch.as_tensor(IDS)).logits.mean().backward()
    np.testing.assert_allclose(
        np.asarray(grads[name]), dict(ref.named_parameters())[name].grad.numpy(), atol=1e-6
    )


def test_weights_are_arguments_not_constants(tiny):
    _, _, model = tiny("llama")
    forward = model.program("forward", type(model)._forward)
    text = forward.lower(
        model.params, {"input_ids": jnp.asarray(IDS, jnp.int32)}, static=(("use_cache", False),)
    ).as_text()
    constant_sizes = [
        np.prod([int(d) for d in shape.split("x")])
        for shape in re.findall(r"stablehlo\.constant dense<[^\n]*> : tensor<((?:\d+x)+)\w+>", text)
        for shape in [shape.rstrip("x")]
    ]
    assert max(constant_sizes, default=0) < 4096, (
        "a weight-sized constant was captured into the program"
    )
    # ... while every weight is an argument of the program.
    assert text.count("tensor<128x64xf32>") >= 1


def test_outputs_are_pytrees(tiny):
    _, _, model = tiny("llama")
    out = model(input_ids=IDS)
    leaves = jax.tree_util.tree_leaves(out)
    assert any(leaf is out.logits for leaf in leaves)
    doubled = jax.tree_util.tree_map(lambda x: x * 2, out)
    assert type(doubled) is type(out)


def test_a_returned_cache_is_a_pytree_of_arrays(tiny):
    _, _, model = tiny("llama")
    out = model(input_ids=IDS, use_cache=True)
    leaves = jax.tree_util.tree_leaves(out.past_key_values)
    assert leaves and all(isinstance(leaf, jax.Array) for leaf in leaves)
    assert leaves[0].shape[:2] == (2, 2)  # batch, kv heads


def test_a_returned_recurrent_cache_is_a_pytree_of_arrays(tiny):
    # Mamba's cache holds linear-attention layers (conv and SSM states), not key/value layers.
    _, ref, model = tiny("mamba")
    out = model(input_ids=IDS, use_cache=True)
    leaves = jax.tree_util.tree_leaves(out.cache_params)
    assert leaves and all(isinstance(leaf, jax.Array) for leaf in leaves)
    with torch.no_grad():
        expected = ref(input_ids=torch.as_tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(out.logits, expected, atol=1e-4)


@pytest.mark.parametrize(
    "ids, error, match",
    [
        (np.array([[1, -1, 3]]), IndexError, "token id -1, outside the vocabulary"),
        (np.array([[1, 128, 3]]), IndexError, "token id 128, outside the vocabulary"),
        (np.zeros((1, 0), np.int64), ValueError, "input_ids is empty"),
        (np.array([[True, False]]), TypeError, "integer token ids, got dtype bool"),
        (
            np.ones((1, 2, 3), np.int64),
            ValueError,
            r"shape \(batch, length\), got shape \(1, 2, 3\)",
        ),
        ([[1, 2, 3]], TypeError, "must be an array"),
    ],
)
def test_the_forward_refuses_ids_pytorch_refuses(tiny, ids, error, match):
    _, reference, model = tiny("gpt2")
    assert reference.config.vocab_size == 128
    with pytest.raises(error, match=match):
        model(ids)
    if error is IndexError:  # PyTorch's embedding raises too, where a compiled gather would not
        with pytest.raises(IndexError):
            reference(torch.tensor(ids))


def test_the_forward_refuses_a_mask_of_another_shape(tiny):
    _, _, model = tiny("gpt2")
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 2\) but input_ids has"):
        model(input_ids=np.array([[1, 2, 3]]), attention_mask=np.ones((1, 2), np.int64))


@pytest.mark.parametrize("config_class", ["XLMConfig", "FlaubertConfig"])
def test_a_model_checking_its_lengths_in_python_compiles(tmp_path, config_class):
    # XLM and Flaubert check their lengths against the width with `lengths.max().item()`, which a traced
    # count cannot answer (ConcretizationTypeError): given a padding mask, they get every row's width.
    import transformers

    import hfax
    from hfax.testing import left_padded, reference_forward, save_tiny

    config = getattr(transformers, config_class)(
        vocab_size=64, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64
    )
    reference = save_tiny(config, tmp_path, "AutoModelForMaskedLM", spread=True)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="jax")
    ids, mask = left_padded([[5, 17, 33, 9, 41, 8], [12, 50, 7]], pad_token_id=2)
    want = reference_forward(reference, input_ids=ids, attention_mask=mask).logits.numpy()
    got = np.asarray(model(input_ids=ids, attention_mask=mask).logits)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4)


def test_longformer_with_global_tokens_and_a_window_shorter_than_the_prompt(tmp_path):
    # transformers' Longformer branches on `.item()` and lists its global tokens with `nonzero`, and its
    # mask is written through a view by a boolean index: hfax.patches.longtail.longformer and the view lowering.
    import hfax
    from hfax.testing import longformer_batch

    expected, inputs, real = longformer_batch(tmp_path)
    model = hfax.AutoModelForMaskedLM.from_pretrained(str(tmp_path), backend="jax")
    for logits in (model(**inputs).logits, model.apply(model.params, **inputs).logits):
        np.testing.assert_allclose(np.asarray(logits)[real], expected[real], atol=1e-4, rtol=0)


def test_reformer_axial_positions_compiled(tmp_path):
    # transformers' Reformer cuts its grid of axial positions to the rows `position_ids.max().item()`
    # reaches: hfax.patches.longtail.reformer looks the ids up in the whole grid.
    import hfax
    from hfax.testing import reformer_batch

    expected, inputs, real = reformer_batch(tmp_path)
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    for logits in (model(**inputs).logits, model.apply(model.params, **inputs).logits):
        np.testing.assert_allclose(np.asarray(logits)[real], expected[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_encoder_decoder_classifiers_classify_each_rows_last_eos_compiled(tmp_path, family):
    # transformers selects the <eos> states with a boolean index, a data-dependent shape: hfax.patches.longtail.eos_pooling
    # gathers each row's last one, and refuses the batches transformers refuses before compiling.
    import hfax
    from hfax.testing import eos_classifier, reference_forward

    reference, inputs = eos_classifier(tmp_path, family)
    expected = reference_forward(reference, **inputs)
    model = hfax.AutoModelForSequenceClassification.from_pretrained(str(tmp_path), backend="jax")
    output = model(**inputs)
    np.testing.assert_allclose(
        np.asarray(output.logits), expected.logits.numpy(), atol=1e-4, rtol=0
    )
    np.testing.assert_allclose(float(output.loss), float(expected.loss), atol=1e-4, rtol=0)
    uneven = inputs["input_ids"].copy()
    uneven[0, -2] = 9  # row 0 keeps one <eos>, row 1 two
    with pytest.raises(ValueError, match="same number of <eos> tokens"):
        model(**{**inputs, "input_ids": uneven})
    np.testing.assert_allclose(
        np.asarray(model(**inputs).logits), expected.logits.numpy(), atol=1e-4, rtol=0
    )


def test_calls_of_many_lengths_share_a_padded_program_and_give_transformers_logits(tiny):
    """``model(input_ids=...)`` of a language model runs padded into a bucket (:mod:`hfax.forward_buckets`):
    calls of 3x5, 4x11 and 3x16 ids share one ``[4, 16]`` program, and each call's logits have its own shape and
    transformers' values, with and without a (left-padded) mask; torch in gives torch out."""
    from hfax.backends.jax import monitor

    _, ref, model = tiny("llama")
    rng = np.random.default_rng(0)
    calls = [rng.integers(3, 90, size=shape) for shape in ((3, 5), (4, 11), (3, 16), (1, 3))]
    mask = np.ones((4, 11), np.int64)
    mask[1, :4] = 0
    model(input_ids=calls[0])  # the [4, 16] program compiles here
    before = monitor.snapshot().compiles
    asked = [(calls[1], None), (calls[1], mask), (calls[2], None), (calls[0], None)]
    for ids, attention_mask in asked:
        given = {"input_ids": torch.as_tensor(ids)}
        if attention_mask is not None:
            given["attention_mask"] = torch.as_tensor(attention_mask)
        got = model(**given).logits
        assert isinstance(got, torch.Tensor) and got.shape == (*ids.shape, ref.config.vocab_size)
        with torch.no_grad():
            want = ref(**given).logits
        real = slice(None) if attention_mask is None else torch.as_tensor(attention_mask).bool()
        np.testing.assert_allclose(got[real].numpy(), want[real].numpy(), atol=1e-4)
    # [4, 11] and [3, 16] ran in the program compiled before.
    assert monitor.snapshot().compiles == before
    single = model(input_ids=calls[3]).logits  # numpy in: JAX out
    assert isinstance(single, jax.Array) and single.shape == (1, 3, ref.config.vocab_size)
    with torch.no_grad():
        want = ref(input_ids=torch.as_tensor(calls[3])).logits.numpy()
    np.testing.assert_allclose(np.asarray(single), want, atol=1e-4)


def test_torch_inputs_get_the_programs_logits_as_a_tensor_without_a_copy(tiny, monkeypatch):
    """Torch ids in: the logits come back as a tensor over the program's own buffer, not a copy (a forward's
    logits run to hundreds of megabytes); writing into it changes no later answer. An array the program was
    given and hands back unchanged is copied, so no tensor the caller gets writes into the weights."""
    from hfax.backends.jax import model as jax_model

    _, ref, model = tiny("llama")
    copies = []
    host_tensor = jax_model.host_tensor
    monkeypatch.setattr(
        jax_model, "host_tensor", lambda array: copies.append(array) or host_tensor(array)
    )
    ids = torch.as_tensor(IDS[:, :5])
    with torch.no_grad():
        want = ref(input_ids=ids).logits.numpy()
    got = model(input_ids=ids).logits
    assert copies == []
    # The cut logits are a view of the padded program's: their storage holds the whole bucket.
    assert got.untyped_storage().nbytes() > got.numel() * got.element_size()
    np.testing.assert_allclose(got.numpy(), want, atol=1e-4)
    got.fill_(0.0)
    np.testing.assert_allclose(model(input_ids=ids).logits.numpy(), want, atol=1e-4)

    weight = next(iter(model.params.values()))
    fresh = weight + 1
    torch_ids = {"input_ids": ids}
    out = jax_model._like_inputs({"given": weight, "fresh": fresh}, torch_ids, (model.params, {}))
    assert out["fresh"].data_ptr() == fresh.unsafe_buffer_pointer()
    assert out["given"].data_ptr() != weight.unsafe_buffer_pointer()
    np.testing.assert_array_equal(out["given"].numpy(), np.asarray(weight))


def test_a_call_that_asks_for_more_than_logits_runs_at_its_own_shape(tiny):
    """Hidden states (and anything but ids and a mask) are not padded: they come back at the call's shape."""
    _, ref, model = tiny("llama")
    out = model(input_ids=IDS[:, :5], output_hidden_states=True)
    assert out.logits.shape[:2] == (2, 5)
    assert all(h.shape[:2] == (2, 5) for h in out.hidden_states)
    with torch.no_grad():
        want = ref(input_ids=torch.as_tensor(IDS[:, :5]), output_hidden_states=True)
    np.testing.assert_allclose(
        np.asarray(out.hidden_states[-1]), want.hidden_states[-1].numpy(), atol=1e-4
    )


def test_a_family_that_reads_padding_runs_its_forward_at_the_calls_shape(tmp_path):
    """CPM-Ant takes a row's last non-zero ids as its tokens: its family (hfax-patches-longtail's
    ``cpmant``) says so (``no_forward_padding``), and its forward runs unpadded, with transformers' logits
    (padded on the right, they differ by about 5 here)."""
    import hfax
    from hfax.testing import save_tiny
    from hfax.testing.shrink import shrunk_config

    reference = save_tiny(shrunk_config("cpmant"), tmp_path, spread=True)
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    ids = np.random.default_rng(0).integers(3, 90, size=(2, 10))
    with torch.no_grad():
        want = reference(input_ids=torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(input_ids=ids).logits), want, atol=1e-4)
