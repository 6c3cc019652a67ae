"""A running stream's delivery gaps while ``hfax serve`` admits a long prompt, prefilled whole or in pieces.

    python benchmarks/serve_pieces.py                          # Gemma 3 270M, 900-token prompts, --max-len 1024
    python benchmarks/serve_pieces.py --max-len 2048 --chunks 0,256,128

For each ``--prefill-chunk`` value of ``--chunks`` (0: every prompt prefilled whole) the script starts
``hfax serve`` (``--max-batch 2``) on 127.0.0.1 and runs ``--rounds`` rounds of: one greedy streamed
completion of a 16-token prompt (``--stream-tokens`` new tokens, ``logprobs`` on so that each delivery
says how many tokens it carries), and, once it has delivered 8 tokens, a ``--prompt``-token completion of
8 tokens. A round before the clock starts compiles whatever the timed ones need. It prints, per chunk
value, the gaps between the stream's deliveries (each carries up to a decode chunk of tokens): p50, p99
and the longest, all rounds together, and the long prompt's time to first token (p50). Prompts are
random token ids. Nothing is written: the numbers go into docs/PERFORMANCE.md by hand.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import serve  # noqa: E402  (benchmarks/serve.py: the served folder, the server, one streamed request)


def stream(client: Any, model: str, prompt: list[int], tokens: int, started: threading.Event) -> list[tuple[float, int]]:  # fmt: skip
    """The stream's deliveries: when each came and how many tokens it carried; ``started`` is set once
    8 tokens came."""
    deliveries = []
    got = 0
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=tokens,
                                           temperature=0, stream=True, logprobs=1):  # fmt: skip
        now = time.perf_counter()
        logprobs = chunk.choices[0].logprobs if chunk.choices else None
        count = len(logprobs.tokens) if logprobs and logprobs.tokens else 0
        if count:
            deliveries.append((now, count))
            got += count
            if got >= 8:
                started.set()
    started.set()
    return deliveries


def one_round(client: Any, model: str, args: argparse.Namespace, seed: int) -> tuple[list[float], float]:  # fmt: skip
    """One round (see the module docstring): the stream's delivery gaps and the long prompt's TTFT."""
    rng = np.random.default_rng(seed)
    short = rng.integers(10, args.vocab, 16).tolist()
    long = rng.integers(10, args.vocab, args.prompt).tolist()
    started = threading.Event()
    result: dict[str, Any] = {}

    def run_stream() -> None:
        result["deliveries"] = stream(client, model, short, args.stream_tokens, started)

    thread = threading.Thread(target=run_stream)
    thread.start()
    started.wait()
    record = serve.one_request(client, model, long, 8)
    thread.join()
    times = [when for when, _ in result["deliveries"]]
    return np.diff(times).tolist(), record["first"] - record["sent"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma", help="llama or gemma (benchmarks/decode.py's)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--chunks", default="0,256", help="--prefill-chunk values, comma-separated")
    parser.add_argument("--prompt", type=int, default=900, help="the long prompt's tokens")
    parser.add_argument("--stream-tokens", type=int, default=96)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below it")
    parser.add_argument("--logs", default=None, help="a folder to keep the servers' logs in")
    args = parser.parse_args(argv)
    import openai

    path = serve.served_folder(args.model, Path(tempfile.mkdtemp()))
    for chunk in [int(c) for c in args.chunks.split(",")]:
        with tempfile.TemporaryDirectory() as scratch:
            scratch = args.logs or scratch
            options = ("--max-len", str(args.max_len), "--prefill-chunk", str(chunk))
            server = serve.Server(
                path, args.dtype, 2, Path(scratch) / f"serve-{chunk}.log", options
            )
            try:
                client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
                one_round(client, path, args, seed=1000)  # compiles what the rounds need
                compiles = server.metrics()["hfax_compiles_total"]
                gaps, firsts = [], []
                for i in range(args.rounds):
                    round_gaps, first = one_round(client, path, args, seed=i)
                    print(f"  round {i}: longest gap {max(round_gaps):.2f} s, long TTFT {first:.2f} s", flush=True)  # fmt: skip
                    gaps += round_gaps
                    firsts.append(first)
                metrics = server.metrics()
            finally:
                server.stop()
        gaps_ms = 1000 * np.array(gaps)
        print(
            f"--prefill-chunk {chunk}: stream delivery gaps p50 {np.percentile(gaps_ms, 50):.0f} ms, "
            f"p99 {np.percentile(gaps_ms, 99):.0f} ms, longest {gaps_ms.max():.0f} ms "
            f"({len(gaps)} gaps); long prompt TTFT p50 {np.median(firsts):.2f} s; "
            f"pieces {metrics['hfax_prefill_pieces_total']:.0f}; "
            f"compiled while timed {metrics['hfax_compiles_total'] - compiles:.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
