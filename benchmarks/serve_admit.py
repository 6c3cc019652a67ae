"""Prefilling a burst of waiting requests on the JAX slot engine: one program per prompt, one per prompt
bucket, or one for all (every prompt padded into the longest one's bucket).

    python benchmarks/serve_admit.py                     # 16 prompts of benchmarks/serve.py's mix
    python benchmarks/serve_admit.py --requests 8 --repeats 5

What ``hfax serve``'s scheduler chooses between when several requests wait at once (it prefills one
program per prompt bucket among them: :meth:`hfax.serve.scheduler.Scheduler._admit`). The benchmark Llama
(``benchmarks/decode.py``, float32, random weights) in a :class:`hfax.backends.jax.slots.SlotEngine` of
``--requests`` rows and 256 columns; the prompts are ``benchmarks/serve.py``'s workload (8, 24, 60 and
120 tokens). Each way is run once to compile, then timed ``--repeats`` times (the best is printed with
every run): the time from the first program call to the last first token on the host.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).parent))
import decode  # noqa: E402  (benchmarks/decode.py: the benchmark models)
import serve  # noqa: E402  (benchmarks/serve.py: the serving workload)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from hfax import AutoModelForCausalLM
    from hfax.backends.jax.slots import SlotEngine
    from hfax.generation.rows import Sampling
    from hfax.generation.slots import Admission

    model = AutoModelForCausalLM.from_pretrained(decode.llama_path(), backend="jax")
    engine = SlotEngine(model, slots=args.requests, length=256, chunk=4)
    vocab = decode.LLAMA_CONFIG["vocab_size"]
    requests = [
        Admission(row, ids, Sampling(0.0), new)
        for row, (ids, new) in enumerate(serve.workload(args.requests, vocab))
    ]
    by_bucket: dict[int, list[Admission]] = {}
    for request in requests:
        by_bucket.setdefault(engine.bucket(len(request.ids)), []).append(request)
    ways: dict[str, Callable[[], list[list[Admission]]]] = {
        "one program per prompt": lambda: [[request] for request in requests],
        "one program per prompt bucket": lambda: list(by_bucket.values()),
        "one program, longest bucket": lambda: [requests],
    }
    print(
        f"prompts of {sorted(len(r.ids) for r in requests)} tokens; load average {os.getloadavg()}"
    )
    engine.restart(128)  # the longest bucket fits before the clock
    for name, calls in ways.items():
        for group in calls():  # compiled before the clock starts
            engine.admit(group)
        runs = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            for group in calls():
                engine.admit(group)  # returns the first tokens on the host
            runs.append(time.perf_counter() - started)
        print(
            f"{name} ({len(calls())} calls): {min(runs) * 1e3:.0f} ms "
            f"(runs {', '.join(f'{r * 1e3:.0f}' for r in runs)})",
            flush=True,
        )
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
