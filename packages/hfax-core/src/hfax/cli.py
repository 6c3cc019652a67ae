"""The ``hfax`` command line."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
from typing import Any, Optional

import typer

from hfax import plugins

app = typer.Typer(
    help="Run Hugging Face transformers models on XLA devices.",
    no_args_is_help=True,
    add_completion=False,
)


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
                f"{'':<{widths[0]}}  error: {info.error} (disable with HFAX_BLOCK_PLUGINS={info.name})"
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
        if not size.strip().isdigit():
            raise typer.BadParameter(
                f"expected AXIS=SIZE[,AXIS=SIZE], e.g. model=8, got {part!r}", param_hint="--mesh"
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


def _load(model: str | None, backend: str, mesh: str | None, dtype: str | None) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    from hfax import AutoModelForCausalLM
    from hfax.demo import default_model

    path = model or default_model()
    kwargs = {"dtype": dtype} if dtype else {}
    started = time.perf_counter()
    loaded = AutoModelForCausalLM.from_pretrained(
        path, backend=backend, mesh=_parse_mesh(mesh, backend), **kwargs
    )
    typer.echo(f"[loaded {path} on {backend} in {time.perf_counter() - started:.1f} s]", err=True)
    return AutoTokenizer.from_pretrained(path), loaded


def _generate(model: Any, tokenizer: Any, input_ids: Any, options: dict[str, Any]) -> Any:
    from transformers import TextStreamer

    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    started = time.perf_counter()
    output = model.generate(input_ids, streamer=streamer, **options)
    elapsed = time.perf_counter() - started
    stats = model.last_generate_stats
    typer.echo(
        f"\n[{stats.new_tokens} tokens in {elapsed:.2f} s: {stats.tokens_per_second:.1f} tokens/s decoding, "
        f"compile {stats.compile_seconds:.2f} s]",
        err=True,
    )
    return output


ModelOption = typer.Option(
    None, "--model", "-m", help="Hub id or local dir; default: the embedded Gemma 3 270M."
)
BackendOption = typer.Option("jax", "--backend", "-b", help="jax or torch_xla.")
MeshOption = typer.Option(None, "--mesh", help="Device mesh, e.g. model=8 or data=2,model=4.")
DtypeOption = typer.Option(None, "--dtype", help="float32 or bfloat16 (default: the checkpoint's).")


@app.command("plan")
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
    from hfax.registry import MESH_AXES, DeviceMemoryError

    sizes = _parse_sizes(mesh)
    if set(sizes) - set(MESH_AXES):
        raise typer.BadParameter(
            f"mesh axes must be among {', '.join(MESH_AXES)}, got {mesh!r}", param_hint="--mesh"
        )
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
def generate_command(
    prompt: str = typer.Argument(..., help="Text to continue."),
    model: Optional[str] = ModelOption,
    backend: str = BackendOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n"),
    do_sample: bool = typer.Option(False, "--sample/--greedy"),
    temperature: float = typer.Option(1.0),
    top_k: int = typer.Option(0, help="0 disables top-k."),
    top_p: float = typer.Option(1.0),
    seed: int = typer.Option(0),
) -> None:
    """Stream the continuation of PROMPT, then report tokens/s and compile time."""
    tokenizer, loaded = _load(model, backend, mesh, dtype)
    input_ids = tokenizer([prompt], return_tensors="np")["input_ids"]
    options = dict(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
    )
    typer.echo(prompt, nl=False)
    _generate(loaded, tokenizer, input_ids, options)


@app.command("chat")
def chat_command(
    model: Optional[str] = ModelOption,
    backend: str = BackendOption,
    mesh: Optional[str] = MeshOption,
    dtype: Optional[str] = DtypeOption,
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", "-n"),
) -> None:
    """Chat with the model, using its tokenizer's chat template. An empty line or EOF ends the chat."""
    tokenizer, loaded = _load(model, backend, mesh, dtype)
    if not getattr(tokenizer, "chat_template", None):
        raise typer.BadParameter(
            "this model's tokenizer has no chat template; use `hfax generate` instead",
            param_hint="--model",
        )
    messages: list[dict[str, str]] = []
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
        typer.echo("model> ", nl=False)
        output = _generate(loaded, tokenizer, input_ids, {"max_new_tokens": max_new_tokens})
        reply = tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply.strip()})


@app.command("finetune")
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
        raise typer.BadParameter(
            f'fine-tuning needs the JAX backend with flax and optax ({error}): pip install "hfax[train]"'
        ) from None
    from hfax.demo import default_model

    targets = tuple(name.strip() for name in lora_targets.split(",") if name.strip())
    try:
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
    except (ValueError, OSError) as error:
        typer.echo(f"hfax finetune: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"held-out loss {result.eval_loss_before:.4f} -> {result.eval_loss_after:.4f}; "
        f"{result.tokens_per_second:.0f} tokens/s; adapter, loss.svg and train_log.json in {result.out}"
    )


@app.command(
    "bench",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
)
def bench_command(ctx: typer.Context) -> None:
    """Benchmark hfax against transformers, torch.compile and the torchax recipe (benchmarks/decode.py).

    Every option goes to the script: `hfax bench --help` lists them. It runs from a source checkout (the
    current directory's or the one hfax is installed from, editable).
    """
    import importlib.util
    from pathlib import Path

    candidates = [
        Path.cwd() / "benchmarks" / "decode.py",
        Path(__file__).resolve().parents[4] / "benchmarks" / "decode.py",
    ]
    script = next((path for path in candidates if path.is_file()), None)
    if script is None:
        raise typer.BadParameter(
            "hfax bench runs benchmarks/decode.py from hfax's source: run it from a checkout of the repository "
            f"(looked for {' and '.join(map(str, candidates))})"
        )
    spec = importlib.util.spec_from_file_location("hfax_benchmark_decode", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    raise typer.Exit(module.main(ctx.args))


def main() -> None:
    app()
