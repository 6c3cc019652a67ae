"""One training step with hfax against PyTorch eager and ``torch.compile``, side by side in one run.

    python benchmarks/train.py                          # full and LoRA, float32, batch 8 x 128
    python benchmarks/train.py --dtypes float32 bfloat16  # bfloat16 too (slow: see below)
    python benchmarks/train.py --modes lora --dtypes float32 --steps 2
    nox -s bench_train [-- same options]

On the benchmark Llama (~134M parameters, random weights: ``decode.llama_path()``) each engine trains with
AdamW (learning rate 1e-4): every weight (``full``) or rank-8 LoRA adapters on ``q_proj`` and ``v_proj``
(``lora``; adapters and their optimizer state in float32 in every engine, the base weights in the dtype).
hfax runs :class:`hfax.backends.jax.train.Trainer` (one jitted, donated step); PyTorch runs
``loss.backward(); optimizer.step()`` eagerly, and with the model wrapped in ``torch.compile``, with PEFT
for LoRA. Every measurement runs in its own process: its peak resident memory (``getrusage``) covers
loading, the first step (compiling) and the measured steps. Tokens/s is batch x tokens over the median of
``--steps`` steps after the first. Prints one table, writes benchmarks/results/train.json and rewrites the
Training section of docs/PERFORMANCE.md (benchmarks/decode.py keeps it when it regenerates the page).

bfloat16 is not measured unless asked for: on a CPU without bfloat16 matrix units PyTorch's bfloat16
training step ran for over 11 minutes without finishing (its float32 one takes well under a minute).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (the benchmark Llama, the machine's description)

ENGINES = ("hfax", "torch-eager", "torch-compile")
MODES = ("full", "lora")
DTYPES = ("float32", "bfloat16")
#: Why the bfloat16 rows are left out by default (see the module docstring).
BFLOAT16_SKIPPED = (
    "bfloat16 rows are not measured by default: on this CPU PyTorch's bfloat16 training step ran for "
    "over 11 minutes without finishing; `--dtypes float32 bfloat16` measures them."
)
LORA_TARGETS = ["q_proj", "v_proj"]
LORA_RANK = 8
LEARNING_RATE = 1e-4
WORKER_TIMEOUT_S = 3600


@dataclasses.dataclass
class Case:
    """One engine, mode and dtype, and what its process measured (seconds, bytes)."""

    engine: str
    mode: str
    dtype: str
    batch: int
    tokens: int
    steps: int
    first_step_s: float | None = None
    step_s: float | None = None
    peak_rss_bytes: int | None = None
    losses: list[float] | None = None
    error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.step_s is None else self.batch * self.tokens / self.step_s


def batch(case: Case, vocab: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(3, vocab, (case.batch, case.tokens)).astype(np.int64)
    return dict(input_ids=ids, attention_mask=np.ones_like(ids), labels=ids.copy())


def hfax_step(path: str, case: Case) -> Callable[[dict[str, np.ndarray]], float]:
    import optax
    from flax import nnx

    from hfax.backends.jax import train

    module = train.from_pretrained(path, dtype=case.dtype)
    wrt = nnx.Param
    if case.mode == "lora":
        train.add_lora(module, LORA_TARGETS, rank=LORA_RANK, alpha=2 * LORA_RANK)
        wrt = nnx.LoRAParam
    trainer = train.Trainer(module, optax.adamw(LEARNING_RATE), wrt=wrt)
    return lambda inputs: float(trainer.step(inputs))


def torch_step(path: str, case: Case, compiled: bool) -> Callable[[dict[str, np.ndarray]], float]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, case.dtype)
    )
    if case.mode == "lora":
        import peft

        config = peft.LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=LORA_TARGETS)
        model = peft.get_peft_model(model, config)  # adapters in float32 (autocast_adapter_dtype)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE)
    forward = torch.compile(model) if compiled else model

    def step(inputs: dict[str, np.ndarray]) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = forward(**{name: torch.as_tensor(value) for name, value in inputs.items()}).loss
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def measure(spec: dict[str, Any]) -> Case:
    case = Case(**spec["case"])
    if case.engine == "hfax":
        step = hfax_step(spec["path"], case)
    else:
        step = torch_step(spec["path"], case, compiled=case.engine == "torch-compile")
    inputs = batch(case, spec["vocab"])
    started = time.perf_counter()
    case.losses = [step(inputs)]
    case.first_step_s = time.perf_counter() - started
    times = []
    for _ in range(case.steps):
        started = time.perf_counter()
        case.losses.append(step(inputs))
        times.append(time.perf_counter() - started)
    case.step_s = statistics.median(times)
    case.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return case


def worker(spec: dict[str, Any]) -> None:
    case = measure(spec)
    Path(spec["out"]).write_text(json.dumps(dataclasses.asdict(case)))


def run_worker(case: Case, path: str, vocab: int, scratch: Path) -> Case:
    """``case`` in a fresh process (its own peak memory, compile caches in an empty folder)."""
    label = f"{case.engine}-{case.mode}-{case.dtype}"
    out, log = scratch / f"{label}.json", scratch / f"{label}.log"
    spec = dict(case=dataclasses.asdict(case), path=path, vocab=vocab, out=str(out))
    env = dict(
        os.environ,
        HFAX_CACHE=str(scratch / "hfax" / label),
        TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor" / label),
    )
    print(f"  {label} ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    with log.open("w") as stderr:
        try:
            status = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(spec)],
                env=env,
                stdout=stderr,
                stderr=stderr,
                timeout=WORKER_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    print(f" {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if status == 0 and out.exists():
        return Case(**json.loads(out.read_text()))
    tail = log.read_text().strip().splitlines()
    return dataclasses.replace(
        case, error=f"worker failed ({status}): {tail[-1] if tail else 'no output'}"
    )


def table(cases: list[Case]) -> str:
    """One row per mode and dtype and engine: tokens/s, its ratio to PyTorch eager's, peak memory and
    its ratio to the same engine's full fine-tuning."""
    found = {(c.engine, c.mode, c.dtype): c for c in cases}
    lines = [
        "| mode | dtype | engine | step (s) | tokens/s | vs eager | first step (s) | peak RSS (GiB) "
        "| vs full |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        if c.error:
            lines.append(f"| {c.mode} | {c.dtype} | {c.engine} | {c.error} | | | | | |")
            continue
        eager = found.get(("torch-eager", c.mode, c.dtype))
        full = found.get((c.engine, "full", c.dtype))
        speedup = ratio(c.tokens_per_s, eager and eager.tokens_per_s, "x")
        memory = (
            ratio(c.peak_rss_bytes, full and full.peak_rss_bytes, "") if c.mode != "full" else ""
        )
        lines.append(
            f"| {c.mode} | {c.dtype} | {c.engine} | {c.step_s:.2f} | {c.tokens_per_s:.0f} | "
            f"{speedup} | {c.first_step_s:.1f} | {c.peak_rss_bytes / 2**30:.2f} | {memory} |"
        )
    return "\n".join(lines)


def ratio(value: float | None, base: float | None, unit: str) -> str:
    if not value or not base:
        return ""
    return f"{value / base:.2f}{unit}" if unit else f"{value / base:.0%}"


def write(out: Path, record: dict[str, Any], cases: list[Case]) -> None:
    record["load_average_after"] = decode.load_average()
    record["cases"] = [dict(dataclasses.asdict(c), tokens_per_s=c.tokens_per_s) for c in cases]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


def update_page(page: Path, record: dict[str, Any], cases: list[Case]) -> None:
    """Replace the Training section of ``page`` (docs/PERFORMANCE.md) with this run's table."""
    machine = record["machine"]
    measured = {case.dtype for case in cases}
    skipped = "" if "bfloat16" in measured else "\n\n" + BFLOAT16_SKIPPED
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items())
    section = f"""## Training

Generated by `benchmarks/train.py`; rerun it rather than editing by hand.

- Command: `{record["command"]}`
- Measured {record["started"]} on {machine["cpu"]} ({machine["cores"]} cores,
  {machine["memory_bytes"] / 2**30:.0f} GiB RAM); versions: {versions}
- Load average (1, 5, 15 min) before: {fmt_load(record["load_average_before"])}, after:
  {fmt_load(record["load_average_after"])}. The machine is shared with other jobs: with a load above its
  core count every engine gets a fraction of the cores, so the numbers are noisy and slower than on an idle
  machine; the engines ran one after another under the same load.

One AdamW step on the benchmark Llama (~134M parameters), batch {cases[0].batch} x {cases[0].tokens}
tokens: every weight (*full*), or rank-{LORA_RANK} adapters on {" and ".join(LORA_TARGETS)} (*lora*,
adapters and their optimizer state float32). *step*: median of {cases[0].steps} steps after the first;
*first step*: loading excluded, compiling included; *peak RSS*: the process's peak (getrusage) over
loading, the first step and the measured ones; *vs full*: LoRA's peak over the same engine's full
fine-tuning. hfax runs `Trainer` (one jitted, donated step), PyTorch eager and `torch.compile` PyTorch
(with PEFT for LoRA).{skipped}

{table(cases)}
"""
    decode.write_section(page, "## Training", section)


