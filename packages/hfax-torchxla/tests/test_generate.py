"""What the PyTorch/XLA backend promises beyond tests/test_parity.py: programs compiled per bucket, no CPU
fallbacks in decoding, the compile budget."""

import numpy as np
import pytest
import torch

from hfax.backends.torchxla import generation, runtime
from hfax.testing import as_numpy, assert_same_continuation, reference_generate

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


@pytest.mark.parametrize("name", ["llama", "gemma", "gpt2"])
def test_decoding_runs_no_operation_on_the_cpu(tiny, name):
    _, _, model = tiny(name)
    model.generate(np.array([PROMPTS[1]]), max_new_tokens=20)  # compiled, so only running is measured
    before = runtime.counters()
    model.generate(np.array([PROMPTS[1]]), max_new_tokens=20, do_sample=True, top_k=5, top_p=0.9, seed=1)
    model.generate(np.array([PROMPTS[1]]), max_new_tokens=20)
    assert (runtime.counters() - before).fallbacks == {}


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


def test_max_new_tokens_0_returns_the_prompt(tiny):
    _, _, model = tiny("llama")
    ids = np.array([PROMPTS[0]])
    out = model.generate(ids, max_new_tokens=0)
    assert out.device.type == "xla"
    np.testing.assert_array_equal(as_numpy(out), ids)
