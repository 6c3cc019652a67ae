"""A running stream's delivery gaps while ``hfax serve``'s scheduler admits a long prompt, prefilled whole
or in pieces (``--prefill-chunk``).

    python benchmarks/serve_pieces.py                       # Gemma 3 270M, 900-token prompts
    python benchmarks/serve_pieces.py --runs 2048:0,2048:256,1024:256 --rounds 3

The scheduler and the JAX slot engine of ``hfax serve`` run in this process (no HTTP: the gaps are the
scheduler's), ``--max-batch 2``, one engine per ``LENGTH:PIECE`` of ``--runs`` (rows of LENGTH columns,
``--prefill-chunk PIECE``, 0 prefilling whole; a 900-token prompt's bucket of 1024 and 8 new tokens do
not fit rows of 1024 whole). Each round streams a greedy 16-token prompt's ``--stream-tokens`` new
tokens and, once 8 have come, submits a ``--prompt``-token prompt for 8 tokens. The first round
compiles what the others need and is not counted. It prints, per run, the gaps between the stream's
deliveries (each carries up to a decode chunk of 4 tokens): p50, p99 and the longest, over the counted
rounds, and the long prompt's mean time to first token. Prompts are random token ids. Nothing is
written: the numbers go into docs/PERFORMANCE.md by hand.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np


def one_round(scheduler: object, args: argparse.Namespace, rng: np.random.Generator) -> tuple[list[float], float]:  # fmt: skip
    """The stream's delivery gaps and the long prompt's time to first token, in seconds."""
    from hfax.generation.rows import Sampling
    from hfax.serve.scheduler import Sequence

    started, done = threading.Event(), threading.Semaphore(0)
    times: list[float] = []
    first: list[float] = []
    streamed = [0]

    def stream(event) -> None:
        times.append(time.perf_counter())
        streamed[0] += len(event.ids)
        if streamed[0] >= 8 or event.finish:
            started.set()
        if event.finish:
            done.release()

    def long(event) -> None:
        first.append(time.perf_counter())
        if event.finish:
            done.release()

    short = rng.integers(10, args.vocab, 16).tolist()
    scheduler.submit([Sequence(short, args.stream_tokens, Sampling(0.0), stream)])  # type: ignore[attr-defined]
    started.wait()
    sent = time.perf_counter()
    prompt = rng.integers(10, args.vocab, args.prompt).tolist()
    scheduler.submit([Sequence(prompt, 8, Sampling(0.0), long)])  # type: ignore[attr-defined]
    done.acquire()
    done.acquire()
    return np.diff(times).tolist(), first[0] - sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model folder (default: Gemma 3 270M)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--runs", default="2048:0,2048:256,1024:256", help="LENGTH:PIECE, comma-separated"
    )
    parser.add_argument("--prompt", type=int, default=900, help="the long prompt's tokens")
    parser.add_argument("--stream-tokens", type=int, default=96)
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per run, the first not counted"
    )
    parser.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below it")
    args = parser.parse_args(argv)
    import hfax
    from hfax import serve
    from hfax.demo import default_model
    from hfax.serve.scheduler import Scheduler

    model = hfax.AutoModelForCausalLM.from_pretrained(
        args.model or default_model(), backend="jax", dtype=args.dtype
    )
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    for run in args.runs.split(","):
        length, piece = (int(part) for part in run.split(":"))
        began = time.perf_counter()
        engine = serve.engine(hfax.get_backend("jax"), model, slots=2, length=length, piece=piece)
        made = time.perf_counter() - began
        scheduler = Scheduler(engine, eos, max_queue=8)
        rng = np.random.default_rng(0)
        gaps, firsts = [], []
        try:
            for i in range(args.rounds):
                round_gaps, first = one_round(scheduler, args, rng)
                if i:
                    gaps += round_gaps
                    firsts.append(first)
                    print(f"  {run} round {i}: longest gap {max(round_gaps):.2f} s, TTFT {first:.2f} s", flush=True)  # fmt: skip
        finally:
            scheduler.close()
        ms = 1000 * np.array(gaps)
        print(
            f"--max-len {length} --prefill-chunk {piece}: engine made in {made:.0f} s; stream delivery "
            f"gaps p50 {np.percentile(ms, 50):.0f} ms, p99 {np.percentile(ms, 99):.0f} ms, longest "
            f"{ms.max():.0f} ms ({len(ms)} gaps); long prompt TTFT {np.mean(firsts):.2f} s; "
            f"pieces {scheduler.counters.prefill_pieces}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
