"""Every hook is documented, in its docstring (with an example) and in docs/PLUGINS.md (datasette's habit)."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import pytest

from hfax import hookspecs

PLUGINS_DOC = Path(__file__).resolve().parents[3] / "docs" / "PLUGINS.md"
HOOKS = sorted(name for name in vars(hookspecs) if name.startswith("hfax_"))


def example(hook: str) -> str:
    docstring = inspect.getdoc(getattr(hookspecs, hook)) or ""
    _, found, rest = docstring.partition("Example::\n")
    assert found, f"{hook}'s docstring has no 'Example::' block"
    return textwrap.dedent(rest)


def test_the_hooks_the_design_needs_exist():
    assert {
        "hfax_detect_model",
        "hfax_patch_model",
        "hfax_compile_step",
        "hfax_shard_weights",
    } <= set(HOOKS)
    assert {"hfax_backends", "hfax_families", "hfax_sharding_plan"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_docstring_has_an_example_that_parses(hook):
    compile(example(hook), f"<{hook} example>", "exec")


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_with_its_signature(hook):
    arguments = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    heading = re.compile(rf"^#+ `{re.escape(hook)}\({re.escape(arguments)}\)`", re.MULTILINE)
    assert heading.search(PLUGINS_DOC.read_text()), (
        f"docs/PLUGINS.md needs a heading `{hook}({arguments})`"
    )


def test_environment_switches_are_documented():
    text = PLUGINS_DOC.read_text()
    for switch in (
        "HFAX_DISABLE_PLUGINS",
        "HFAX_PLUGINS",
        "HFAX_BLOCK_PLUGINS",
        "HFAX_STRICT_PLUGINS",
    ):
        assert switch in text
