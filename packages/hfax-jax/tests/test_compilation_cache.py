import os
import subprocess
import sys

import jax
import numpy as np
import pytest

SCRIPT = """
import json, sys, jax, numpy as np
hits = []
jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None)
import hfax
model = hfax.AutoModelForTPU.from_pretrained(sys.argv[1], backend="jax")
forward, forwards = model.module.forward, []
model.module.forward = lambda *args, **kwargs: (forwards.append(1), forward(*args, **kwargs))[1]
tokens = np.asarray(model.generate(np.array([[1, 5, 9]]), max_new_tokens=8)).tolist()
print(json.dumps({"tokens": tokens, "hits": len(hits), "forwards": len(forwards)}))
"""


@pytest.fixture
def run_twice(tiny, tmp_path):
    """Generate in a fresh process with ``tmp_path`` as hfax's cache; returns what it printed."""
    import json

    directory, _, _ = tiny("gpt2")

    def run(**extra_env: str) -> dict:
        env = {**os.environ, "HFAX_CACHE": str(tmp_path), **extra_env}
        if "HFAX_NO_COMPILATION_CACHE" not in extra_env:
            env.pop("HFAX_NO_COMPILATION_CACHE", None)
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(directory)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def test_a_second_process_reads_programs_from_the_persistent_cache(run_twice, tmp_path):
    first = run_twice()
    assert first["hits"] == 0 and any((tmp_path / "jax").iterdir())
    assert (
        first["forwards"] == 2
    )  # the model's Python forward, traced for prefill and for the decode step
    second = run_twice()
    assert second["tokens"] == first["tokens"]
    assert (
        second["hits"] >= 1
    )  # the generate program came from disk instead of being compiled again
    # ... and the model was not traced again: the traced program came from disk too (programs.py)
    assert second["forwards"] == 0


def test_an_unreadable_traced_program_is_traced_again(run_twice, tmp_path):
    first = run_twice()
    (stored,) = (tmp_path / "jax" / "hfax-programs").glob("generate-*.bin")
    stored.write_bytes(b"not a program")
    second = run_twice()
    assert second["tokens"] == first["tokens"]
    assert second["forwards"] == 2
    assert stored.read_bytes() != b"not a program"  # replaced by the new trace


def test_no_compilation_cache_keeps_no_traced_programs(run_twice, tmp_path):
    run_twice(HFAX_NO_COMPILATION_CACHE="1")
    assert not (tmp_path / "jax" / "hfax-programs").exists()


def test_the_key_follows_what_the_trace_depends_on(tmp_path):
    import torch
    import transformers
    from hfax.backends.jax import programs

    def llama(**overrides):
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            **overrides,
        )
        return transformers.LlamaForCausalLM(config)

    torch.manual_seed(0)
    a, b = llama(), llama()
    assert programs.model_fingerprint(a, "llama") == programs.model_fingerprint(
        b, "llama"
    )  # weights are arguments
    assert programs.model_fingerprint(a, "llama") != programs.model_fingerprint(a, "generic")
    assert programs.model_fingerprint(a, "llama") != programs.model_fingerprint(
        llama(rope_theta=500.0), "llama"
    )
    eager = llama()
    eager.config._attn_implementation = "eager"
    assert programs.model_fingerprint(a, "llama") != programs.model_fingerprint(eager, "llama")

    from hfax.patching import Patcher, unpatch

    before = programs.model_fingerprint(b, "llama")
    Patcher(b).setattr(b.model, "some_switch", True)
    assert programs.model_fingerprint(b, "llama") != before
    unpatch(b)
    assert programs.model_fingerprint(b, "llama") == before

    x = jax.numpy.zeros((2, 3), jax.numpy.float32)
    key = programs.call_key("generate", ("static", 1), ({"w": x}, np.int32(3)))
    assert key == programs.call_key(
        "generate", ("static", 1), ({"w": x}, np.int32(4))
    )  # values do not matter
    assert key != programs.call_key("generate", ("static", 2), ({"w": x}, np.int32(3)))
    assert key != programs.call_key(
        "generate", ("static", 1), ({"w": x.astype(jax.numpy.bfloat16)}, np.int32(3))
    )
    assert key != programs.call_key("generate", ("static", 1), ({"v": x}, np.int32(3)))
    assert key != programs.call_key("generate", ("static", 1), ({"w": x[:1]}, np.int32(3)))
