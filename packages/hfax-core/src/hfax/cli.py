"""The ``hfax`` command line: core's commands (``plugins``, ``env``, ``plan``, ``generate``, ``chat``) and
those plugins add through ``hfax_register_commands`` (``serve`` from hfax-serve, ``finetune`` from hfax-jax).

A user's mistake (a missing model, an unknown backend, a bad option value) ends in one line on stderr
naming the problem and the fix, and exit code 2; ``hfax --debug ...`` shows the traceback instead. What
plugins' commands share with core's is public here: :class:`UserError`, :func:`user_errors`, the options
(``ModelOption``, ``BackendOption``, ``MeshOption``, ``DtypeOption``), :func:`check_options`,
:func:`parse_mesh` and :func:`load_model`. This module imports no backend and no plugin's code.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Collection, Optional

import typer
from typer.core import TyperGroup

from hfax import plugins

#: Commands that plugins give, with the distribution that gives each and the hfax extra that installs it
#: (:func:`hfax.auto.install_command`): what ``hfax NAME`` names while that plugin is not loaded.
PLUGIN_COMMANDS = {"serve": ("hfax-serve", "jax"), "finetune": ("hfax-jax", "jax")}


class Commands(TyperGroup):
    """Core's commands, then those of every plugin's ``hfax_register_commands``, asked for when the command
    line is built (so a plugin registered in code adds its commands too)."""

    @functools.cached_property
    def plugin_commands(self) -> dict[str, Any]:
        return plugin_commands(taken=set(self.commands))

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *self.plugin_commands]

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        # typer's "Did you mean" knows core's commands only: an unknown name is refused here, with
        # suggestions from the plugins' commands too (those of plugins not installed included).
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            known = dict.fromkeys([*self.list_commands(ctx), *PLUGIN_COMMANDS])
            matches = difflib.get_close_matches(name, known)
            hint = f" Did you mean {', '.join(map(repr, matches))}?" if matches else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name) or self.plugin_commands.get(cmd_name)
        if command is None and cmd_name in PLUGIN_COMMANDS:
            return _missing_command(cmd_name, *PLUGIN_COMMANDS[cmd_name])
        return command


def plugin_commands(taken: Collection[str] = ()) -> dict[str, Any]:
    """The commands plugins give (``hfax_register_commands``), by name, in the plugins' load order. A name in
    ``taken`` or given by an earlier plugin is refused: reported with the plugin's name, as a failed hook."""
    found: dict[str, Any] = {}
    for plugin, name, command in given_commands():
        if name in taken or name in found:
            plugins.hook_failed(
                plugin,
                "hfax_register_commands",
                f"gives the command {name!r}, which hfax already has",
            )
            continue
        found[name] = command
    return found


def given_commands() -> list[tuple[str, str, Any]]:
    """``(plugin, command name, click command)`` for every command each plugin's ``hfax_register_commands``
    adds, in the plugins' load order."""
    given = []
    for impl in plugins.get_plugin_manager().hook.hfax_register_commands.get_hookimpls():
        commands = typer.Typer()
        impl.function(*(commands for _ in impl.argnames))
        if not commands.registered_commands and not commands.registered_groups:
            continue
        for name, command in typer.main.get_group(commands).commands.items():
            given.append((impl.plugin_name, name, command))
    return given


