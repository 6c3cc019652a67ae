import numpy as np
import pytest
import torch

from hfax.testing import as_numpy

IDS = np.array([[1, 5, 9, 23, 7, 3, 44, 101], [1, 17, 2, 8, 90, 64, 33, 12]])


def test_outputs_are_torch_tensors_on_the_xla_device(tiny):
    _, _, model = tiny("llama")
    out = model(input_ids=torch.as_tensor(IDS))
    assert isinstance(out.logits, torch.Tensor) and out.logits.device.type == "xla"
    assert model.device.type == "xla" and all(p.device.type == "xla" for p in model.params.values())


def test_inputs_may_be_numpy_cpu_or_xla_tensors(tiny):
    _, _, model = tiny("llama")
    want = as_numpy(model(input_ids=IDS).logits)
    for ids in (torch.as_tensor(IDS), torch.as_tensor(IDS).to(model.device)):
        np.testing.assert_array_equal(as_numpy(model(input_ids=ids).logits), want)


def test_tied_weights_stay_one_tensor(tiny):
    _, _, model = tiny("gemma")  # Gemma ties its output projection to the embedding
    assert model.module.lm_head.weight is model.module.get_input_embeddings().weight
    assert "lm_head.weight" not in model.params


def test_a_foreign_mesh_is_refused_with_the_way_out(tiny):
    from hfax.backends.torchxla.sharding import as_mesh

    with pytest.raises(TypeError, match="mapping of axis sizes"):
        as_mesh(object())


def test_a_forward_is_one_program_per_shape_without_host_syncs(tiny):
    from hfax.backends.torchxla import runtime

    _, _, model = tiny(
        "gpt2"
    )  # transformers' mask code would call padding_mask.all() on a lazy tensor
    mask = np.ones_like(IDS)
    mask[1, :2] = 0
    model.pad_forward = False  # each shape its own program (padded calls: the test below)
    try:
        before = runtime.counters()
        model(input_ids=IDS[:, :5], attention_mask=mask[:, :5]).logits.cpu()
        first = runtime.counters() - before
        assert first.compiles == 1 and first.fallbacks == {}, first
        before = runtime.counters()
        model(input_ids=IDS[:, 2:7], attention_mask=np.ones_like(mask[:, :5])).logits.cpu()
        assert runtime.counters() - before == runtime.Counters(0, 0.0, {})
    finally:
        model.pad_forward = True


