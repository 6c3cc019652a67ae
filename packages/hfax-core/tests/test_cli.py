"""The ``hfax`` command line: ``plugins`` and ``env`` (``generate`` and ``chat`` need a backend)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hfax.cli import app
from hfax.plugins import PluginLoadWarning


def run(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_plugins_lists_every_plugin_with_its_status(
    install, family_plugin, broken_plugin, backend_plugin, monkeypatch
):
    install("hfax-broken", {"broken": "broken_plugin"}, {"broken_plugin": broken_plugin})
    install("hfax-fam", {"fam": "fam_family"}, {"fam_family": family_plugin("fam")})
    install("hfax-fake", {"fake": "fake_backend"}, {"fake_backend": backend_plugin})
    install(
        "hfax-blocked", {"blocked": "blocked_family"}, {"blocked_family": family_plugin("blocked")}
    )
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "blocked")
    with pytest.warns(PluginLoadWarning):
        output = run("plugins")
    lines = {line.split()[0]: line for line in output.splitlines() if not line.startswith(" ")}
    assert lines["hfax-core"].split()[1:4] == ["hfax-core", "0.1.0", "builtin"]
    assert lines["broken"].split()[1:4] == ["hfax-broken", "0.0.0", "failed"]
    assert lines["fam"].split()[1:4] == ["hfax-fam", "0.0.0", "loaded"] and lines["fam"].endswith(
        "family fam"
    )
    assert lines["fake"].split()[1:4] == ["hfax-fake", "0.0.0", "loaded"] and lines[
        "fake"
    ].endswith("backend fake")
    assert lines["blocked"].split()[1:4] == ["hfax-blocked", "0.0.0", "blocked"]
    assert (
        "error: RuntimeError: this plugin is broken on purpose (disable with HFAX_BLOCK_PLUGINS=hfax-broken:broken)"
        in output
    )


def test_env_prints_versions_and_backend_devices(install, backend_plugin, monkeypatch):
    install("hfax-fake", {"fake": "fake_backend"}, {"fake_backend": backend_plugin})
    gone = backend_plugin.replace(
        '"fake", "fake_backend:FakeBackend"', '"gone", "missing_module:FakeBackend"'
    )
    install("hfax-gone", {"gone": "gone_backend"}, {"gone_backend": gone})
    monkeypatch.setenv("HFAX_PLUGINS", "fake,gone")
    output = run("env")
    assert output.startswith("python ")
    assert "hfax-core    0.1.0" in output and "transformers " in output
    assert "backend fake: fake:0, fake:1" in output
    # A backend that cannot start is reported, not fatal, in a diagnostic command.
    assert "backend gone: unavailable: ModuleNotFoundError" in output


def test_no_arguments_prints_help():
    result = CliRunner().invoke(app, [])
    assert "plugins" in result.output and "env" in result.output and "generate" in result.output


def test_generate_without_backend_names_the_install_command(monkeypatch):
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")
    result = CliRunner().invoke(app, ["generate", "hello", "--model", "/nonexistent"])
    assert result.exit_code != 0
    assert 'pip install "hfax[jax]"' in str(result.exception)
