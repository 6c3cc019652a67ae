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


def test_the_decode_loop_writes_its_cache_in_place(tiny):
    """On one device the decode loop updates its static cache in place: the program's temporaries hold
    less than a quarter of one cache. XLA keeps a copy of every buffer each step unless the write follows
    every read of it (:func:`hfax.backends.jax.cache.ordered_after`, which the step gives one logit column
    of each position); without that ordering the temporaries here hold more than the whole cache."""
    from hfax.backends.jax import generation

    _, _, model = tiny("llama")
    config = model.config
    ids = np.array([PROMPTS[0], PROMPTS[0]])
    new = 200
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rows, heads, layers = ids.shape[0], config.num_key_value_heads, config.num_hidden_layers
    cache_bytes = layers * 2 * rows * heads * (ids.shape[1] + new) * head_dim * 4  # float32
    lowered = generation.lower(model, ids, max_new_tokens=new)
    temporaries = lowered.compile().memory_analysis().temp_size_in_bytes
    assert temporaries < cache_bytes / 4, (temporaries, cache_bytes)
