"""``hfax serve`` under load: concurrent streaming clients against one-at-a-time generation.

    python benchmarks/serve.py                           # benchmark Llama and Gemma 3 270M, 1/4/16 clients
    python benchmarks/serve.py --models llama --clients 1,16 --requests 16 --no-markdown

For each model the script starts ``hfax serve`` on 127.0.0.1 (a free port, ``--max-batch 16``) and sends
the same fixed set of greedy streaming completions (mixed prompt lengths and ``max_tokens``, drawn from a
seeded generator) with 1, 4 and 16 concurrent clients, once every prefill program has compiled (a
request of ``n`` choices for each prompt length and power of two ``n``: they are admitted together; it
prints how many programs compiled in the timed runs anyway). It reports output tokens/s over the whole run, p50/p99 time to first token and p50/p99
inter-token latency (per request: the time from its first to its last token over the tokens in
between). Then, with the server stopped, the same requests run one at a
time through hfax's ``model.generate`` (each shape run once before, so compiling is not counted) and
through transformers' own ``generate`` on PyTorch/CPU. Load is generated on 127.0.0.1 only and bounded
by ``--requests`` and ``--timeout``. It prints a table, writes a JSON record and rewrites the "Serving"
section of docs/PERFORMANCE.md (``benchmarks/decode.py`` keeps that section when it rewrites the page).

The benchmark Llama has random weights and no tokenizer: it is served from a folder that links its files
beside a word-level tokenizer of its 32000 tokens, and prompts are token ids for every model.

Beside ``transformers serve``: ``--transformers-serve EXECUTABLE`` (the ``transformers`` command of an
environment with ``transformers[serving]``) runs the same requests, as text, against ``hfax serve`` and
then ``transformers serve --continuous-batching`` on the same folder and dtype, in the same run. That
server takes no token-id prompts and reports no usage in streams, so these rows send each request's ids
decoded to text and count a response's tokens by tokenizing its text, for both servers alike.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import decode  # noqa: E402  (benchmarks/decode.py: the benchmark models and the Markdown page)

SECTION = "## Serving"
MODELS = ("llama", "gemma")
PROMPT_LENGTHS = (8, 24, 60, 120)
NEW_TOKENS = (16, 32, 64)


def workload(count: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """``count`` requests: prompt token ids (BOS-free, inside ``vocab``) and ``max_tokens``, mixed."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(10, vocab, int(rng.choice(PROMPT_LENGTHS))).tolist(),
            int(rng.choice(NEW_TOKENS)),
        )
        for _ in range(count)
    ]


