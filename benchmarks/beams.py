"""Beam search on the benchmark Llama: hfax against transformers' own beam search on PyTorch/CPU, one run.

    python benchmarks/beams.py                        # batch 1, 4 beams, prompt 32, 64 new tokens
    python benchmarks/beams.py --beams 2,4 --new-tokens 128 --backend jax

Both sides get the same random prompt and greedy beam settings (``min_new_tokens`` = ``max_new_tokens``, so
EOS never ends a beam early); the script prints each side's best-of-``--repeats`` wall time of a whole
``generate`` call after a warm-up (hfax's compilation excluded, as transformers has none), the new tokens
per second, the ratio, and whether the returned sequences agree.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def best_time(call, repeats: int) -> tuple[float, np.ndarray]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - started)
    return best, np.asarray(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beams", default="4", help="beam counts, comma-separated")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="jax")
    args = parser.parse_args(argv)

    import torch
    import transformers

    import decode
    import hfax

    path = decode.llama_path()
    prompt = np.random.default_rng(0).integers(3, 32000, size=(args.batch, args.prompt))
    reference = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    model = hfax.AutoModelForCausalLM.from_pretrained(path, backend=args.backend)
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores")
    print(
        f"{'beams':>5} {'transformers tok/s':>19} {'hfax tok/s':>11} {'ratio':>6}  same sequences"
    )
    for beams in (int(b) for b in args.beams.split(",")):
        options = dict(
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            num_beams=beams,
            do_sample=False,
        )

        def theirs():
            with torch.no_grad():
                return reference.generate(torch.from_numpy(prompt), **options).numpy()

        def ours():
            return np.asarray(model.generate(prompt, **options))

        ours()  # compile
        their_s, their_ids = best_time(theirs, args.repeats)
        our_s, our_ids = best_time(ours, args.repeats)
        tokens = args.batch * args.new_tokens
        same = their_ids.shape == our_ids.shape and bool((their_ids == our_ids).all())
        print(
            f"{beams:>5} {tokens / their_s:>19.1f} {tokens / our_s:>11.1f} {their_s / our_s:>6.2f}  {same}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
