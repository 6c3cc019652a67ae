"""The ``hfax`` command line.

A user's mistake (a missing model, an unknown backend, a bad option value) ends in one line on stderr
naming the problem and the fix, and exit code 2; ``hfax --debug ...`` shows the traceback instead.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from hfax import plugins

app = typer.Typer(
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


def _user_errors(command: Callable[..., None]) -> Callable[..., None]:
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
    """List every plugin: distribution, version, status and the backends and families it provides."""
    infos = plugins.plugin_infos()
    rows = [(info.name, info.distribution, info.version, info.status) for info in infos]
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for info, row in zip(infos, rows):
        provides = [f"backend {name}" for name in info.backends] + [
            f"family {name}" for name in info.families
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


def _parse_mesh(mesh: str | None, backend: str) -> Any:
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


def _check_options(model: str | None, mesh: str | None, dtype: str | None, backend: str) -> None:
    """Everything checkable about the model options before anything loads."""
    _check_model(model)
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose among {', '.join(DTYPES)}")
    _parse_mesh_sizes(mesh)
    from hfax.auto import get_backend

    get_backend(backend)  # an unknown or missing backend names the installed ones and the fix


def _parse_mesh_sizes(mesh: str | None) -> dict[str, int]:
    from hfax.registry import MESH_AXES

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


def _load(model: str | None, backend: str, mesh: str | None, dtype: str | None) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    from hfax import AutoModelForCausalLM
    from hfax.demo import default_model

    path = model or default_model()
    kwargs = {"dtype": dtype} if dtype else {}
    started = time.perf_counter()
    with _progress(f"loading {path} on {backend}"):
        loaded = AutoModelForCausalLM.from_pretrained(
            path, backend=backend, mesh=_parse_mesh(mesh, backend), **kwargs
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
@_user_errors
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
    from hfax.registry import DeviceMemoryError, parse_size

    if device_memory:
        try:
            parse_size(device_memory)
        except ValueError as error:
            raise UserError(f"--device-memory {device_memory}: {error}") from None
    _check_options(model, None, dtype, backend)
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
@_user_errors
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
    _check_options(model, mesh, dtype, backend)
    if prompt == "-":
        prompt = sys.stdin.read().removesuffix("\n")  # `echo text | hfax generate -` means "text"
    tokenizer, loaded = _load(model, backend, mesh, dtype)
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
@_user_errors
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
    _check_options(model, mesh, dtype, backend)
    tokenizer, loaded = _load(model, backend, mesh, dtype)
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


@app.command("serve")
@_user_errors
def serve_command(
    model: Optional[str] = ModelOption,
    backend: str = BackendOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    max_batch: int = typer.Option(
        8, "--max-batch", help="Requests decoded together (rows of the decode program)."
    ),
    max_queue: int = typer.Option(
        64, "--max-queue", help="Requests that may wait for a row; more are answered 429."
    ),
    max_len: Optional[int] = typer.Option(
        None,
        "--max-len",
        help="Prompt plus new tokens per request (default: the model's, up to 1024).",
    ),
    served_name: Optional[str] = typer.Option(
        None, "--served-model-name", help="The model name clients send (default: --model as given)."
    ),
    drain: float = typer.Option(
        30.0, "--drain", help="Seconds in-flight requests get to finish on shutdown."
    ),
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API with continuous batching (Ctrl-C stops it)."""
    if max_batch < 1 or max_queue < 0:
        raise UserError("--max-batch must be at least 1 and --max-queue at least 0")
    if not 0 < port < 65536:
        raise UserError(f"--port {port}: choose a port from 1 to 65535")
    _check_options(model, mesh, dtype, backend)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise UserError(
            f'hfax serve needs starlette and uvicorn ({error}); pip install "hfax-core[serve]"'
        ) from None
    from hfax import serve
    from hfax.demo import default_model

    tokenizer, loaded = _load(model, backend, mesh, dtype)
    try:
        serve.run(
            loaded, tokenizer, served_name or model or default_model(), host=host, port=port,
            max_batch=max_batch, max_queue=max_queue, max_len=max_len, drain=drain,
        )  # fmt: skip
    except NotImplementedError as error:
        raise UserError(str(error)) from None


