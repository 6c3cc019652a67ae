"""Decode speed of the PyTorch/XLA backend against the JAX backend and transformers eager, in one run.

The two backends need different torch versions (torch_xla 2.9 pins torch 2.9; the JAX backend runs torch
2.13), so no venv holds both: each measurement runs in a subprocess under the interpreter named for it.

    python benchmarks/torchxla.py --python torch_xla=.nox/torchxla/bin/python --python jax=.nox/jax/bin/python

prints one row per engine: the model (a random Llama of about 134M parameters: hidden 768, 12 layers, 12
heads, intermediate 2048, vocabulary 32000; the same seeded weights for everyone), the first call's time
and programs compiled, and the decode tokens/s of the following calls. ``eager`` is transformers' own
``generate`` on PyTorch/CPU, run by the first interpreter given; ``torch_xla_lazy`` is the backend with its
decode step run as lazy tensors instead of ``torch.compile`` (the choice the backend made by this measure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hfax


def benchmark_config():
    import transformers

    return transformers.LlamaConfig(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        vocab_size=32000,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


class LazySteps:
    """A plugin that answers ``hfax_compile_step`` first with the lazy-tensor alternative to torch.compile:
    the step runs as traced torch code and ``torch_xla.sync()`` cuts the graph after it (one XLA program,
    compiled once and then found by its hash, but the model's Python runs again at every token)."""

    @staticmethod
    @hfax.hookimpl(tryfirst=True)
    def hfax_compile_step(fn, backend, name, static_argnames, donate_argnames):
        import torch_xla

        def step(*args):
            out = fn(*args)
            torch_xla.sync()
            return out

        return step


def measure(
    engine: str, checkpoint: Path, prompt_length: int, new_tokens: int, repeats: int
) -> dict:
    """Run in the worker: load, generate once (compiling), then ``repeats`` timed generations."""
    import numpy as np

    from hfax.testing import as_numpy, save_tiny

    if not (checkpoint / "config.json").exists():
        save_tiny(benchmark_config(), checkpoint)
    ids = np.random.default_rng(0).integers(3, 32000, size=(1, prompt_length))
    # min_new_tokens keeps EOS away, so every engine decodes the same number of tokens.
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    if engine == "eager":
        import torch
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()

        def run():
            with torch.no_grad():
                return model.generate(torch.as_tensor(ids), do_sample=False, **settings).numpy()

        compiles = lambda: 0  # noqa: E731
        version = f"torch {torch.__version__}, transformers {transformers.__version__}"
    else:
        backend = "torch_xla" if engine == "torch_xla_lazy" else engine
        if engine == "torch_xla_lazy":
            hfax.register(LazySteps(), name="lazy-steps")
        model = hfax.AutoModelForTPU.from_pretrained(str(checkpoint), backend=backend)
        run = lambda: as_numpy(model.generate(ids, **settings))  # noqa: E731
        if backend == "torch_xla":
            import torch_xla

            from hfax.backends.torchxla import runtime

            compiles = lambda: runtime.counters().compiles  # noqa: E731
            version = f"torch_xla {torch_xla.__version__}"
        else:
            import jax

            from hfax.backends.jax import monitor

            compiles = lambda: monitor.snapshot().compiles  # noqa: E731
            version = f"jax {jax.__version__}"
    before, started = compiles(), time.perf_counter()
    first = run()
    first_seconds, first_compiles = time.perf_counter() - started, compiles() - before
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        again = run()
        timings.append(time.perf_counter() - started)
    return {
        "engine": engine,
        "version": version,
        "first_seconds": first_seconds,
        "first_compiles": first_compiles,
        "later_compiles": compiles() - before - first_compiles,
        "tokens_per_second": new_tokens / min(timings),
        "tokens": first[0, prompt_length:].tolist(),
        "same_as_first": bool((again == first).all()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="ENGINE=PYTHON",
        help="interpreter for an engine (torch_xla, torch_xla_lazy, jax); repeatable",
    )
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = measure(
            args.worker, Path(args.checkpoint), args.prompt_length, args.new_tokens, args.repeats
        )
        print("RESULT " + json.dumps(result))
        return
    pythons = dict(item.split("=", 1) for item in args.python) or {"torch_xla": sys.executable}
    runs = [(engine, python) for engine, python in pythons.items()] + [
        ("eager", next(iter(pythons.values())))
    ]
    rows, load_before = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "llama-134m"
        for engine, python in runs:
            command = [
                python,
                __file__,
                "--worker",
                engine,
                "--checkpoint",
                str(checkpoint),
                "--prompt-length",
                str(args.prompt_length),
                "--new-tokens",
                str(args.new_tokens),
                "--repeats",
                str(args.repeats),
            ]
            env = {**os.environ, "PJRT_DEVICE": "CPU", "HFAX_CACHE": str(Path(tmp) / "cache")}
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                sys.exit(f"{engine} failed:\n{done.stderr[-3000:]}")
            rows.append(json.loads(lines[-1].removeprefix("RESULT ")))
    reference = next(row["tokens"] for row in rows if row["engine"] == "eager")
    print(
        f"random Llama 134M, batch 1, prompt {args.prompt_length}, {args.new_tokens} new tokens (greedy), CPU "
        f"load (1-minute average) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores"
    )
    print(
        f"{'engine':<15} {'version':<38} {'first call s':>12} {'compiles':>9} {'later':>6} {'tok/s':>7}  same tokens as eager"
    )
    for row in rows:
        print(
            f"{row['engine']:<15} {row['version']:<38} {row['first_seconds']:>12.1f} {row['first_compiles']:>9} "
            f"{row['later_compiles']:>6} {row['tokens_per_second']:>7.1f}  {row['tokens'] == reference}"
        )


if __name__ == "__main__":
    main()