def traced_graphs() -> int:
    """How many graphs dynamo has traced in this process (a compiled forward traces one per shape)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_calls_of_many_lengths_share_a_padded_program_and_give_transformers_logits(tiny):
    """``model(input_ids=...)`` of a language model runs padded into a bucket (:mod:`hfax.forward_buckets`):
    calls of 3x5, 4x11 and 3x16 ids share one ``[4, 16]`` program, and each call's logits have its own
    shape and transformers' values, with and without a (left-padded) mask; ``pad_forward = False`` runs a
    call at its own shape."""
    from hfax.backends.torchxla import runtime

    _, ref, model = tiny("llama")
    rng = np.random.default_rng(0)
    calls = [rng.integers(3, 90, size=shape) for shape in ((3, 5), (4, 11), (3, 16))]
    mask = np.ones((4, 11), np.int64)
    mask[1, :4] = 0
    model(input_ids=calls[0]).logits.cpu()  # the [4, 16] program compiles here
    before, graphs = runtime.counters(), traced_graphs()
    for ids, attention_mask in [(calls[1], None), (calls[1], mask), (calls[2], None)]:
        given = {"input_ids": torch.as_tensor(ids)}
        if attention_mask is not None:
            given["attention_mask"] = torch.as_tensor(attention_mask)
        got = model(**given).logits.cpu()
        assert got.shape == (*ids.shape, ref.config.vocab_size)
        with torch.no_grad():
            want = ref(**given).logits
        real = slice(None) if attention_mask is None else torch.as_tensor(attention_mask).bool()
        np.testing.assert_allclose(got[real].numpy(), want[real].numpy(), atol=1e-4)
    # [4, 11] and [3, 16] ran in the [4, 16] forward: no graph traced again, and the programs compiled
    # are the cuts of its logits (two slices, one per shape), not forwards.
    assert traced_graphs() == graphs and (runtime.counters() - before).compiles == 2
    model.pad_forward = False
    try:
        got = model(input_ids=calls[0]).logits.cpu()
        assert traced_graphs() == graphs + 1  # [3, 5] at its own shape
    finally:
        model.pad_forward = True
    with torch.no_grad():
        want = ref(input_ids=torch.as_tensor(calls[0])).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4)


def test_xlnet_keeps_its_memory_though_torch_xla_refuses_slices_from_before_the_start(tmp_path):
    # XLNet keeps the last mem_len (512) positions with `x[-512:]`, which torch_xla 2.9 refuses for
    # fewer than 512 positions; the xlnet family binds a clamped form on torch_xla.
    import transformers

    import hfax
    from hfax.testing import assert_same_logits, save_tiny

    config = transformers.XLNetConfig(
        d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=128, mem_len=512
    )
    reference = save_tiny(config, tmp_path, spread=True)
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="torch_xla")
    assert_same_logits(model, reference, [[5, 9, 23, 7, 3], [17, 2, 8]])
    mems = model(input_ids=IDS, use_mems=True).mems
    assert [tuple(mem.shape) for mem in mems] == [(IDS.shape[1], 2, 64)] * 2


def test_longformer_with_global_tokens_and_a_window_shorter_than_the_prompt(tmp_path):
    # Through torch_xla's dynamo bridge, transformers' Longformer (`.item()`, `nonzero`) broke the graph
    # and the compiled forward's logits were off by about 1; hfax.patches.longtail.longformer keeps it one graph.
    import hfax
    from hfax.testing import longformer_batch

    expected, inputs, real = longformer_batch(tmp_path)
    model = hfax.AutoModelForMaskedLM.from_pretrained(str(tmp_path), backend="torch_xla")
    logits = as_numpy(model(**inputs).logits)
    np.testing.assert_allclose(logits[real], expected[real], atol=1e-4, rtol=0)


def test_reformer_axial_positions_in_one_graph(tmp_path):
    # transformers' Reformer cuts its grid of axial positions at `position_ids.max().item()`, where dynamo
    # breaks the graph; hfax.patches.longtail.reformer looks the ids up in the whole grid.
    from torch._dynamo.utils import counters

    import hfax
    from hfax.testing import reformer_batch

    expected, inputs, real = reformer_batch(tmp_path)
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="torch_xla")
    counters.clear()
    logits = as_numpy(model(**inputs).logits)
    np.testing.assert_allclose(logits[real], expected[real], atol=1e-4, rtol=0)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_in_place_view_calls_compile_like_their_out_of_place_forms():
    # torch 2.9's functionalization fails on `x.unsqueeze_(...)` for XLA tensors; hfax rewrites dynamo's
    # graph so that later uses read the out-of-place view. Views taken before a call keep their shape.
    import torch_xla

    from hfax.backends.torchxla import inplace_views

    def shapes(x):
        y = x * 2
        before = y[0]
        y.unsqueeze_(0)
        y.transpose_(0, 1)
        moved = y + 1
        y.squeeze_(1)
        counts = torch.argmax(x, dim=-1)
        counts.unsqueeze_(1)
        return moved, before, y, counts * 3

    x = torch.arange(6.0).reshape(2, 3)
    compiled = torch.compile(shapes, backend=inplace_views.openxla_backend(), fullgraph=True)
    for got, want in zip(compiled(x.to(torch_xla.device())), shapes(x)):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_big_bird_question_answering_compiled(tmp_path):
    # BigBird's question answering marks the question with `question_lengths.unsqueeze_(1)` and
    # `logits_mask.unsqueeze_(2)`: hfax.backends.torchxla.inplace_views lets it compile.
    import transformers

    import hfax
    from hfax.testing import left_padded, reference_forward, save_tiny

    config = transformers.BigBirdConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, max_position_embeddings=64, attention_type="original_full", pad_token_id=0,
        sep_token_id=2,
    )  # fmt: skip
    reference = save_tiny(config, tmp_path, "AutoModelForQuestionAnswering", spread=True)
    ids, mask = left_padded([[1, 7, 9, 2, 30, 31, 32, 33, 2], [1, 12, 2, 40, 41, 2]])
    expected = reference_forward(reference, input_ids=ids, attention_mask=mask)
    model = hfax.AutoModelForTPU.from_pretrained(str(tmp_path), backend="torch_xla")
    output = model(input_ids=ids, attention_mask=mask)
    real = mask.astype(bool)
    for name in ("start_logits", "end_logits"):
        got, want = as_numpy(getattr(output, name)), getattr(expected, name).numpy()
        np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_encoder_decoder_classifiers_classify_each_rows_last_eos_compiled(tmp_path, family):
    # hfax.patches.longtail.eos_pooling gathers each row's last <eos> state instead of transformers' boolean index, and
    # refuses the batches transformers refuses before compiling.
    import hfax
    from hfax.testing import eos_classifier, reference_forward

    reference, inputs = eos_classifier(tmp_path, family)
    expected = reference_forward(reference, **inputs)
    model = hfax.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path), backend="torch_xla"
    )
    output = model(**inputs)
    np.testing.assert_allclose(as_numpy(output.logits), expected.logits.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(
        float(as_numpy(output.loss)), float(expected.loss), atol=1e-4, rtol=0
    )
    uneven = inputs["input_ids"].copy()
    uneven[0, -2] = 9  # row 0 keeps one <eos>, row 1 two
    with pytest.raises(ValueError, match="same number of <eos> tokens"):
        model(**{**inputs, "input_ids": uneven})


def test_a_forward_that_fails_inside_torch_xla_leaves_the_next_call_working(tiny, tmp_path):
    # Reformer's forward breaks the dynamo graph where torch_xla 2.9's bridge cannot resume it, leaving a
    # pending graph whose cached program does not fit it; the next sync anywhere used to fail on it.
    import transformers

    import hfax
    from hfax.testing import assert_same_logits, save_tiny

    config = transformers.ReformerConfig(
        hidden_size=64,
        attention_head_size=16,
        num_attention_heads=4,
        feed_forward_size=128,
        attn_layers=["local", "lsh"],
        axial_pos_shape=[16, 16],
        axial_pos_embds_dim=[32, 32],
        local_attn_chunk_length=64,
        lsh_attn_chunk_length=64,
        max_position_embeddings=256,
        is_decoder=True,
        vocab_size=128,
        pad_token_id=0,
        num_labels=3,
    )
    save_tiny(config, tmp_path, "AutoModelForSequenceClassification")
    reformer = hfax.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path), backend="torch_xla"
    )
    with pytest.raises(IndexError):
        reformer(input_ids=IDS)
    _, reference, model = tiny("gpt2")
    assert_same_logits(model, reference, [[5, 9, 23, 7, 3], [17, 2, 8]])
