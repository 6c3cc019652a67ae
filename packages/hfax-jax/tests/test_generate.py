import numpy as np
import pytest

from hfax.backends.jax import monitor

PROMPTS = [[1, 5, 9, 23, 7, 3], [1, 4, 8], [1, 6, 100, 12, 7]]


def test_one_compile_per_bucket(tiny):
    _, _, model = tiny("gpt2")
    model.generate(np.array([PROMPTS[0]]), max_new_tokens=20)
    before = monitor.snapshot().compiles
    for prompt in PROMPTS:  # same buckets: batch 1, prompt <= 16, new <= 32
        model.generate(np.array([prompt]), max_new_tokens=17 + len(prompt))
    assert monitor.snapshot().compiles == before


def test_bad_settings_are_rejected_before_compiling(tiny):
    # Which settings are rejected, and with which words, is tests/test_parity.py's; here: before any compile.
    _, _, model = tiny("llama")
    before = monitor.snapshot().compiles
    with pytest.raises(ValueError, match="top_p"):
        model.generate(np.array([PROMPTS[0]]), max_new_tokens=4, top_p=0.0)
    assert monitor.snapshot().compiles == before
