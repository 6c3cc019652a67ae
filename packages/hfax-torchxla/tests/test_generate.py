"""What the PyTorch/XLA backend promises beyond tests/test_parity.py: programs compiled per bucket, no CPU
fallbacks in decoding, the compile budget."""

import numpy as np
import pytest
import torch

from hfax.backends.torchxla import generation, linear, runtime
from hfax.testing import (
    as_numpy,
    assert_same_continuation,
    left_padded,
    reference_generate,
    save_tiny,
    tiny_config,
)

PROMPTS = [[1, 5, 9, 23, 7, 3], [1, 4, 8], [1, 6, 100, 12, 7]]


@pytest.mark.parametrize("name", ["llama", "gemma", "gpt2"])
def test_a_32_token_generation_compiles_one_bucket_then_nothing(tiny, name):
    _, ref, model = tiny(name)
    ids = np.array([PROMPTS[0]])
    before = runtime.counters()
    out = model.generate(ids, max_new_tokens=32)
    first = runtime.counters() - before
    # One bucket (batch 1, prompt 16, 32 new tokens): the prefill graph and the decode step, plus the small
    # graphs that move settings to the device. transformers' own generate compiles ~2.6 graphs per token.
    assert 2 <= first.compiles <= generation.PROGRAMS_PER_BUCKET, first
    assert model.last_generate_stats.compiles == first.compiles
    assert_same_continuation(reference_generate(ref, ids, max_new_tokens=32), out, pad_token_id=0)
    before, traced = runtime.counters(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for prompt in PROMPTS:  # the same bucket: nothing new to compile, nor to trace
        model.generate(np.array([prompt]), max_new_tokens=17 + len(prompt))
    again = runtime.counters() - before
    assert again.compiles == 0, again
    # Each call's KV cache is new; dynamo must not guard on the buffers' identity and trace the step again.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == traced
    assert model.last_generate_stats.tokens_per_second > 0


def test_new_processor_settings_compile_and_trace_nothing(tiny):
    # The processors' settings are tensors of the step, not Python constants dynamo would guard on.
    _, _, model = tiny("llama")
    ids = np.array([PROMPTS[1]])
    settings = dict(max_new_tokens=12, min_new_tokens=12, do_sample=True, top_p=0.9, seed=1)
    model.generate(ids, temperature=0.7, repetition_penalty=1.2, top_k=5, **settings)
    before, traced = runtime.counters(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    model.generate(ids, temperature=1.3, repetition_penalty=1.5, top_k=9, **settings)
    assert (runtime.counters() - before).compiles == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == traced


@pytest.mark.parametrize("name", ["llama", "gemma", "gpt2"])
def test_decoding_runs_no_operation_on_the_cpu(tiny, name):
    _, _, model = tiny(name)
    model.generate(
        np.array([PROMPTS[1]]), max_new_tokens=20
    )  # compiled, so only running is measured
    before = runtime.counters()
    model.generate(
        np.array([PROMPTS[1]]), max_new_tokens=20, do_sample=True, top_k=5, top_p=0.9, seed=1
    )
    model.generate(np.array([PROMPTS[1]]), max_new_tokens=20)
    assert (runtime.counters() - before).fallbacks == {}


def test_linears_are_patched_at_load_and_read_copies_only_while_held(tiny):
    _, _, model = tiny("llama")
    linears = [m for m in model.module.modules() if type(m) is torch.nn.Linear]
    assert linears and all(
        m.forward.__func__ is linear.forward for m in linears
    )  # the patch hook's
    assert not linear.wanted("CPU", None, rows=1, capacity=linear.TRANSPOSE_FROM_STEPS)  # one row
    assert not linear.wanted(
        "CPU", None, rows=2, capacity=linear.TRANSPOSE_FROM_STEPS // 2
    )  # short
    assert linear.wanted("CPU", None, rows=2, capacity=linear.TRANSPOSE_FROM_STEPS)
    copies = linear.copies(model.module)
    assert set(copies) == set(linears)
    with linear.held(copies):
        for module in linears:
            copy = getattr(module, linear.IN_OUT)
            torch.testing.assert_close(copy.cpu(), module.weight.cpu().t(), rtol=0, atol=0)
            x = torch.randn(3, module.in_features).to(copy.device)
            torch.testing.assert_close(
                module(x).cpu(), torch.nn.functional.linear(x, module.weight, module.bias).cpu()
            )
            # The forward reads the copy, not the weight: a doubled copy doubles the product.
            module.__dict__[linear.IN_OUT] = 2 * copy
            doubled = torch.nn.functional.linear(x, 2 * module.weight, module.bias)
            torch.testing.assert_close(module(x).cpu(), doubled.cpu())
    assert not any(hasattr(module, linear.IN_OUT) for module in linears)  # held only within


@pytest.fixture(scope="module")
def spread_llama(tmp_path_factory):
    """The tiny Llama with weights its tokens depend on (``spread``), and its PyTorch twin."""
    import hfax

    directory = tmp_path_factory.mktemp("llama-spread")
    reference = save_tiny(tiny_config("llama"), directory, spread=True)
    return reference, hfax.AutoModelForCausalLM.from_pretrained(str(directory), backend="torch_xla")


def test_a_batched_long_call_chooses_pytorch_tokens_and_compiles_once(spread_llama):
    # Rows and new tokens enough for the [in, out] copies (linear.copies): prefill and every step read them.
    ref, model = spread_llama
    ids, mask = left_padded(PROMPTS)
    new = linear.TRANSPOSE_FROM_STEPS
    out = model.generate(ids, mask, max_new_tokens=new, min_new_tokens=new)
    np.testing.assert_array_equal(
        as_numpy(out), reference_generate(ref, ids, mask, max_new_tokens=new, min_new_tokens=new)
    )
    before, traced = runtime.counters(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    model.generate(
        *left_padded(PROMPTS[::-1]), max_new_tokens=new - 5, min_new_tokens=new - 5
    )  # the same bucket, new copies
    assert (runtime.counters() - before).compiles == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == traced
    assert not hasattr(model.module.model.layers[0].mlp.gate_proj, linear.IN_OUT)


def test_bfloat16_copies_are_float32_and_change_no_token(tmp_path, monkeypatch):
    # XLA:CPU computes a bfloat16 product in float32, converting the weights on every step; the copies are
    # that conversion, made once per call. The tokens must be exactly those of the bfloat16 weights.
    import hfax

    reference = save_tiny(tiny_config("llama"), tmp_path, spread=True).to(torch.bfloat16)
    model = hfax.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), backend="torch_xla", dtype="bfloat16"
    )
    ids, mask = left_padded(PROMPTS)
    new = linear.TRANSPOSE_FROM_STEPS
    copy = linear.copies(model.module)[model.module.model.layers[0].mlp.down_proj]
    assert copy.dtype == torch.float32
    torch.testing.assert_close(
        copy.cpu(),
        model.module.model.layers[0].mlp.down_proj.weight.cpu().t().float(),
        rtol=0,
        atol=0,
    )
    copied = as_numpy(model.generate(ids, mask, max_new_tokens=new, min_new_tokens=new))
    monkeypatch.setattr(linear, "TRANSPOSE_FROM_STEPS", new + 1)  # the same bucket without copies
    np.testing.assert_array_equal(
        copied, as_numpy(model.generate(ids, mask, max_new_tokens=new, min_new_tokens=new))
    )
    # And PyTorch's bfloat16 model chooses the same tokens (the first 32; later, rounding may break a near tie).
    expected = reference_generate(reference, ids, mask, max_new_tokens=32, min_new_tokens=32)
    np.testing.assert_array_equal(copied[:, : expected.shape[1]], expected)


def test_past_the_budget_requests_run_in_a_bucket_that_holds_them(tiny, monkeypatch):
    _, ref, model = tiny("gpt2")
    long_prompt = np.array([list(range(3, 40))])  # prompt bucket 64
    model.generate(long_prompt, max_new_tokens=40)  # capacity 64
    monkeypatch.setenv("HFAX_TORCHXLA_COMPILE_BUDGET", "0")
    ids = np.array([PROMPTS[2]])  # prompt bucket 16, capacity 16: runs in the (64, 64) bucket
    before = runtime.counters().compiles
    out = model.generate(ids, max_new_tokens=10)
    assert runtime.counters().compiles == before
    assert_same_continuation(reference_generate(ref, ids, max_new_tokens=10), out, pad_token_id=0)
    with pytest.raises(generation.CompileBudgetError, match="HFAX_TORCHXLA_COMPILE_BUDGET"):
        model.generate(np.array([PROMPTS[0]] * 3), max_new_tokens=4)  # batch 4: no bucket holds it


def test_torch_in_torch_out_on_the_input_device(tiny):
    _, ref, model = tiny("llama")
    ids = torch.tensor([PROMPTS[0]])
    out = model.generate(ids, max_new_tokens=6)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.dtype == torch.int64
    on_xla = model.generate(ids.to(runtime.device()), max_new_tokens=6)
    assert on_xla.device.type == "xla"
    expected = reference_generate(ref, ids.numpy(), max_new_tokens=6)
    assert_same_continuation(expected, out, pad_token_id=0)
    np.testing.assert_array_equal(as_numpy(on_xla), as_numpy(out))


def test_beam_search_reads_every_calls_settings_in_its_compiled_step(tmp_path):
    # The step is traced in the first call, whose prompt width equals its limit (6 and 6); later calls in
    # the same bucket bring other widths, limits and a length penalty: torch_xla gave equal 0-d host values
    # one buffer, and the traced step kept reading the first call's (generation._on_device).
    import hfax

    reference = save_tiny(tiny_config("llama"), tmp_path, spread=True)
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="torch_xla")
    options = dict(
        max_new_tokens=6,
        num_beams=2,
        do_sample=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    calls = [(PROMPTS[0], {}), (PROMPTS[2], {}), (PROMPTS[1], dict(length_penalty=1.5))]
    for number, (prompt, extra) in enumerate(calls):
        ids = np.array([prompt])
        got = model.generate(ids, **options, **extra)
        with torch.no_grad():
            want = reference.generate(torch.as_tensor(ids), **options, **extra)
        np.testing.assert_array_equal(as_numpy(got.sequences), want.sequences.numpy())
        np.testing.assert_allclose(
            as_numpy(got.sequences_scores), want.sequences_scores.numpy(), atol=1e-4
        )
        if number:
            assert model.last_generate_stats.compiles == 0