def served_folder(name: str, scratch: Path) -> str:
    """The folder ``hfax serve`` loads: the model's own, or for the benchmark Llama (no tokenizer) its
    files linked beside a word-level tokenizer of its vocabulary."""
    path = decode.model_path(name)
    if name != "llama":
        return path
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    target = scratch / "llama"
    target.mkdir(exist_ok=True)
    for file in Path(path).iterdir():
        (target / file.name).symlink_to(file)
    words = {f"w{i}": i for i in range(decode.LLAMA_CONFIG["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="w2").save_pretrained(target)
    return str(target)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``hfax serve`` in a subprocess on 127.0.0.1."""

    name = "hfax serve"

    def __init__(
        self, path: str, dtype: str, slots: int, log: Path, options: tuple[str, ...] = ()
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-c", "from hfax.cli import main; main()", "serve", "-m", path,
                   "--dtype", dtype, "--port", str(self.port), "--max-batch", str(slots),
                   "--max-queue", "256", "--max-len", "256", *options]  # fmt: skip
        self._start(command, log)

    def _start(self, command: list[str], log: Path) -> None:
        """Run ``command`` with its output in ``log`` until the server answers ``/health`` (15 minutes)."""
        self.log = open(log, "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                # The log's folder goes with the run: its last lines go into the error.
                self.log.flush()
                tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
                raise RuntimeError(f"{self.name} exited {self.process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"{self.name} did not start in 15 minutes; see {log}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        return {line.split()[0]: float(line.split()[1]) for line in lines if line[:1] != "#"}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=120)
        self.log.close()


def one_request(
    client: Any, model: str, prompt: list[int] | str, max_tokens: int, count: Any = None
) -> dict[str, float]:
    """One greedy streamed completion: when it was sent, its first and last tokens came, and its tokens
    (the server's usage, or ``count`` of its text)."""
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    text = []
    usage = {} if count else {"stream_options": {"include_usage": True}}
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True, **usage)  # fmt: skip
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            first = first or now
            last = now
            text.append(chunk.choices[0].text)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if count:
        tokens = count("".join(text))
    return {"sent": sent, "first": first or last or sent, "last": last or sent, "tokens": tokens}


def load(url: str, model: str, requests: list[tuple[Any, int]], clients: int, timeout: float, count: Any = None) -> dict[str, Any]:  # fmt: skip
    """``requests`` sent by ``clients`` concurrent clients, each taking the next when its last ended."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda job: one_request(client, model, *job, count), requests))
    elapsed = time.perf_counter() - started
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["first"] - r["sent"] for r in results]
    itl = [(r["last"] - r["first"]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    return {
        "clients": clients,
        "requests": len(results),
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "itl_p50": float(np.percentile(itl, 50)),
        "itl_p99": float(np.percentile(itl, 99)),
    }


class TransformersServer(Server):
    """``transformers serve --continuous-batching`` of one folder in a subprocess on 127.0.0.1."""

    name = "transformers serve"

    def __init__(self, executable: str, path: str, dtype: str, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [executable, "serve", path, "--continuous-batching", "--dtype", dtype,
                   "--host", "127.0.0.1", "--port", str(self.port)]  # fmt: skip
        self._start(command, log)


def text_workload(path: str, requests: list[tuple[list[int], int]]) -> tuple[list[tuple[str, int]], Any]:  # fmt: skip
    """The requests with their ids decoded to text, and the function that counts a text's tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    texts = []
    for ids, n in requests:
        # Decoded ids can tokenize into more tokens: cut until the text is no longer than the ids were.
        text = tokenizer.decode(ids)
        while count(text) > len(ids):
            text = tokenizer.decode(
                tokenizer(text, add_special_tokens=False).input_ids[: len(ids) - 1]
            )
        texts.append((text, n))
    return texts, count


def beside_transformers(
    server: Server,
    path: str,
    requests: list[tuple[list[int], int]],
    args: argparse.Namespace,
    scratch: Path,  # fmt: skip
) -> list[dict[str, Any]]:
    """The requests as text through ``hfax serve`` (running) and then ``transformers serve
    --continuous-batching``, per client count; the latter's first requests (loading, warm-up) untimed."""
    texts, count = text_workload(path, requests)
    rows = []
    for clients in args.clients:
        rows.append({"server": "hfax serve", **load(server.url, path, texts, clients, args.timeout, count)})  # fmt: skip
        print(f"hfax serve, text prompts, {clients:>3} clients: {_line(rows[-1])}", flush=True)
    server.stop()
    theirs = TransformersServer(args.transformers_serve, path, args.dtype, scratch / "tserve.log")
    try:
        load(theirs.url, path, texts[:4], 4, args.timeout, count)
        for clients in args.clients:
            rows.append({"server": "transformers serve", **load(theirs.url, path, texts, clients, args.timeout, count)})  # fmt: skip
            print(f"transformers serve, {clients:>3} clients: {_line(rows[-1])}", flush=True)
    finally:
        theirs.stop()
    return rows


def warm_up(url: str, model: str, slots: int, timeout: float) -> None:
    """One request per prompt length and power of two ``n`` of choices up to ``slots``: the server
    compiles the prefill of every count of prompts admitted together at every prompt bucket."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout)
    for length in PROMPT_LENGTHS:
        n = 1
        while n <= slots:
            client.completions.create(model=model, prompt=list(range(10, 10 + length)),
                                      max_tokens=2, temperature=0, n=n)  # fmt: skip
            n *= 2


def one_at_a_time(engine: str, path: str, dtype: str, requests: list[tuple[list[int], int]]) -> dict[str, Any]:  # fmt: skip
    """The requests one after another through ``engine``'s generate (greedy, stopping at EOS)."""
    import torch

    if engine == "hfax-generate":
        from hfax import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, backend="jax", dtype=dtype)

        def generate(ids: list[int], n: int) -> int:
            out = np.asarray(model.generate(np.array([ids]), max_new_tokens=n, do_sample=False))
            return _count(out[0, len(ids) :], model.generation_config)

        for ids, n in requests:  # every prompt and length bucket compiled before the clock starts
            generate(ids, n)
    else:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        model.eval()

        def generate(ids: list[int], n: int) -> int:
            with torch.inference_mode():
                out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
            return _count(out[0, len(ids) :].numpy(), model.generation_config)

    started = time.perf_counter()
    tokens = sum(generate(ids, n) for ids, n in requests)
    elapsed = time.perf_counter() - started
    return {
        "engine": engine,
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
    }


def batched(
    path: str, dtype: str, requests: list[tuple[list[int], int]], batch: int
) -> dict[str, Any]:
    """The requests in groups of ``batch``, each group one greedy ``generate`` call (prompts left-padded,
    as many new tokens as the group's longest request; each request counts the tokens it asked for): what
    this machine's decoding gives ``batch`` rows at once, without a server's joins and leaves."""
    from hfax import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, backend="jax", dtype=dtype)
    groups = [requests[i : i + batch] for i in range(0, len(requests), batch)]

    def generate(group: list[tuple[list[int], int]]) -> int:
        width = max(len(ids) for ids, _ in group)
        ids = np.zeros((len(group), width), np.int64)
        mask = np.zeros((len(group), width), np.int64)
        for row, (prompt, _) in enumerate(group):
            ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
        most = max(n for _, n in group)
        out = np.asarray(
            model.generate(ids, attention_mask=mask, max_new_tokens=most, do_sample=False)
        )
        return sum(_count(out[row, width : width + n], model.generation_config)
                   for row, (_, n) in enumerate(group))  # fmt: skip

    for group in groups:  # every shape compiled before the clock starts
        generate(group)
    started = time.perf_counter()
    tokens = sum(generate(group) for group in groups)
    elapsed = time.perf_counter() - started
    return {"engine": "hfax-generate-batched", "tokens": tokens, "seconds": elapsed,
            "tokens_per_s": tokens / elapsed}  # fmt: skip


def _count(new: np.ndarray, config: Any) -> int:
    """New tokens before the first EOS (what the server reports as completion tokens)."""
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    hits = np.flatnonzero(np.isin(new, eos))
    return int(hits[0]) if hits.size else int(new.shape[0])


def run_model(name: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    path = served_folder(name, scratch)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).get_text_config().vocab_size
    requests = workload(args.requests, vocab)
    log = scratch / f"serve-{name}.log"
    server = Server(path, args.dtype, args.max_batch, log)
    rows = []
    try:
        # Every prefill compiled before the clock starts: each prompt bucket's, for every power of two
        # of prompts admitted together (one request's n choices are admitted together).
        warm_up(server.url, path, args.max_batch, args.timeout)
        warmed = server.metrics()["hfax_compiles_total"]
        for clients in args.clients:
            rows.append(load(server.url, path, requests, clients, args.timeout))
            print(f"{name} {clients:>3} clients: {_line(rows[-1])}", flush=True)
        compiles = server.metrics()["hfax_compiles_total"]
        print(
            f"{name}: {compiles - warmed:.0f} programs compiled during the timed runs", flush=True
        )
        beside = (
            beside_transformers(server, path, requests, args, scratch)
            if args.transformers_serve
            else []
        )
    finally:
        if server.process.poll() is None:
            server.stop()
    baselines = [
        batched(path, args.dtype, requests, args.max_batch)
        if engine == "hfax-generate-batched"
        else one_at_a_time(engine, path, args.dtype, requests)
        for engine in args.baselines
    ]
    for row in baselines:
        print(f"{name} {row['engine']}: {row['tokens_per_s']:.1f} tokens/s", flush=True)
    return {"model": name, "load": rows, "baselines": baselines, "compiles": compiles,
            "timed_compiles": compiles - warmed, "beside_transformers": beside}  # fmt: skip


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['tokens_per_s']:.1f} tokens/s, TTFT p50 {row['ttft_p50'] * 1e3:.0f} ms p99 "
        f"{row['ttft_p99'] * 1e3:.0f} ms, ITL p50 {row['itl_p50'] * 1e3:.1f} ms p99 {row['itl_p99'] * 1e3:.1f} ms"
    )


