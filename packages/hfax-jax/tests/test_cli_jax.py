"""``hfax generate`` and ``hfax chat`` on a tiny local model: prompts from stdin, a system prompt, the
model's own generation defaults, and errors found once a model is named."""

import numpy as np
import pytest
from typer.testing import CliRunner

from hfax.backends.jax.model import JaxModel
from hfax.cli import app
from hfax.testing import save_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tiny):
    directory, _, _ = tiny("llama")
    save_tiny_tokenizer(directory)
    return str(directory)


@pytest.fixture
def calls(monkeypatch):
    """Every generate call's prompt ids and settings, the call itself unchanged."""
    seen = []
    generate = JaxModel.generate

    def spy(self, input_ids, *args, **options):
        seen.append((np.asarray(input_ids), options))
        return generate(self, input_ids, *args, **options)

    monkeypatch.setattr(JaxModel, "generate", spy)
    return seen


def invoke(*args, stdin=None):
    result = CliRunner().invoke(app, list(args), input=stdin)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def test_a_dash_reads_the_prompt_from_stdin(model_dir, calls):
    from_argument = invoke("generate", "the capital of france is", "-m", model_dir, "-n", "4")
    from_stdin = invoke(
        "generate", "-", "-m", model_dir, "-n", "4", stdin="the capital of france is\n"
    )
    assert from_stdin.stdout == from_argument.stdout
    assert from_stdin.stdout.startswith("the capital of france is")
    np.testing.assert_array_equal(calls[0][0], calls[1][0])


def test_sampling_defaults_come_from_the_generation_config(model_dir, calls):
    invoke("generate", "one two", "-m", model_dir, "-n", "2")
    assert {"top_k", "top_p", "temperature", "do_sample"}.isdisjoint(calls[0][1])
    invoke("generate", "one two", "-m", model_dir, "-n", "2", "--top-k", "5", "--sample")
    assert calls[1][1]["top_k"] == 5 and calls[1][1]["do_sample"] is True


def test_chat_sends_the_system_prompt_first(model_dir, calls):
    from transformers import AutoTokenizer

    invoke("chat", "-m", model_dir, "-n", "2", "--system", "the sun is hot", stdin="good day\n\n")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.decode(calls[0][0][0])
    assert text.index("the sun is hot") < text.index("good day")


def test_a_mesh_the_devices_do_not_make_is_one_line(model_dir):
    result = CliRunner().invoke(app, ["generate", "hi", "-m", model_dir, "--mesh", "model=3"])
    assert result.exit_code == 2
    assert result.stderr.startswith("hfax: error: a mesh of {'model': 3} needs 3 devices")
