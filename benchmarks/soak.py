"""A soak run: many ``generate`` calls of random shapes within the buckets; compiles and memory must stay flat.

    python benchmarks/soak.py                     # 200 calls on the benchmark Llama (benchmarks/decode.py)
    python benchmarks/soak.py --calls 50 --model path/to/checkpoint --dtype bfloat16

A warm-up first touches every bucket once (batch sizes 1-8, prompts up to --max-prompt tokens, up to
--max-new-tokens new tokens). Then every call draws a batch size, prompt length and token count at
random. The script prints, every --every calls, the programs compiled so far, the host's resident memory
and the bytes of live JAX arrays (device memory; on CPU it is host memory too). It fails when a call
after the warm-up compiles, or when resident or device memory grows by more than --tolerance after it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (the benchmark Llama and the memory readers)


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS), or its peak where /proc is missing."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return decode.PeakMemory().peak()


def device_bytes() -> int:
    """Bytes held by live JAX arrays (the KV caches, tokens and weights hfax keeps on the device)."""
    import jax

    return sum(array.nbytes for array in jax.live_arrays())


def buckets(max_batch: int, max_prompt: int, max_new: int) -> list[tuple[int, int, int]]:
    """One (batch, prompt, new tokens) per bucket: the largest size each bucket holds."""
    from hfax.backends.jax.generation import MIN_LENGTH_BUCKET, bucket

    def tops(limit: int, minimum: int) -> list[int]:
        return sorted({min(bucket(n, minimum), limit) for n in range(1, limit + 1)})

    return list(
        itertools.product(
            tops(max_batch, 1),
            tops(max_prompt, MIN_LENGTH_BUCKET),
            tops(max_new, MIN_LENGTH_BUCKET),
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint dir or Hub id (default: the benchmark Llama)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--every", type=int, default=10, help="print the curve every this many calls"
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="allowed growth of memory after the warm-up"
    )
    parser.add_argument("--json", type=Path, help="write the curve here")
    args = parser.parse_args(argv)

    import hfax
    from hfax.backends.jax import monitor

    model = hfax.AutoModelForCausalLM.from_pretrained(
        args.model or decode.llama_path(), backend="jax", dtype=args.dtype
    )
    vocab = model.config.get_text_config(decoder=True).vocab_size
    rng = np.random.default_rng(0)

    def call(batch: int, prompt: int, new: int) -> None:
        ids = rng.integers(0, vocab, (batch, prompt))
        np.asarray(model.generate(ids, max_new_tokens=new, min_new_tokens=new))

    started = time.perf_counter()
    warm = buckets(args.max_batch, args.max_prompt, args.max_new_tokens)
    for shape in warm:
        call(*shape)
    warmed = monitor.snapshot().compiles
    print(
        f"warm-up: {len(warm)} buckets, {warmed} programs compiled, {time.perf_counter() - started:.0f} s",
        flush=True,
    )

    curve = []
    header = f"{'call':>5} {'batch':>5} {'prompt':>6} {'new':>4} {'compiles':>8} {'RSS MB':>8} {'device MB':>9} {'s':>6}"
    print(header)
    for index in range(1, args.calls + 1):
        shape = (
            int(rng.integers(1, args.max_batch + 1)),
            int(rng.integers(1, args.max_prompt + 1)),
            int(rng.integers(1, args.max_new_tokens + 1)),
        )
        began = time.perf_counter()
        call(*shape)
        point = dict(
            call=index,
            batch=shape[0],
            prompt=shape[1],
            new_tokens=shape[2],
            compiles=monitor.snapshot().compiles,
            rss=resident_bytes(),
            device=device_bytes(),
            seconds=time.perf_counter() - began,
        )
        curve.append(point)
        if index == 1 or index % args.every == 0:
            print(
                f"{index:>5} {shape[0]:>5} {shape[1]:>6} {shape[2]:>4} {point['compiles']:>8} {point['rss'] / 2**20:>8.0f} "
                f"{point['device'] / 2**20:>9.1f} {point['seconds']:>6.2f}",
                flush=True,
            )

    first, last = curve[0], curve[-1]
    rss_growth = last["rss"] / first["rss"] - 1
    device_growth = last["device"] / first["device"] - 1
    extra = last["compiles"] - warmed
    print(
        f"after warm-up: {extra} compiles; resident memory {first['rss'] / 2**20:.0f} -> {last['rss'] / 2**20:.0f} MB "
        f"({rss_growth:+.1%}), device memory {first['device'] / 2**20:.1f} -> {last['device'] / 2**20:.1f} MB "
        f"({device_growth:+.1%}); peak resident {max(p['rss'] for p in curve) / 2**20:.0f} MB"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"warm_up_compiles": warmed, "buckets": len(warm), "curve": curve}, indent=1)
            + "\n"
        )
    failures = []
    if extra:
        failures.append(f"{extra} programs compiled after the warm-up")
    if rss_growth > args.tolerance:
        failures.append(f"resident memory grew {rss_growth:.1%}")
    if device_growth > args.tolerance:
        failures.append(f"device memory grew {device_growth:.1%}")
    print(
        "FAILED: " + "; ".join(failures)
        if failures
        else "flat: no compiles and no growth after the warm-up"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