def markdown(record: dict[str, Any]) -> str:
    lines = []
    for result in record["results"]:
        alone = {row["engine"]: row["tokens_per_s"] for row in result["baselines"]}
        single = next((row for row in result["load"] if row["clients"] == 1), None)
        for row in result["load"]:
            ratio = (
                row["tokens_per_s"] / alone["hfax-generate"] if "hfax-generate" in alone else None
            )
            itl = row["itl_p99"] / single["itl_p99"] if single else None
            lines.append(
                f"| {result['model']} | hfax serve, {row['clients']} clients | {row['tokens_per_s']:.1f} "
                f"| {_ratio(ratio)} | {row['ttft_p50'] * 1e3:.0f} / {row['ttft_p99'] * 1e3:.0f} "
                f"| {row['itl_p50'] * 1e3:.1f} / {row['itl_p99'] * 1e3:.1f} | {_ratio(itl)} |"
            )
        for row in result["baselines"]:
            ratio = (
                row["tokens_per_s"] / alone["hfax-generate"] if "hfax-generate" in alone else None
            )
            how = (
                f"{record['max_batch']} at a time"
                if row["engine"] == "hfax-generate-batched"
                else "one at a time"
            )
            lines.append(
                f"| {result['model']} | {row['engine']}, {how} | {row['tokens_per_s']:.1f} "
                f"| {_ratio(ratio)} | | | |"
            )
    return f"""{SECTION}

Generated by `benchmarks/serve.py`; rerun it rather than editing this section.

- Command: `{record["command"]}`
- Measured {record["started"]} to {record["finished"]} on {record["machine"]}
- Load average (1, 5, 15 min) before: {record["load_average_before"]}, after: {record["load_average_after"]}

The same {record["requests"]} greedy streamed completions (prompts of {", ".join(map(str, PROMPT_LENGTHS))}
tokens, `max_tokens` {", ".join(map(str, NEW_TOKENS))}, {record["dtype"]}) sent to `hfax serve --max-batch
{record["max_batch"]} --max-len 256` on 127.0.0.1 by 1, 4 and 16 concurrent clients, then run one at a time
through hfax's `model.generate` (compiled beforehand) and transformers' `generate` on PyTorch/CPU, and in
groups of {record["max_batch"]} through one hfax `generate` call each (`hfax-generate-batched`: what this
machine's decoding gives that many rows at once, with no joins or leaves; each request counts the tokens
it asked for). *tok/s*:
output tokens over the run's wall time; *× alone*: over hfax `generate` one at a time; TTFT: send to first
token; ITL: per request, first to last token over the tokens between; *p99 ITL × 1 client*: against the
single client's p99.

| model | engine | tok/s | × alone | TTFT p50 / p99 ms | ITL p50 / p99 ms | p99 ITL × 1 client |
|---|---|---|---|---|---|---|
{chr(10).join(lines)}
{_beside_markdown(record)}"""


