"""The JAX backend's commands on the ``hfax`` command line (``hfax_register_commands``): ``hfax finetune``.

Importing this module imports neither torch, jax nor flax: fine-tuning is imported when the command runs,
and says which extra to install when flax or optax is missing.
"""

from __future__ import annotations

from typing import Optional

import typer

from hfax.cli import DtypeOption, MeshOption, ModelOption, UserError, parse_mesh, user_errors


def register(cli: typer.Typer) -> None:
    """Add ``hfax finetune`` to ``cli``."""
    cli.command("finetune")(finetune_command)


@user_errors
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
        mesh=parse_mesh(mesh, "jax"),
        dtype=dtype,
        seed=seed,
    )
    typer.echo(
        f"held-out loss {result.eval_loss_before:.4f} -> {result.eval_loss_after:.4f}; "
        f"{result.tokens_per_second:.0f} tokens/s; adapter, loss.svg and train_log.json in {result.out}"
    )
