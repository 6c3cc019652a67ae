"""``hfax serve``'s host path alone: how many streamed tokens per second its HTTP layer, scheduler and
detokenizer sustain when the device costs nothing.

    python benchmarks/serve_host.py                      # 1, 16 and 64 clients
    python benchmarks/serve_host.py --clients 64 --requests 256 --max-tokens 512

On an accelerator one decode step of a small model takes about a millisecond, so a server whose Python
costs more than that per step and client bounds the device. This script serves through the real
``hfax.serve`` app and scheduler, but with :class:`StandInEngine` in place of a backend's slot engine: a
test double that lives here, never in the product, and returns a token for every busy row at once. What
is measured is therefore everything ``hfax serve`` does besides the device. The server runs in a
subprocess (``--stand-in-server``) on 127.0.0.1; concurrent streaming clients in this process read raw
server-sent events (``http.client``, no JSON parsing but the last event's usage), each sending its next
request when its last ended. On a machine of few cores the clients share the CPU with the server: the
figure is a floor for the server alone. The load average is printed beside each run.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

#: The tiny word-level tokenizer's vocabulary (``hfax.testing.save_tiny_tokenizer``); the stand-in
#: engine cycles through its ordinary words, so every token detokenizes to text.
VOCAB = 128
FIRST_WORD = 5


class StandInEngine:
    """A :class:`hfax.generation.slots.SlotEngine` whose steps cost nothing: every busy row gets
    ``steps`` new tokens per :meth:`decode` (fewer at its limit), counting up through the vocabulary's
    words; the clock moves as a real engine's does, so the scheduler places, shifts and packs rows as it
    would on a device. Never EOS: a request ends at its ``max_tokens``. ``step_s`` is a step's time on a
    device that runs the chunks one after another from when they are decoded, as JAX dispatches them:
    :meth:`read` waits, without the GIL, until its chunk would be done (0: the host alone bounds the rate,
    and the scheduler's thread competes with the HTTP layer's for the interpreter all the time)."""

    prefixes = 0  # no prefix store: every prompt is prefilled (for nothing) whole
    lookup = 0  # no guessed tokens: a step gives a row one token
    piece = 0  # every prompt prefilled whole

    def __init__(self, slots: int, length: int, chunk: int, step_s: float = 0.0) -> None:
        self.step_s = step_s
        self.slots, self.length, self.chunk, self.clock, self.vocab = slots, length, chunk, 0, VOCAB
        self.left = np.zeros((slots,), np.int64)  # new tokens each row may still make
        self.next = np.zeros((slots,), np.int64)
        self.chunks: collections.deque[tuple[Any, int, float]] = collections.deque()  # unread
        self.free_at = 0.0  # when the stand-in device finishes the chunks decoded so far

    @property
    def unread(self) -> int:
        return len(self.chunks)

    @property
    def ahead(self) -> int:
        return sum(columns for _, columns, _ in self.chunks)

    def bucket(self, length: int) -> int:
        return max(16, 1 << (length - 1).bit_length())

    def admit(self, requests: list[Any]) -> list[dict[str, Any]]:
        from hfax.generation.rows import TOP_LOGPROBS

        choices = []
        for request in requests:
            self.left[request.row], self.next[request.row] = request.max_new - 1, len(request.ids)
            choices.append({
                "token": np.int32(self._token(request.row)),
                "logprob": np.float32(0.0),
                "top_ids": np.zeros((TOP_LOGPROBS,), np.int32),
                "top_logprobs": np.zeros((TOP_LOGPROBS,), np.float32),
            })  # fmt: skip
        return choices

    def _token(self, row: int) -> int:
        self.next[row] += 1
        return FIRST_WORD + int(self.next[row]) % (VOCAB - FIRST_WORD)

    def score(self, ids: list[int]) -> Any:
        raise NotImplementedError(
            "the stand-in engine scores nothing: this benchmark sends no echo"
        )

    def decode(self, steps: int, rows: int, allowed: Any = None, guess: bool = False) -> None:
        from hfax.generation.rows import TOP_LOGPROBS
        from hfax.generation.slots import Chunk

        slots = self.slots
        count = np.zeros((slots,), np.int32)
        count[:rows] = np.minimum(self.left[:rows], steps)
        tokens = np.zeros((slots, steps), np.int32)
        for row in np.flatnonzero(count):
            tokens[row, : count[row]] = [self._token(row) for _ in range(count[row])]
        self.left -= count
        chunk = Chunk(
            tokens=tokens,
            logprobs=np.zeros((slots, steps), np.float32),
            top_ids=np.zeros((slots, steps, TOP_LOGPROBS), np.int32),
            top_logprobs=np.zeros((slots, steps, TOP_LOGPROBS), np.float32),
            count=count,
            finished=self.left <= 0,
        )
        self.free_at = max(time.perf_counter(), self.free_at) + self.step_s * steps
        self.chunks.append((chunk, int(count.max(initial=0)), self.free_at))

    def read(self) -> Any:
        chunk, columns, done = self.chunks.popleft()
        wait = done - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        self.clock += columns
        return chunk

    def release(self, free: np.ndarray) -> None:
        self.left[free] = 0

    def shift(self, delta: int) -> None:
        self.clock += delta

    def move(self, source: int, target: int) -> None:
        self.left[target], self.next[target] = self.left[source], self.next[source]
        self.left[source] = 0

    def restart(self, clock: int) -> None:
        self.clock = clock

    def counters(self) -> tuple[int, float]:
        return 0, 0.0


def serve_stand_in(port: int, slots: int, length: int, chunk: int, step_s: float) -> None:
    """``hfax serve``'s app and scheduler over :class:`StandInEngine`, on 127.0.0.1:``port``."""
    import uvicorn

    from hfax.serve.app import Server, build
    from hfax.serve.scheduler import Scheduler
    from hfax.testing import save_tiny_tokenizer

    tokenizer = save_tiny_tokenizer(tempfile.mkdtemp(prefix="hfax-serve-host-"), VOCAB)
    scheduler = Scheduler(StandInEngine(slots, length, chunk, step_s), [], max_queue=4096)
    server = Server(scheduler, tokenizer, "stand-in", length)
    uvicorn.run(build(server), host="127.0.0.1", port=port, log_level="warning")


