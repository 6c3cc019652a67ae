"""Architecture coverage: run every transformers architecture, tiny and random, on every installed hfax backend.

    python tools/coverage.py                       # the full sweep; writes docs/COVERAGE.md and docs/coverage.json
    python tools/coverage.py --only llama,gpt2     # some architectures, printed, nothing written
    python tools/coverage.py --kinds causal        # the causal rows again; the other kinds' rows are kept
    python tools/coverage.py --only rwkv --merge   # re-run some rows of the written matrix after a fix
    nox -s coverage                                # the full sweep in its own environment

Rows are the architectures of transformers' auto mappings: causal LM (``AutoModelForCausalLM``), encoder
(``AutoModel`` of the masked-LM architectures), encoder-decoder (``AutoModelForSeq2SeqLM``) and sequence
classification. Each runs in a worker process with a time limit, so a hang or a crash costs one row; the
checks themselves are in ``coverage_checks.py`` and the tiny configs in ``tiny_configs.py``.

The matrix in ``docs/`` is this script's output and nothing else. ``coverage.json`` also keeps a floor per
check, which a run only raises: ``tests/test_coverage.py`` fails when fewer architectures pass than that.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULT = "@@CHECK "
DONE = "@@DONE"
TASKS_PER_WORKER = 20  # a fresh worker now and then keeps leaked compiled programs from piling up
MARK = {"pass": "✅", "fail": "❌", "skip": "·", "timeout": "⏱", "crash": "💥"}
TITLES = {
    "causal": "Causal language models (`AutoModelForCausalLM`)",
    "encoder": "Encoders (`AutoModel`, last hidden state)",
    "seq2seq": "Encoder-decoders (`AutoModelForSeq2SeqLM`)",
    "classification": "Sequence classification (`AutoModelForSequenceClassification`)",
    "image_classification": "Image classification (`AutoModelForImageClassification`)",
}
#: The checks whose pass counts may not fall (tests/test_coverage.py), as ``kind.check``.
FLOOR_CHECKS = (
    "causal.generate",
    "causal.jit",
    "causal.padded",
    "seq2seq.generate",
    "encoder.jit",
    "classification.jit",
)


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {env.get('XLA_FLAGS', '')}".strip(),
        JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"),
        HFAX_STRICT_PLUGINS="1",
        HFAX_NO_COMPILATION_CACHE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    return env


def usable_backends() -> tuple[list[str], dict[str, str]]:
    """The installed backends that load here, and why each other one does not (torch_xla missing, ...)."""
    from hfax import plugins

    usable, unavailable = [], {}
    for name, spec in sorted(plugins.backends().items()):
        try:
            spec.load()
        except ImportError as error:
            unavailable[name] = f"{type(error).__name__}: {error}"
        else:
            usable.append(name)
    return usable, unavailable


def architectures(kind: str) -> list[str]:
    """The model types of ``kind``'s transformers auto mapping, in mapping order."""
    from transformers.models.auto import modeling_auto

    mapping = {
        "causal": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "encoder": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq2seq": modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "classification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "image_classification": modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    }[kind]
    return list(mapping)


