"""The ``hfax`` command line: ``plugins`` and ``env``, user errors before any backend loads (``generate``
and ``chat`` on a model: packages/hfax-jax/tests/test_cli_jax.py), and the commands plugins add."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import hfax
from hfax.cli import app, main
from hfax.plugins import PluginHookError, PluginLoadWarning, reset_plugins


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


def hfax_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """``hfax ARGS`` through the console script's entry point (``hfax.cli.main``) in this process, as a
    user's shell runs it but without a new interpreter: its exit code and what it wrote to stderr."""
    monkeypatch.setattr(sys, "argv", ["hfax", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return exited.value.code, capsys.readouterr().err


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
def test_a_user_error_is_one_line_and_exit_code_2(args, message, monkeypatch, capsys):
    code, stderr = hfax_main(monkeypatch, capsys, *args)
    assert code == 2, stderr
    # transformers itself says on stderr when torch is missing (hfax-core's own venv has none).
    lines = [line for line in stderr.splitlines() if not line.startswith("[transformers]")]
    assert lines == [f"hfax: error: {stderr.split('hfax: error: ')[1].strip()}"]
    assert message in stderr and "Traceback" not in stderr


def test_debug_shows_the_traceback():
    done = hfax_command("--debug", "generate", "hi", "--dtype", "float16x")
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "UserError: --dtype float16x" in done.stderr


def test_version():
    done = hfax_command("--version")
    assert done.returncode == 0 and done.stdout.strip() == "hfax 0.1.0"


COMMAND_PLUGIN = """
    import hfax

    @hfax.hookimpl
    def hfax_register_commands(cli):
        @cli.command("hello", help="Say hello from a plugin.")
        def hello(name: str = "world"):
            print(f"hello {name}")
"""


def test_a_plugin_adds_a_command_that_help_lists_and_that_runs(install, monkeypatch):
    install("hfax-hello", {"hello": "hello_commands"}, {"hello_commands": COMMAND_PLUGIN})
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    assert "Say hello from a plugin." in run("--help")
    assert run("hello", "--name", "plugins").strip() == "hello plugins"
    listed = [line.split() for line in run("plugins").splitlines()]
    assert ["hello", "hfax-hello", "0.0.0", "loaded", "command", "hello"] in listed, listed
    monkeypatch.setenv("HFAX_BLOCK_PLUGINS", "hello")  # blocked, its command goes with it
    reset_plugins()
    result = CliRunner().invoke(app, ["hello"])
    assert result.exit_code == 2 and "No such command 'hello'" in result.output


def test_a_mistyped_command_suggests_core_and_plugin_commands(install, monkeypatch):
    install("hfax-hello", {"hello": "hello_commands"}, {"hello_commands": COMMAND_PLUGIN})
    for typo, suggested in [("plugns", "plugins"), ("helo", "hello"), ("serv", "serve")]:
        result = CliRunner().invoke(app, [typo])
        assert result.exit_code == 2 and f"Did you mean '{suggested}'" in result.output, (
            result.output
        )


def test_a_plugin_registered_in_code_adds_its_command(monkeypatch):
    import typer

    class Commands:
        @hfax.hookimpl
        def hfax_register_commands(self, cli: typer.Typer) -> None:
            cli.command("ping")(lambda: typer.echo("pong"))

    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")
    hfax.register(Commands(), name="in-code-commands")
    assert "ping" in run("--help")
    assert run("ping").strip() == "pong"


def test_a_plugin_command_may_not_take_a_core_commands_name(install, monkeypatch):
    source = COMMAND_PLUGIN.replace('"hello"', '"generate"')
    install("hfax-clash", {"clash": "clash_commands"}, {"clash_commands": source})
    monkeypatch.setenv("HFAX_STRICT_PLUGINS", "1")
    result = CliRunner().invoke(app, ["--help"])
    assert isinstance(result.exception, PluginHookError)
    assert "hfax-clash:clash" in str(result.exception) and "'generate'" in str(result.exception)


@pytest.mark.parametrize(
    ("command", "distribution"), [("serve", "hfax-serve"), ("finetune", "hfax-jax")]
)
def test_a_plugin_command_without_its_plugin_names_the_package_to_install(
    command, distribution, monkeypatch, capsys
):
    # What a user sees: one line naming the distribution and the command that installs it, exit code 2.
    monkeypatch.setenv("HFAX_DISABLE_PLUGINS", "1")
    reset_plugins()
    code, stderr = hfax_main(monkeypatch, capsys, command, "-m", "x", "--port", "1")
    assert code == 2, stderr
    # Its last line: without torch, transformers' import warns first ("PyTorch was not found").
    assert stderr.strip().splitlines()[-1] == (
        f"hfax: error: `hfax {command}` comes from the {distribution} plugin, which is not installed (or "
        "is blocked: see `hfax plugins`); to install it: in the root of a clone of hfax, pip install -r "
        "requirements/jax.txt"
    )