@app.command("finetune")
@_user_errors
def finetune_command(
    data: str = typer.Option(
        ..., "--data", help='JSON lines: {"text"} or {"prompt", "completion"}.'
    ),
    out: str = typer.Option(
        ..., "--out", help="Folder for the PEFT adapter, loss.svg and train_log.json."
    ),
    model: Optional[str] = ModelOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    steps: int = typer.Option(100, "--steps"),
    lora_rank: int = typer.Option(8, "--lora-rank"),
    lora_alpha: Optional[float] = typer.Option(
        None, "--lora-alpha", help="Default: twice the rank."
    ),
    lora_targets: str = typer.Option("q_proj,v_proj", "--lora-targets", help="Linear layer names."),
    batch_size: int = typer.Option(8, "--batch-size"),
    learning_rate: float = typer.Option(1e-3, "--learning-rate", "--lr"),
    max_length: int = typer.Option(256, "--max-length", help="Tokens kept of each record."),
    seed: int = typer.Option(0),
) -> None:
    """Fine-tune LoRA adapters on the JAX backend; save them in PEFT's format with a loss curve."""
    try:
        from hfax.backends.jax.train.finetune import finetune
    except ImportError as error:
        raise UserError(
            f'fine-tuning needs the JAX backend with flax and optax ({error}): pip install "hfax[train]"'
        ) from None
    from hfax.demo import default_model

    targets = tuple(name.strip() for name in lora_targets.split(",") if name.strip())
    result = finetune(
        model or default_model(),
        data,
        out,
        steps=steps,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        targets=targets,
        batch_size=batch_size,
        learning_rate=learning_rate,
        max_length=max_length,
        mesh=_parse_mesh(mesh, "jax"),
        dtype=dtype,
        seed=seed,
    )
    typer.echo(
        f"held-out loss {result.eval_loss_before:.4f} -> {result.eval_loss_after:.4f}; "
        f"{result.tokens_per_second:.0f} tokens/s; adapter, loss.svg and train_log.json in {result.out}"
    )


BenchOutOption = typer.Option(
    Path("hfax-bench"), "--out", help="Folder for the JSON record and the Markdown page."
)


def _bench_outputs(args: list[str], out: Path) -> list[str]:
    """``args`` with the benchmark's JSON record and Markdown page under ``out`` unless they name them."""
    given = {arg.split("=")[0] for arg in args}
    extra = []
    if "--json" not in given:
        extra += ["--json", str(out / "decode.json")]
    if "--markdown" not in given and "--no-markdown" not in given:
        extra += ["--markdown", str(out / "PERFORMANCE.md")]
    return [*args, *extra]


@app.command(
    "bench",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
)
@_user_errors
def bench_command(
    ctx: typer.Context,
    out: Path = BenchOutOption,
) -> None:
    """Benchmark hfax against transformers, torch.compile and the torchax recipe (benchmarks/decode.py).

    It writes decode.json and PERFORMANCE.md under --out (default ./hfax-bench); every other option goes to
    the script: `hfax bench --help` lists them. It runs from a source checkout (the current directory's or
    the one hfax is installed from, editable).
    """
    import importlib.util

    candidates = [
        Path.cwd() / "benchmarks" / "decode.py",
        Path(__file__).resolve().parents[4] / "benchmarks" / "decode.py",
    ]
    script = next((path for path in candidates if path.is_file()), None)
    if script is None:
        raise UserError(
            "hfax bench runs benchmarks/decode.py from hfax's source: run it from a checkout of the "
            f"repository (looked for {' and '.join(map(str, candidates))})"
        )
    spec = importlib.util.spec_from_file_location("hfax_benchmark_decode", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    out.mkdir(parents=True, exist_ok=True)
    raise typer.Exit(module.main(_bench_outputs(ctx.args, out.resolve())))


def main() -> None:
    app()
