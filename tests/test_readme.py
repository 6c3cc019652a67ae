"""The README's Python blocks run as written, against a tiny local model in place of the Hub id they name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
#: The model the README's blocks name; the test points them at a tiny local folder instead.
README_MODEL = '"google/gemma-3-270m"'


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_the_readme_has_python_blocks_naming_the_model():
    blocks = python_blocks()
    assert blocks and all(README_MODEL in block for block in blocks)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index, tmp_path, capsys):
    import transformers

    from hfax.testing import save_tiny, save_tiny_tokenizer, tiny_config

    directory = tmp_path / "tiny-gemma"
    save_tiny(tiny_config("gemma"), directory)
    save_tiny_tokenizer(directory)
    source = python_blocks()[index].replace(README_MODEL, repr(str(directory)))
    scope: dict = {}
    exec(compile(source, f"README.md python block {index}", "exec"), scope)
    if "tokens" in scope:  # the generate example: the prompt comes back, followed by 32 tokens
        assert scope["tokens"].shape == (1, scope["inputs"]["input_ids"].shape[1] + 32)
    assert isinstance(scope["tokenizer"], transformers.PreTrainedTokenizerBase)
    assert capsys.readouterr().out.strip()