def one_request(port: int, ids: list[int], max_tokens: int) -> dict[str, float]:
    """One streamed completion read as raw events: when it was sent, its first and last events came, and
    the completion tokens its usage reports."""
    body = json.dumps({"model": "stand-in", "prompt": ids, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"the server answered {response.status}: {response.read()[:300]!r}")
    first = last = None
    usage = b""
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        first, last = first or now, now
        if b'"usage": {' in line or b'"usage":{' in line:
            usage = line
    connection.close()
    tokens = json.loads(usage[len(b"data: ") :])["usage"]["completion_tokens"] if usage else 0
    return {"sent": sent, "first": first or sent, "last": last or sent, "tokens": tokens}


def load(port: int, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    jobs = [([FIRST_WORD + i % 50] * 8, max_tokens) for i in range(requests)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda job: one_request(port, *job), jobs))
    elapsed = time.perf_counter() - started
    tokens = sum(r["tokens"] for r in results)
    # Per request, its first to last event over the tokens between (the server may send several per event).
    itl = [(r["last"] - r["first"]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    return {
        "clients": clients,
        "requests": requests,
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "ttft_p50_ms": 1000 * float(np.percentile([r["first"] - r["sent"] for r in results], 50)),
        "itl_p99_ms": 1000 * float(np.percentile(itl, 99)),
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument(
        "--requests", type=int, default=0, help="per client count (0: 4 per client, at least 16)"
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--slots", type=int, default=64, help="the engine's rows (hfax serve --max-batch)"
    )
    parser.add_argument(
        "--chunk", type=int, default=4, help="decode steps per chunk, as hfax serve's engine"
    )
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="the stand-in's time per decode step (0: none)"
    )
    parser.add_argument(
        "--max-len",
        type=int,
        default=0,
        help="the engine's row length (hfax serve --max-len; 0: 16 + --max-tokens, a request's whole need)",
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--stand-in-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    length = args.max_len or 16 + args.max_tokens
    if args.stand_in_server:
        serve_stand_in(args.stand_in_server, args.slots, length, args.chunk, args.step_ms / 1000)
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, __file__, "--stand-in-server", str(port), "--slots", str(args.slots),
               "--chunk", str(args.chunk), "--max-tokens", str(args.max_tokens),
               "--step-ms", str(args.step_ms), "--max-len", str(length)]  # fmt: skip
    server = subprocess.Popen(command)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"the stand-in server exited {server.returncode}") from None
                time.sleep(0.5)
        load(port, 4, 8, 16)  # the first requests pay for imports and first calls
        rows = []
        print(f"{'clients':>8} {'tokens/s':>10} {'TTFT p50 ms':>12} {'ITL p99 ms':>11} {'load':>5}")
        for clients in map(int, args.clients.split(",")):
            row = load(port, clients, args.requests or max(16, 4 * clients), args.max_tokens)
            rows.append(row)
            print(f"{clients:>8} {row['tokens_per_s']:>10.0f} {row['ttft_p50_ms']:>12.1f} "
                  f"{row['itl_p99_ms']:>11.2f} {row['load_average']:>5.2f}")  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
    if args.json:
        record = {"max_tokens": args.max_tokens, "step_ms": args.step_ms, "rows": rows}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
