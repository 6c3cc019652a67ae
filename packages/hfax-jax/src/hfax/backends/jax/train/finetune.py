"""``hfax finetune``: LoRA fine-tuning of a causal LM on a JSON-lines file, from loading to PEFT adapter.

Prints a progress bar (loss, tokens/s), measures the held-out loss before and after, and writes into
``out``: the adapter (PEFT's format), ``loss.svg`` (the loss curve) and ``train_log.json``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import optax
from flax import nnx

from hfax.backends.jax.train import data
from hfax.backends.jax.train.checkpoints import save_adapter
from hfax.backends.jax.train.lora import LoraConfig, add_lora
from hfax.backends.jax.train.module import from_pretrained
from hfax.backends.jax.train.step import IGNORE, Trainer, scored_tokens


@dataclasses.dataclass
class FinetuneResult:
    """What a run did: the loss of every step, the held-out loss before and after, the training speed."""

    losses: list[float]
    eval_loss_before: float
    eval_loss_after: float
    tokens_per_second: float
    out: Path


def finetune(
    model: str,
    data_file: str | Path,
    out: str | Path,
    *,
    steps: int = 100,
    lora_rank: int = 8,
    lora_alpha: float | None = None,
    lora_dropout: float = 0.0,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    batch_size: int = 8,
    learning_rate: float = 1e-3,
    max_length: int = 256,
    eval_fraction: float = 0.1,
    mesh: Any = None,
    dtype: Any = None,
    seed: int = 0,
    progress: bool = True,
) -> FinetuneResult:
    """Train LoRA adapters (``lora_alpha`` defaults to twice the rank) on ``data_file`` and save them."""
    from transformers import AutoTokenizer

    lora = LoraConfig(lora_rank, float(lora_alpha or 2 * lora_rank), lora_dropout, tuple(targets))
    lora.check()
    _check_positive(steps=steps, batch_size=batch_size, max_length=max_length)
    records = data.read_records(data_file)
    tokenizer = AutoTokenizer.from_pretrained(model)
    examples = [data.tokenize(record, tokenizer, max_length) for record in records]
    order = np.random.default_rng(seed).permutation(len(examples))
    held = max(1, round(len(examples) * eval_fraction)) if len(examples) > 1 else 0
    evaluation = [examples[i] for i in order[:held]]
    training = [examples[i] for i in order[held:]]
    pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    sizes = data.buckets(max_length)

    module = from_pretrained(model, mesh=mesh, dtype=dtype)
    add_lora(
        module, lora.targets, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, seed=seed
    )
    trainer = Trainer(module, optax.adamw(learning_rate), wrt=nnx.LoRAParam)
    before = evaluate(module, evaluation, batch_size, pad_id, sizes)
    stream = data.batches(training, batch_size, pad_id, sizes, seed)
    losses, seconds, tokens = _train(trainer, stream, steps, progress)
    after = evaluate(module, evaluation, batch_size, pad_id, sizes)

    out = save_adapter(module, out, base_model=model)
    write_loss_curve(losses, out / "loss.svg")
    result = FinetuneResult(losses, before, after, tokens / max(seconds, 1e-9), out)
    log = {**dataclasses.asdict(result), "out": str(out), "lora": dataclasses.asdict(lora)}
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    return result


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def _train(
    trainer: Trainer, stream: Any, steps: int, progress: bool
) -> tuple[list[float], float, int]:
    """Run ``steps`` steps; speed is measured from the second step (the first one compiles)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]fine-tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}  {task.fields[speed]:.0f} tokens/s"),
        TimeRemainingColumn(),
    )
    losses: list[float] = []
    seconds, tokens = 0.0, 0
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("train", total=steps, loss=float("nan"), speed=0.0)
        for index in range(steps):
            batch = next(stream)
            started = time.perf_counter()
            losses.append(float(trainer.step(batch)))  # float() waits for the step
            if index:
                seconds += time.perf_counter() - started
                tokens += int(batch["attention_mask"].sum())
            bar.update(task, advance=1, loss=losses[-1], speed=tokens / max(seconds, 1e-9))
    return losses, seconds, tokens


def evaluate(
    module: Any,
    examples: list[tuple[list[int], list[int]]],
    batch_size: int,
    pad_id: int,
    sizes: list[int],
) -> float:
    """The mean loss per scored token over ``examples`` (nan when there are none)."""
    if not examples:
        return float("nan")

    @nnx.jit
    def scored_loss(module: Any, batch: dict[str, Any]) -> Any:
        return module.loss(**batch) * scored_tokens(batch["labels"])

    total, count = 0.0, 0.0
    filler = ([pad_id], [IGNORE])  # fills the last batch: no scored tokens
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = data.pad(chunk + [filler] * (batch_size - len(chunk)), pad_id, sizes)
        total += float(scored_loss(module, batch))
        count += float(scored_tokens(batch["labels"]))
    return total / max(count, 1.0)


def write_loss_curve(losses: list[float], path: Path, width: int = 640, height: int = 360) -> None:
    """The loss of every step as an SVG line chart (no plotting library needed)."""
    margin = 48
    low, high = min(losses), max(losses)
    span = (high - low) or 1.0
    steps = max(len(losses) - 1, 1)
    points = " ".join(
        f"{margin + i * (width - 2 * margin) / steps:.1f},"
        f"{height - margin - (loss - low) * (height - 2 * margin) / span:.1f}"
        for i, loss in enumerate(losses)
    )
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{points}"/>\n'
        f'<text x="{margin}" y="{margin - 8}">loss {high:.3f}</text>\n'
        f'<text x="{margin}" y="{height - margin + 16}">loss {low:.3f}</text>\n'
        f'<text x="{width - margin}" y="{height - margin + 16}" text-anchor="end">'
        f"step {len(losses)}</text>\n</svg>\n"
    )
