"""Tests of the long-tail families: every plugin problem fails the run, as in hfax's CI."""

from __future__ import annotations

import os

import pytest

from hfax import plugins

os.environ.setdefault("HFAX_STRICT_PLUGINS", "1")


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Plugins reloaded after the test sets its switches, and again after it."""
    monkeypatch.delenv("HFAX_BLOCK_PLUGINS", raising=False)
    plugins.reset_plugins()
    yield monkeypatch
    monkeypatch.undo()
    plugins.reset_plugins()