class Worker:
    """A worker process running one architecture at a time; killed and replaced when one hangs or crashes."""

    def __init__(self) -> None:
        self.log = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            [sys.executable, "-u", str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=worker_env(),
            cwd=ROOT,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: collections.deque[str] = collections.deque(maxlen=30)
        threading.Thread(
            target=self._pump, args=(self.process.stdout, self.lines.put), daemon=True
        ).start()
        threading.Thread(
            target=self._pump, args=(self.process.stderr, self.stderr.append), daemon=True
        ).start()
        self.tasks = 0

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in stream:
            sink(line.rstrip("\n"))
        sink(None)

    def run(
        self, kind: str, arch: str, timeout: float
    ) -> tuple[dict[str, str], dict[str, str], float]:
        """Send one task; collect ``status`` and ``errors`` per check until done, a crash or ``timeout``."""
        self.tasks += 1
        status: dict[str, str] = {}
        errors: dict[str, str] = {}
        started = time.monotonic()
        self.process.stdin.write(json.dumps({"kind": kind, "arch": arch}) + "\n")
        self.process.stdin.flush()
        while True:
            remaining = timeout - (time.monotonic() - started)
            try:
                line = self.lines.get(timeout=max(remaining, 0.01))
            except queue.Empty:
                self.kill()
                errors["_"] = f"timed out after {timeout:.0f} s"
                status["_"] = "timeout"
                break
            if line is None:
                tail = [entry for entry in self.stderr if entry]
                self.kill()
                errors["_"] = "worker died: " + (
                    tail[-1][:200] if tail else f"exit code {self.process.returncode}"
                )
                status["_"] = "crash"
                break
            if line == DONE:
                break
            if line.startswith(RESULT):
                name, state, detail = json.loads(line[len(RESULT) :])
                status[name] = state
                if detail:
                    errors[name] = detail
        return status, errors, time.monotonic() - started

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(
                self.process.pid, signal.SIGKILL
            )  # its own session: the worker and its children only
        self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def sweep(
    tasks: list[tuple[str, str]], jobs: int, timeout: float, progress: bool = True
) -> dict[str, dict[str, Any]]:
    """Run ``tasks`` (kind, architecture) on ``jobs`` workers; returns ``{kind: {arch: row}}``."""
    pending: queue.Queue[tuple[str, str]] = queue.Queue()
    for task in tasks:
        pending.put(task)
    results: dict[str, dict[str, Any]] = collections.defaultdict(dict)
    lock = threading.Lock()
    done = [0]

    def slot() -> None:
        worker: Worker | None = None
        while True:
            try:
                kind, arch = pending.get_nowait()
            except queue.Empty:
                break
            if worker is None or not worker.alive() or worker.tasks >= TASKS_PER_WORKER:
                if worker is not None:
                    worker.close()
                worker = Worker()
            status, errors, seconds = worker.run(kind, arch, timeout)
            with lock:
                results[kind][arch] = {
                    "status": status,
                    "errors": errors,
                    "seconds": round(seconds, 1),
                }
                done[0] += 1
                if progress:
                    failed = [
                        name for name, state in status.items() if state not in ("pass", "skip")
                    ]
                    line = f"[{done[0]}/{len(tasks)}] {kind:14s} {arch:28s} {seconds:6.1f}s "
                    line += "ok" if not failed else "failed: " + ", ".join(failed)
                    print(line, flush=True)
        if worker is not None:
            worker.close()

    threads = [threading.Thread(target=slot) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(results)


def worker_main() -> None:
    """Run tasks read from stdin, one JSON object a line, reporting each check on stdout."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    torch.set_num_threads(1)
    import coverage_checks
    import transformers

    transformers.logging.set_verbosity_error()
    backends, _ = usable_backends()

    def report(name: str, state: str, detail: str) -> None:
        print(RESULT + json.dumps([name, state, detail]), flush=True)

    for line in sys.stdin:
        task = json.loads(line)
        coverage_checks.run(task["kind"], task["arch"], backends, report)
        print(DONE, flush=True)


# ----------------------------------------------------------------------------------------------- report


def _as_result(row: dict[str, Any]) -> dict[str, Any]:
    """A row of a written document as :func:`sweep` returns it."""
    return {"status": dict(row["status"]), "errors": row["errors"], "seconds": row["seconds"]}


def complete(
    kind: str, row: dict[str, Any], backends: list[str], checks: Iterable[str]
) -> dict[str, str]:
    """Every check of a row, a timeout or crash charged to the first check that did not report."""
    status = dict(row["status"])
    trouble = status.pop("_", None)
    names = ["reference"] + [f"{backend}.{check}" for backend in backends for check in checks]
    for name in names:
        if name not in status:
            status[name] = trouble or "skip"
            trouble = "skip" if trouble else None
    return status


def first_failure(row: dict[str, Any], status: dict[str, str]) -> str:
    errors = row["errors"]
    for name, state in status.items():
        if state in ("fail", "timeout", "crash"):
            return f"{name}: {errors.get(name) or errors.get('_', state)}"
    return ""


def cause(message: str) -> str:
    """An error line with its numbers and quoted names blurred, so equal causes group together."""
    message = re.sub(r"\[[^\]]*\]$", "", message).strip()
    message = re.sub(r"'[^']*'", "'…'", message)
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", message)[:160]


def summarize(
    results: dict[str, dict[str, Any]],
    meta: dict[str, Any],
    previous: dict[str, Any] | None,
    merge: bool = False,
) -> dict[str, Any]:
    """The machine-readable matrix: rows with every check's state, totals, and the ratcheted floor.

    ``merge``: ``results`` re-ran some architectures; their rows replace the previous run's, the others stay
    (the previous run must have had the same backends), and ``rerun`` records which rows ran when.
    """
    from coverage_checks import KINDS

    backends = meta["backends"]
    document: dict[str, Any] = {**meta, "kinds": {}, "totals": {}, "floor": {}}
    ran = set() if merge else set(results)  # kinds this run swept whole
    if merge:
        if previous is None or previous["backends"] != backends:
            raise ValueError(
                "--merge needs a previous coverage.json of the same backends to merge into"
            )
        document.update(
            {
                key: previous[key]
                for key in ("generated", "minutes", "versions", "unavailable")
                if key in previous
            }
        )
        document["rerun"] = {**previous.get("rerun", {})}
        for kind, archs in results.items():
            document["rerun"].setdefault(meta["generated"], []).extend(
                f"{kind}/{arch}" for arch in sorted(archs)
            )
        results = {
            kind: {
                **{
                    arch: _as_result(row)
                    for arch, row in previous["kinds"].get(kind, {}).get("rows", {}).items()
                },
                **results.get(kind, {}),
            }
            for kind in {*results, *previous["kinds"]}
        }
    for kind in KINDS:
        if kind not in results:
            continue
        checks = KINDS[kind][1]
        rows = {}
        for arch in sorted(results[kind]):
            row = results[kind][arch]
            status = complete(kind, row, backends, checks)
            rows[arch] = {"status": status, "errors": row["errors"], "seconds": row["seconds"]}
        document["kinds"][kind] = {"checks": list(checks), "rows": rows}
        totals = {"architectures": len(rows)}
        for name in ["reference"] + [f"{b}.{c}" for b in backends for c in checks]:
            totals[name] = sum(r["status"][name] == "pass" for r in rows.values())
        document["totals"][kind] = totals
    # A run of some kinds (--kinds causal) keeps the other kinds' rows from the previous run, if it had the same backends.
    carried = dict((previous or {}).get("carried", {}))
    for kind, section in (previous or {}).get("kinds", {}).items():
        if kind not in document["kinds"] and kind in KINDS and previous["backends"] == backends:
            document["kinds"][kind] = section
            document["totals"][kind] = previous["totals"][kind]
            carried.setdefault(kind, previous["generated"])
    document["carried"] = {
        kind: date
        for kind, date in carried.items()
        if kind not in ran and kind in document["kinds"]
    }
    old_floor = (previous or {}).get("floor", {})
    for key in FLOOR_CHECKS:
        kind, check = key.split(".")
        for backend in backends:
            name = f"{kind}.{backend}.{check}"
            count = document["totals"].get(kind, {}).get(f"{backend}.{check}")
            if count is not None:
                document["floor"][name] = max(count, old_floor.get(name, 0))
    return document


def render(document: dict[str, Any]) -> str:
    """docs/COVERAGE.md from the JSON document."""
    from coverage_checks import KINDS

    backends = document["backends"]
    lines = [
        "# Architecture coverage",
        "",
        "<!-- Generated by tools/coverage.py (`nox -s coverage`) from docs/coverage.json. Do not edit by hand. -->",
        "",
        f"transformers {document['versions']['transformers']}, torch {document['versions']['torch']}, "
        f"jax {document['versions']['jax']}, torchax {document['versions']['torchax']}; "
        f"generated {document['generated']} in {document['minutes']} min"
        + "".join(
            f"; the {kind} rows by the run of {date}"
            for kind, date in sorted(document.get("carried", {}).items())
        )
        + "".join(
            f"; re-run on {date}: {', '.join(rows)}"
            for date, rows in sorted(document.get("rerun", {}).items())
        )
        + ".",
        "",
        *[
            f"Backend `{name}` is installed but did not load here, so it has no columns: {why}.\n"
            for name, why in sorted(document.get("unavailable", {}).items())
        ],
        "Every architecture of transformers' auto mappings, as a tiny random model (hidden size 64, 2 layers, 4 "
        "heads, 2 KV heads, vocabulary 256; `tools/tiny_configs.py`), saved and loaded with `from_pretrained`, "
        "float32. Each check compares hfax with the same weights run by PyTorch on CPU:",
        "",
        "- **reference**: transformers itself builds and runs the model (forward and `generate`).",
        "- **load**: `hfax.AutoModelForTPU.from_pretrained(dir, backend=...)` (the class in the saved `architectures`).",
        "- **forward**: the pure forward `model.apply(params, ...)`, run eagerly: logits (hidden states for "
        "encoders) within 1e-4 of PyTorch on every real token, for a batch with one left-padded row.",
        "- **jit**: the compiled forward `model(...)`, the same comparison.",
        "- **generate**: greedy `model.generate` (prefill and the whole decode loop in one compiled program, "
        "slot KV cache) gives transformers' tokens, 12 new tokens, for the unpadded prompt of the batch.",
        "- **padded**: the same for the left-padded prompt of the batch.",
        "- **sharded**: loaded over an 8-device mesh (`hfax.make_mesh(model=8)`, CPU devices) and run again "
        "(generate, or the forward for encoders).",
        "",
        f"{MARK['pass']} pass, {MARK['fail']} fail, {MARK['skip']} skipped (a check it needs failed), "
        f"{MARK['timeout']} timed out, {MARK['crash']} worker crashed.",
        "",
        "## Totals",
        "",
    ]
    header = ["kind", "architectures", "reference"] + [
        f"{b} {c}" for b in backends for c in KINDS["causal"][1]
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind, totals in document["totals"].items():
        cells = [kind, str(totals["architectures"]), str(totals["reference"])]
        for backend in backends:
            for check in KINDS["causal"][1]:
                value = totals.get(f"{backend}.{check}")
                cells.append("–" if value is None else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    for kind, section in document["kinds"].items():
        checks = section["checks"]
        lines += ["", f"## {TITLES[kind]}", ""]
        header = (
            ["architecture", "ref"]
            + [f"{b} {c}" for b in backends for c in checks]
            + ["first failure"]
        )
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for arch, row in section["rows"].items():
            status = row["status"]
            cells = [f"`{arch}`", MARK[status["reference"]]]
            cells += [MARK[status[f"{b}.{c}"]] for b in backends for c in checks]
            cells.append(first_failure(row, status).replace("|", "\\|")[:200])
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Failures by cause",
        "",
        "The first failing check of each architecture, grouped by its error.",
        "",
    ]
    for kind, section in document["kinds"].items():
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for arch, row in section["rows"].items():
            failure = first_failure(row, row["status"])
            if failure:
                check, _, message = failure.partition(": ")
                groups[f"{check}: {cause(message)}"].append(arch)
        if not groups:
            continue
        lines += [f"### {kind}", ""]
        for key, archs in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
            lines.append(f"- **{len(archs)}** `{key.replace('`', '')}`: {', '.join(archs)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("transformers", "torch", "jax", "torchax")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kinds",
        default="causal,encoder,seq2seq,classification",
        help="comma-separated kinds of rows",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated architectures (default: all); prints, writes nothing",
    )
    parser.add_argument(
        "--merge", action="store_true", help="with --only: replace those rows in the written matrix"
    )
    parser.add_argument("--jobs", type=int, default=2, help="workers in parallel (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds per architecture (default 300)"
    )
    parser.add_argument(
        "--out", type=Path, default=DOCS, help="where COVERAGE.md and coverage.json go"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    kinds = [kind for kind in args.kinds.split(",") if kind]
    only = {arch for arch in args.only.split(",") if arch}
    tasks = [
        (kind, arch) for kind in kinds for arch in architectures(kind) if not only or arch in only
    ]
    started = time.monotonic()
    results = sweep(tasks, args.jobs, args.timeout)
    backends, unavailable = usable_backends()
    meta = {
        "generated": datetime.date.today().isoformat(),
        "minutes": round((time.monotonic() - started) / 60, 1),
        "versions": versions(),
        "backends": backends,
        "unavailable": unavailable,
    }
    path = args.out / "coverage.json"
    previous = json.loads(path.read_text()) if path.exists() else None
    document = summarize(results, meta, previous, merge=args.merge)
    for kind, totals in document["totals"].items():
        print(kind, json.dumps(totals))
    if only and not args.merge:
        for kind, section in document["kinds"].items():
            for arch, row in section["rows"].items():
                failure = first_failure(row, row["status"])
                print(f"{kind:14s} {arch:28s} {failure or 'all pass'}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=False, ensure_ascii=False) + "\n")
    (args.out / "COVERAGE.md").write_text(render(document))
    print(f"wrote {args.out / 'COVERAGE.md'} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
