"""hfax-core names no architecture: no module, table or branch of its code is named for one of
transformers' model types or for one of their classes. What one architecture needs lives in the family
plugin that claims it (hfax-patches-longtail, -llama, -gemma), which declares the transformers versions it
was tested on and can be blocked by name.

The check reads the code's tokens, so prose is free to give examples (a hook spec's docstring shows a
"llama" family, a comment may say why): a name is an identifier equal to a model type or a class name
(``XLMModel``, ``modeling_xlm``'s ``xlm``), or a piece of a string literal, split at dots, slashes, colons,
spaces and brackets, equal to one (``"xlm"``, ``"transformers.models.xlm"``, ``"WhisperForConditionalGeneration"``).
A model id such as ``google/gemma-3-270m`` (the CLI's help) is a model, not an architecture's branch.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
import transformers
from transformers.models.auto import configuration_auto

SOURCE = Path(__file__).resolve().parents[1] / "src" / "hfax"

#: Model types that are also the generic words core's code uses in their plain sense, each with that sense:
#: transformers' composite ``encoder-decoder`` classes name a kind of model, not an architecture, and
#: beam search keeps a ``beam`` per hypothesis (transformers 5.24 added a model type of that name).
GENERIC = {
    "beam": "one hypothesis of beam search",
    "encoder-decoder": "any encoder-decoder model",
    "vision-encoder-decoder": "any vision encoder with a text decoder",
    "speech-encoder-decoder": "any speech encoder with a text decoder",
}


def _names() -> frozenset[str]:
    """Every model type of transformers' auto mappings and every class name they map one to."""
    types = set(configuration_auto.CONFIG_MAPPING_NAMES) - set(GENERIC)
    classes = set(configuration_auto.CONFIG_MAPPING_NAMES.values())
    for mapping in _model_mappings():
        for value in mapping.values():
            classes.update((value,) if isinstance(value, str) else value)
    return frozenset(types | classes)


def _model_mappings() -> list[dict[str, str | tuple[str, ...]]]:
    """The ``*_MAPPING_NAMES`` tables of transformers' ``modeling_auto``, read from its source: without
    torch (hfax-core's own session) importing that module gives transformers' placeholder."""
    path = Path(transformers.__file__).parent / "models" / "auto" / "modeling_auto.py"
    mappings = []
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(target, "id", "") for target in node.targets][0].endswith("_MAPPING_NAMES")
            and isinstance(node.value, ast.Call)
            and node.value.args
        ):
            try:
                mappings.append(dict(ast.literal_eval(node.value.args[0])))
            except ValueError:  # a table built from others, whose entries are in them
                continue
    return mappings


NAMES = _names()
PIECES = re.compile(r"[\s./:,;()\[\]{}<>'\"=`|]+")


def named_architectures(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` for every identifier or string-literal piece of ``source``'s code that is a model
    type or a model class; docstrings and comments (prose) are not read."""
    found = []
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.string in NAMES:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and previous not in (
            tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT
        ):  # fmt: skip
            # A string that opens a logical line is a docstring (or a bare string: prose either way).
            found += [(token.start[0], p) for p in PIECES.split(token.string) if p in NAMES]
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return found


def test_the_check_finds_a_table_a_branch_and_an_import_but_not_prose():
    source = '''
def patch(model):
    """A docstring may say xlm."""
    # so may a comment: whisper
    if model.config.model_type == "xlm":
        from transformers.models.whisper import WhisperForConditionalGeneration
    TABLE = {"transformers.models.prophetnet": 1}
    return "google/gemma-3-270m or an encoder-decoder"
'''
    assert named_architectures(source) == [
        (5, "xlm"),
        (6, "whisper"),
        (6, "WhisperForConditionalGeneration"),
        (7, "prophetnet"),
    ]


def test_the_names_cover_transformers_model_types_and_classes():
    assert {
        "llama",
        "gemma3",
        "xlm",
        "whisper",
        "prophetnet",
        "LlamaForCausalLM",
        "XLMModel",
    } <= NAMES
    assert len(NAMES) > 1000


@pytest.mark.parametrize(
    "path", sorted(SOURCE.rglob("*.py")), ids=lambda path: str(path.relative_to(SOURCE))
)
def test_hfax_core_names_no_architecture(path):
    found = named_architectures(path.read_text())
    assert not found, (
        f"{path} names architectures (move them to the family plugin that claims them): {found}"
    )