def _missing_command(name: str, distribution: str, extra: str) -> Any:
    """``hfax NAME`` for a plugin's command while its plugin is not loaded: one line saying what to install."""
    stub = typer.Typer()

    @stub.command(
        name,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def missing() -> None:
        from hfax.auto import install_command

        typer.echo(
            f"hfax: error: `hfax {name}` comes from the {distribution} plugin, which is not installed "
            f"(or is blocked: see `hfax plugins`); to install it: {install_command(extra)}",
            err=True,
        )
        raise typer.Exit(USAGE_ERROR)

    return typer.main.get_command(stub)


app = typer.Typer(
    cls=Commands,
    help="Run Hugging Face transformers models on XLA devices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: The exit code of a user's mistake (click's, for a usage error).
USAGE_ERROR = 2
_debug = False


class UserError(Exception):
    """A mistake in the command line or its inputs, reported in one line."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hfax {importlib.metadata.version('hfax-core')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print hfax's version."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error."),
) -> None:
    global _debug
    _debug = debug


def user_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Report a user's mistake in one line with exit code 2, not as a traceback (unless --debug).

    Besides :class:`UserError`, what hfax and transformers raise for bad input counts: an unknown or missing
    backend and bad mesh (``ValueError``, ``ImportError``), a model that does not fit
    (``DeviceMemoryError``, a ``ValueError``), a model that cannot be found (``OSError``).
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except (UserError, ValueError, ImportError, OSError) as error:
            if _debug:
                raise
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            typer.echo(f"hfax: error: {first}", err=True)
            raise typer.Exit(USAGE_ERROR) from None

    return run


@app.command("plugins")
def plugins_command() -> None:
    """List every plugin: distribution, version, status and the backends, families and commands it provides."""
    infos = plugins.plugin_infos()
    commands: dict[str, list[str]] = {}
    for plugin, name, _ in given_commands():
        commands.setdefault(plugin, []).append(name)
    rows = [(info.name, info.distribution, info.version, info.status) for info in infos]
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for info, row in zip(infos, rows):
        provides = [
            *(f"backend {name}" for name in info.backends),
            *(f"family {name}" for name in info.families),
            *(f"command {name}" for name in commands.get(info.id, [])),
        ]
        typer.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths))
            + "  "
            + (", ".join(provides) or "-")
        )
        if info.error:
            typer.echo(
                f"{'':<{widths[0]}}  error: {info.error} (disable with HFAX_BLOCK_PLUGINS={info.id})"
            )


@app.command("env")
def env_command() -> None:
    """Print versions and, for each installed backend, its devices."""
    typer.echo(f"python       {platform.python_version()} ({platform.platform()})")
    for distribution in (
        "hfax-core",
        "transformers",
        "torch",
        "jax",
        "jaxlib",
        "torchax",
        "torch_xla",
    ):
        try:
            typer.echo(f"{distribution:<12} {importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    for name, spec in sorted(plugins.backends().items()):
        try:
            devices = spec.load().devices()
        except (
            Exception
        ) as error:  # a broken backend is reported, not fatal, in a diagnostic command
            devices = [f"unavailable: {type(error).__name__}: {error}"]
        typer.echo(f"backend {name}: {', '.join(map(str, devices))}")


def _parse_sizes(mesh: str | None) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for part in (mesh or "").split(","):
        if not part.strip():
            continue
        axis, _, size = part.partition("=")
        if not size.strip().isdigit() or int(size) < 1:
            raise UserError(
                f"--mesh {mesh}: expected AXIS=SIZE[,AXIS=SIZE], e.g. model=8 or data=2,model=4"
            )
        sizes[axis.strip()] = int(size)
    return sizes


def parse_mesh(mesh: str | None, backend: str) -> Any:
    sizes = _parse_sizes(mesh)
    if not sizes:
        return None
    if (
        backend != "jax"
    ):  # torch_xla takes the axis sizes and builds its SPMD mesh when it starts its runtime
        return sizes
    from hfax import make_mesh

    return make_mesh(**sizes)


#: What --dtype takes (transformers' from_pretrained reads the names as torch dtypes).
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _check_model(model: str | None) -> None:
    """A model that names a local path must be a folder; a Hub id (``org/name``) is left to transformers."""
    if model is None or Path(model).is_dir():
        return
    if Path(model).exists() or model.startswith(("/", ".", "~")) or model.count("/") > 1:
        raise UserError(
            f"--model {model}: no such model folder; pass a folder holding config.json and the weights, "
            "or a Hub id such as google/gemma-3-270m"
        )


def check_options(model: str | None, mesh: str | None, dtype: str | None, backend: str) -> None:
    """Everything checkable about the model options before anything loads."""
    _check_model(model)
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose among {', '.join(DTYPES)}")
    _parse_mesh_sizes(mesh)
    from hfax.auto import get_backend

    get_backend(backend)  # an unknown or missing backend names the installed ones and the fix


def _parse_mesh_sizes(mesh: str | None) -> dict[str, int]:
    from hfax.specs import MESH_AXES

    sizes = _parse_sizes(mesh)
    if set(sizes) - set(MESH_AXES):
        raise UserError(f"--mesh {mesh}: axes must be among {', '.join(MESH_AXES)}, e.g. model=8")
    return sizes


def _progress(description: str) -> Any:
    """A spinner with the elapsed seconds on stderr while something slow runs; gone once it is done."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # nothing in a pipe or a log
    )
    progress.add_task(description, total=None)
    return progress


def load_model(
    model: str | None, backend: str, mesh: str | None, dtype: str | None
) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    from hfax import AutoModelForCausalLM
    from hfax.demo import default_model

    path = model or default_model()
    kwargs = {"dtype": dtype} if dtype else {}
    started = time.perf_counter()
    with _progress(f"loading {path} on {backend}"):
        loaded = AutoModelForCausalLM.from_pretrained(
            path, backend=backend, mesh=parse_mesh(mesh, backend), **kwargs
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
    typer.echo(f"[loaded {path} on {backend} in {time.perf_counter() - started:.1f} s]", err=True)
    return tokenizer, loaded


def _streamer(tokenizer: Any, progress: Any, lead: str) -> Any:
    """transformers' TextStreamer that, when the first generated tokens arrive (the prompt comes first,
    before tracing and compiling), clears the spinner and prints ``lead``, then the text."""
    from transformers import TextStreamer

    class Streamer(TextStreamer):
        started = False

        def put(self, value: Any) -> None:
            if not self.next_tokens_are_prompt and not self.started:
                self.started = True
                progress.stop()
                typer.echo(lead, nl=False)
            super().put(value)

    return Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


def _generate(
    model: Any, tokenizer: Any, input_ids: Any, options: dict[str, Any], lead: str = ""
) -> Any:
    """Stream the continuation of ``input_ids`` to stdout after ``lead``, a spinner on stderr until the
    first token (tracing and compiling), then report the speed on stderr."""
    started = time.perf_counter()
    with _progress("tracing and compiling (once per shape)") as progress:
        streamer = _streamer(tokenizer, progress, lead)
        output = model.generate(input_ids, streamer=streamer, **options)
    if not streamer.started:  # nothing was generated
        typer.echo(lead, nl=False)
    elapsed = time.perf_counter() - started
    stats = model.last_generate_stats
    typer.echo(
        f"\n[{stats.new_tokens} tokens in {elapsed:.2f} s: {stats.tokens_per_second:.1f} tokens/s decoding, "
        f"compile {stats.compile_seconds:.2f} s]",
        err=True,
    )
    return output


def _sampling(**settings: Any) -> dict[str, Any]:
    """The settings given on the command line; the rest come from the model's generation config, as in
    Python."""
    return {name: value for name, value in settings.items() if value is not None}


ModelOption = typer.Option(
    None, "--model", "-m", help="Hub id or local dir; default: the embedded Gemma 3 270M."
)
BackendOption = typer.Option("jax", "--backend", "-b", help="jax or torch_xla.")
MeshOption = typer.Option(None, "--mesh", help="Device mesh, e.g. model=8 or data=2,model=4.")
DtypeOption = typer.Option(
    None, "--dtype", help=f"One of {', '.join(DTYPES)} (default: the checkpoint's)."
)
TokensOption = typer.Option(64, "--max-new-tokens", "-n", help="How many tokens to generate.")
GenerationDefault = "default: the model's generation config"


def _check_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens}: generate at least 1 token")


@app.command("plan")
@user_errors
def plan_command(
    model: Optional[str] = ModelOption,
    backend: str = BackendOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    device_memory: Optional[str] = typer.Option(
        None,
        "--device-memory",
        help="What one device holds, e.g. 16GB (default: the devices' own; unknown on CPU).",
    ),
) -> None:
    """Print where every weight would go (tensor, spec, bytes per device) without loading any.

    The mesh need not exist here: plan a TPU pod slice from a laptop with --mesh fsdp=4,model=8 --device-memory 16GB.
    """
    from hfax import AutoModelForCausalLM
    from hfax.specs import DeviceMemoryError, parse_size

    if device_memory:
        try:
            parse_size(device_memory)
        except ValueError as error:
            raise UserError(f"--device-memory {device_memory}: {error}") from None
    check_options(model, None, dtype, backend)
    sizes = _parse_mesh_sizes(mesh)
    if device_memory:
        os.environ["HFAX_DEVICE_MEMORY"] = device_memory
    kwargs = {"dtype": dtype} if dtype else {}
    layout = AutoModelForCausalLM.plan(model, backend=backend, mesh=sizes or None, **kwargs)
    typer.echo(str(layout))
    try:
        layout.check()
    except DeviceMemoryError as error:
        typer.echo(f"does not fit: {error}", err=True)
        raise typer.Exit(1) from None


@app.command("generate")
@user_errors
def generate_command(
    prompt: str = typer.Argument(..., help="Text to continue; - reads it from stdin."),
    model: Optional[str] = ModelOption,
    backend: str = BackendOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    max_new_tokens: int = TokensOption,
    do_sample: Optional[bool] = typer.Option(
        None, "--sample/--greedy", help=f"Sample or take the likeliest token ({GenerationDefault})."
    ),
    temperature: Optional[float] = typer.Option(None, help=GenerationDefault),
    top_k: Optional[int] = typer.Option(None, help=f"0 disables top-k ({GenerationDefault})."),
    top_p: Optional[float] = typer.Option(None, help=GenerationDefault),
    seed: int = typer.Option(0),
) -> None:
    """Stream the continuation of PROMPT, then report tokens/s and compile time."""
    _check_tokens(max_new_tokens)
    check_options(model, mesh, dtype, backend)
    if prompt == "-":
        prompt = sys.stdin.read().removesuffix("\n")  # `echo text | hfax generate -` means "text"
    tokenizer, loaded = load_model(model, backend, mesh, dtype)
    input_ids = tokenizer([prompt], return_tensors="np")["input_ids"]
    options = _sampling(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
    )
    _generate(loaded, tokenizer, input_ids, options, lead=prompt)


@app.command("chat")
@user_errors
def chat_command(
    model: Optional[str] = ModelOption,
    backend: str = BackendOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n"),
    system: Optional[str] = typer.Option(None, "--system", help="A system prompt for the chat."),
) -> None:
    """Chat with the model, using its tokenizer's chat template. An empty line or EOF ends the chat."""
    _check_tokens(max_new_tokens)
    check_options(model, mesh, dtype, backend)
    tokenizer, loaded = load_model(model, backend, mesh, dtype)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("this model's tokenizer has no chat template; use `hfax generate` instead")
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    while True:
        try:
            text = input("you> ").strip()
        except EOFError:
            break
        if not text:
            break
        messages.append({"role": "user", "content": text})
        input_ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="np", return_dict=True
        )["input_ids"]
        options = {"max_new_tokens": max_new_tokens}
        output = _generate(loaded, tokenizer, input_ids, options, lead="model> ")
        reply = tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply.strip()})


def main() -> None:
    app()