def fmt_load(load: list[float] | None) -> str:
    return "unknown" if load is None else ", ".join(f"{value:.1f}" for value in load)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--dtypes", nargs="+", choices=DTYPES, default=["float32"], help=BFLOAT16_SKIPPED
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="measured steps after the first")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "train.json"
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        default=Path(__file__).parent.parent / "docs" / "PERFORMANCE.md",
        help="page whose Training section to rewrite",
    )
    parser.add_argument("--no-markdown", action="store_true", help="do not touch the page")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if min(args.batch, args.tokens, args.steps) < 1:
        parser.error("--batch, --tokens and --steps must be positive integers")
    import tempfile

    import transformers

    path = decode.llama_path()
    vocab = transformers.AutoConfig.from_pretrained(path).vocab_size
    record: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": decode.machine(),
        "load_average_before": decode.load_average(),
        "model": "benchmark Llama (~134M parameters, benchmarks/decode.py)",
        "lora": dict(targets=LORA_TARGETS, rank=LORA_RANK, alpha=2 * LORA_RANK),
    }
    cases = []
    with tempfile.TemporaryDirectory(prefix="hfax-bench-train-") as scratch:
        for dtype in args.dtypes:
            for mode in args.modes:
                print(f"{mode} {dtype}:", file=sys.stderr)
                for engine in args.engines:
                    case = Case(engine, mode, dtype, args.batch, args.tokens, args.steps)
                    cases.append(run_worker(case, path, vocab, Path(scratch)))
                    write(
                        args.out, record, cases
                    )  # what is measured so far survives an interruption
    if not args.no_markdown:
        update_page(args.markdown, record, cases)
    print(table(cases))
    print(
        f"load average before {record['load_average_before']}, after {record['load_average_after']}"
    )
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
