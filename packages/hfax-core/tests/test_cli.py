"""The ``hfax`` command line: ``plugins`` and ``env``, and user errors before any backend loads (``generate``
and ``chat`` on a model: packages/hfax-jax/tests/test_cli_jax.py)."""

from __future__ import annotations

import subprocess
import sys

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
    result = CliRunner().invoke(app, ["generate", "hello"])
    assert result.exit_code == 2
    assert "pip install -r requirements/jax.txt" in result.stderr


def hfax_command(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """``hfax ARGS`` in a new process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-c", "from hfax.cli import main; main()", *args],
        input=stdin,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["generate", "hi", "--model", "/no/such/model"],
            "--model /no/such/model: no such model folder",
        ),
        (["generate", "hi", "-b", "jaxx"], "unknown backend 'jaxx'"),
        (["generate", "hi", "--mesh", "tp=1"], "--mesh tp=1: axes must be among data, fsdp, model"),
        (["generate", "hi", "--mesh", "model=eight"], "--mesh model=eight: expected AXIS=SIZE"),
        (["generate", "hi", "--dtype", "float16x"], "--dtype float16x: choose among auto, float32"),
        (["generate", "hi", "-n", "-1"], "--max-new-tokens -1: generate at least 1 token"),
        (["chat", "-n", "0"], "--max-new-tokens 0: generate at least 1 token"),
        (["plan", "--device-memory", "lots"], "--device-memory lots: expected a size such as 16GB"),
    ],
)
def test_a_user_error_is_one_line_and_exit_code_2(args, message):
    done = hfax_command(*args)
    assert done.returncode == 2, done.stderr
    # transformers itself says on stderr when torch is missing (hfax-core's own venv has none).
    lines = [line for line in done.stderr.splitlines() if not line.startswith("[transformers]")]
    assert lines == [f"hfax: error: {done.stderr.split('hfax: error: ')[1].strip()}"]
    assert message in done.stderr and "Traceback" not in done.stderr


def test_debug_shows_the_traceback():
    done = hfax_command("--debug", "generate", "hi", "--dtype", "float16x")
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "UserError: --dtype float16x" in done.stderr


def test_version():
    done = hfax_command("--version")
    assert done.returncode == 0 and done.stdout.strip() == "hfax 0.1.0"
