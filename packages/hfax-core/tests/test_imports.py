"""hfax-core imports no backend (``hfax.backends.*``) and no application (``hfax.serve``): they are plugins,
which core reaches only through hooks and :class:`hfax.Backend`. Nor does it import or ship the test
fixtures (``hfax.testing``, distribution hfax-testing): they name architectures, and require the core."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "hfax"
NOT_CORE = ("hfax.backends", "hfax.serve", "hfax.testing")


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module an ``import`` or ``from ... import`` names, with ``from hfax import serve`` read as
    ``hfax.serve``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return found


def forbidden(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in NOT_CORE)


def test_the_check_finds_each_way_of_importing_a_plugin_package():
    source = "import hfax.backends.jax\nfrom hfax.serve import app\nfrom hfax import serve\nimport hfax.servers"
    found = [module for module in imported_modules(ast.parse(source)) if forbidden(module)]
    assert found == ["hfax.backends.jax", "hfax.serve", "hfax.serve.app", "hfax.serve"]


@pytest.mark.parametrize(
    "path", sorted(SOURCE.rglob("*.py")), ids=lambda path: str(path.relative_to(SOURCE))
)
def test_core_imports_no_backend_no_server_and_no_fixtures(path):
    modules = imported_modules(ast.parse(path.read_text(), str(path)))
    assert not [module for module in modules if forbidden(module)]


def test_core_ships_no_test_fixtures():
    # Neither in the source tree nor in what the installed distribution records (a wheel's files; an
    # editable install records none of its sources).
    assert not (SOURCE / "testing.py").exists() and not (SOURCE / "testing").exists()
    recorded = [file.as_posix() for file in importlib.metadata.files("hfax-core") or []]
    assert not [path for path in recorded if path.startswith("hfax/testing")], recorded
