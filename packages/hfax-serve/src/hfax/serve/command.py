"""``hfax serve``: its options, checked before anything loads, then :func:`hfax.serve.run`."""

from __future__ import annotations

from typing import Optional

import typer

from hfax.cli import (
    BackendOption,
    DtypeOption,
    MeshOption,
    ModelOption,
    UserError,
    check_options,
    load_model,
    user_errors,
)

#: The most tokens ``--prompt-lookup`` may guess a step: every guess costs a token's share of each
#: guessing step's forward, and a run of guesses is kept only up to the first the model rejects.
MOST_GUESSES = 16


def register(cli: typer.Typer) -> None:
    """Add ``hfax serve`` to ``cli``."""
    cli.command("serve")(serve_command)


@user_errors
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
    prefix_cache: int = typer.Option(
        0,
        "--prefix-cache",
        help="Prompt prefixes kept on the device for requests that begin with them to reuse "
        "(entries of up to half a row each; 0, the default, keeps none). The first reuse of each "
        "pair of prompt buckets compiles a prefill program while serving.",
    ),
    prefill_chunk: Optional[int] = typer.Option(
        None,
        "--prefill-chunk",
        help="Prompt tokens prefilled per scheduler turn: a longer prompt is prefilled in pieces of "
        "this many between decode chunks, so running streams keep flowing (default: 256, when rows "
        "hold more; 0 prefills every prompt whole).",
    ),
    prompt_lookup: Optional[int] = typer.Option(
        None,
        "--prompt-lookup",
        help="Tokens each decode step guesses per row by prompt lookup (the tokens that followed the "
        "row's last few tokens earlier in its prompt or output), checked by the model in the same "
        "forward: a greedy request gets the same tokens, sooner, while at most 4 rows are busy and "
        "all of them greedy without penalties (default: 3; 0 guesses none).",
    ),
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API with continuous batching (Ctrl-C stops it)."""
    if max_batch < 1 or max_queue < 0:
        raise UserError("--max-batch must be at least 1 and --max-queue at least 0")
    if prefix_cache < 0:
        raise UserError(f"--prefix-cache {prefix_cache}: give 0 (off) or more entries")
    if prefill_chunk is not None and (
        prefill_chunk < 0 or (max_len is not None and prefill_chunk >= max_len)
    ):
        raise UserError(
            f"--prefill-chunk {prefill_chunk}: give 0 (prefill every prompt whole) or fewer tokens "
            "than --max-len"
        )
    if prompt_lookup is not None and not 0 <= prompt_lookup <= MOST_GUESSES:
        raise UserError(
            f"--prompt-lookup {prompt_lookup}: give 0 (guess nothing) to {MOST_GUESSES} tokens a step"
        )
    if not 0 < port < 65536:
        raise UserError(f"--port {port}: choose a port from 1 to 65535")
    check_options(model, mesh, dtype, backend)
    from hfax import get_backend, serve
    from hfax.demo import default_model

    engine = get_backend(backend)
    if not engine.serves():
        raise UserError(
            f"-b {backend}: the {backend} backend has no continuous-batching engine, so hfax serve cannot "
            "run on it; serve with a backend that has one (-b jax)"
        )
    tokenizer, loaded = load_model(model, backend, mesh, dtype)
    try:
        serve.run(
            engine,
            loaded,
            tokenizer,
            served_name or model or default_model(),
            host=host,
            port=port,
            max_batch=max_batch,
            max_queue=max_queue,
            max_len=max_len,
            drain=drain,
            prefixes=prefix_cache,
            prefill_chunk=prefill_chunk,
            lookup=serve.LOOKUP if prompt_lookup is None else prompt_lookup,
        )
    except NotImplementedError as error:
        raise UserError(str(error)) from None