def _beside_markdown(record: dict[str, Any]) -> str:
    """The rows beside ``transformers serve``, when the run has them."""
    lines = []
    for result in record["results"]:
        rows = result.get("beside_transformers") or []
        theirs = {row["clients"]: row for row in rows if row["server"] == "transformers serve"}
        for row in rows:
            other = theirs.get(row["clients"])
            ratio = row["tokens_per_s"] / other["tokens_per_s"] if other else None
            lines.append(
                f"| {result['model']} | {row['server']}, {row['clients']} clients | {row['tokens_per_s']:.1f} "
                f"| {_ratio(ratio)} | {row['ttft_p50'] * 1e3:.0f} / {row['ttft_p99'] * 1e3:.0f} "
                f"| {row['itl_p50'] * 1e3:.1f} / {row['itl_p99'] * 1e3:.1f} |"
            )
    if not lines:
        return ""
    return f"""
Beside `transformers serve --continuous-batching` (same folder and dtype, the same requests as text:
each request's ids decoded, a response's tokens counted by tokenizing its text, for both servers; the
transformers server's first 4 requests untimed). *× transformers serve*: tok/s over its row at the same
client count.

| model | server | tok/s | × transformers serve | TTFT p50 / p99 ms | ITL p50 / p99 ms |
|---|---|---|---|---|---|
{chr(10).join(lines)}
"""


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=32, help="requests per client count")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    parser.add_argument("--baselines", default="hfax-generate,hfax-generate-batched,transformers")
    parser.add_argument("--transformers-serve", default="", metavar="EXECUTABLE",
                        help="also run the requests as text against transformers serve (its command)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "serve.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    parser.add_argument("--no-markdown", action="store_true", help="do not touch the Markdown page")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    args.baselines = [b for b in args.baselines.split(",") if b]
    record: dict[str, Any] = {
        "command": " ".join(["benchmarks/serve.py", *(sys.argv[1:] if argv is None else argv)]),
        "started": now(),
        "machine": f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), "
        f"{platform.platform()}",
        "load_average_before": list(os.getloadavg()),
        "requests": args.requests,
        "dtype": args.dtype,
        "max_batch": args.max_batch,
    }
    with tempfile.TemporaryDirectory() as scratch:
        results = [run_model(name, args, Path(scratch)) for name in args.models.split(",")]
    record.update(finished=now(), load_average_after=list(os.getloadavg()), results=results)
    print(f"load average (1, 5, 15 min): {record['load_average_after']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    if not args.no_markdown:
        decode.write_section(args.markdown, SECTION, markdown(record))
    return 0


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
