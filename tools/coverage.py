"""Architecture coverage: run every transformers architecture, tiny and random, on every installed hfax backend.

    python tools/coverage.py                       # the full sweep; writes docs/COVERAGE.md and docs/coverage.json
    python tools/coverage.py --only llama,gpt2     # some architectures, printed, nothing written
    python tools/coverage.py --kinds causal        # the causal rows again; the other kinds' rows are kept
    python tools/coverage.py --only rwkv --merge   # re-run some rows of the written matrix after a fix
    nox -s coverage                                # the full sweep in its own environment

Rows are the architectures of transformers' auto mappings: causal LM (``AutoModelForCausalLM``), encoder
(``AutoModel`` of the masked-LM architectures), encoder-decoder (``AutoModelForSeq2SeqLM``) and sequence
classification by default; ``--kinds all`` adds masked LM, token classification, question answering,
image-text-to-text, image classification, vision encoders, zero-shot image classification, speech
sequence-to-sequence, CTC and audio classification. The torch_xla column comes from a run in the torch_xla
venv with ``--merge`` (``nox -s coverage_torchxla``). Each runs in a worker process with a time limit, so a hang or a crash costs one row; the
checks themselves are in ``coverage_checks.py``; the tiny configs are ``hfax.testing.shrink``'s (hfax-testing).

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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULT = "@@CHECK "
DONE = "@@DONE"
TASKS_PER_WORKER = 20  # a fresh worker now and then keeps leaked compiled programs from piling up
#: A worker whose process has compiled this many torch_xla programs is replaced before its next task, so
#: that the next architecture's programs fit in the process's budget (``CompileBudgetError`` past ~48). A
#: causal architecture costs 4 or 5; counting them, rather than replacing a worker every 3 architectures,
#: spares most new processes (importing torch_xla takes about 9 of a worker's 15 s to start).
PROGRAMS_PER_WORKER = 36
#: A check failing with this ran out of its process's compile budget: the architecture runs again alone.
BUDGET_ERROR = "CompileBudgetError"
MARK = {"pass": "✅", "fail": "❌", "skip": "·", "timeout": "⏱", "crash": "💥", "none": "–"}
TITLES = {
    "causal": "Causal language models (`AutoModelForCausalLM`)",
    "encoder": "Encoders (`AutoModel`, last hidden state)",
    "seq2seq": "Encoder-decoders (`AutoModelForSeq2SeqLM`)",
    "classification": "Sequence classification (`AutoModelForSequenceClassification`)",
    "masked_lm": "Masked language models (`AutoModelForMaskedLM`, logits)",
    "token_classification": "Token classification (`AutoModelForTokenClassification`)",
    "question_answering": "Extractive question answering (`AutoModelForQuestionAnswering`, start and end logits)",
    "image_text_to_text": "Image-text-to-text (`AutoModelForImageTextToText`; transformers 5 folds "
    "`AutoModelForVision2Seq` into it)",
    "image_classification": "Image classification (`AutoModelForImageClassification`)",
    "vision_encoder": "Vision encoders (`AutoModel` of the image-classification architectures, last hidden state)",
    "zero_shot_image_classification": "Zero-shot image classification "
    "(`AutoModelForZeroShotImageClassification`, `logits_per_image`)",
    "speech_seq2seq": "Speech sequence-to-sequence (`AutoModelForSpeechSeq2Seq`)",
    "ctc": "CTC speech recognition (`AutoModelForCTC`)",
    "audio_classification": "Audio classification (`AutoModelForAudioClassification`)",
}
#: The checks whose pass counts may not fall (tests/test_coverage.py), as ``kind.check``.
FLOOR_CHECKS = (
    "causal.generate",
    "causal.jit",
    "causal.padded",
    "seq2seq.generate",
    "encoder.jit",
    "classification.jit",
    "masked_lm.jit",
    "token_classification.jit",
    "question_answering.jit",
    "image_text_to_text.generate",
    "image_classification.jit",
    "vision_encoder.jit",
    "zero_shot_image_classification.jit",
    "speech_seq2seq.generate",
    "ctc.jit",
    "audio_classification.jit",
)
#: A kind's rows, by default: those its sweep always ran.
DEFAULT_KINDS = "causal,encoder,seq2seq,classification"


#: XLA flags of every worker. The sweep's models are tiny, so XLA:CPU's LLVM optimization of each program
#: costs more than running it: at level 0 a causal row takes about half the CPU time on torch_xla and a
#: third less on JAX, and the checks compare with transformers either way (docs/PERFORMANCE.md). The
#: caller's XLA_FLAGS are appended after these.
XLA_FLAGS = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=f"{XLA_FLAGS} {env.get('XLA_FLAGS', '')}".strip(),
        JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"),
        PJRT_DEVICE=env.get("PJRT_DEVICE", "CPU"),  # torch_xla's CPU client
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

    auto = modeling_auto
    if kind == "vision_encoder":  # the image classifiers' base models
        base = auto.MODEL_MAPPING_NAMES
        return [arch for arch in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES if arch in base]
    mapping = {
        "causal": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "encoder": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq2seq": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "classification": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "masked_lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "token_classification": auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        "question_answering": auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
        "image_text_to_text": auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        "image_classification": auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "zero_shot_image_classification": auto.MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "speech_seq2seq": auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
        "ctc": auto.MODEL_FOR_CTC_MAPPING_NAMES,
        "audio_classification": auto.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES,
    }[kind]
    return list(mapping)


def sampled(archs: list[str], count: int) -> list[str]:
    """``count`` of ``archs`` spread evenly over the list (all of them when ``count`` is 0 or more)."""
    if not count or count >= len(archs):
        return archs
    return [archs[index * len(archs) // count] for index in range(count)]


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
        self.programs = 0  # torch_xla programs its process compiled so far

    def spent(self, tasks_per_worker: int) -> bool:
        """Whether a fresh worker should take the next task (this one is done, or near its budget)."""
        return (
            not self.alive()
            or self.tasks >= tasks_per_worker
            or self.programs >= PROGRAMS_PER_WORKER
        )

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
            if line.startswith(DONE):
                self.programs = json.loads(line[len(DONE) :] or "{}").get("programs", 0)
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
    tasks: list[tuple[str, str]],
    jobs: int,
    timeout: float,
    progress: bool = True,
    tasks_per_worker: int = TASKS_PER_WORKER,
) -> dict[str, dict[str, Any]]:
    """Run ``tasks`` (kind, architecture) on ``jobs`` workers, each replaced after ``tasks_per_worker``
    tasks (a torch_xla process compiles at most ~48 programs); returns ``{kind: {arch: row}}``."""
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
            if worker is None or worker.spent(tasks_per_worker):
                if worker is not None:
                    worker.close()
                worker = Worker()
            status, errors, seconds = worker.run(kind, arch, timeout)
            if worker.tasks > 1 and any(BUDGET_ERROR in error for error in errors.values()):
                # The programs of the architectures before it filled the process: again, alone.
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

    def programs() -> int:
        if "torch_xla" not in backends:
            return 0  # JAX keeps no budget
        from hfax.backends.torchxla import runtime

        return runtime.counters().compiles

    for line in sys.stdin:
        task = json.loads(line)
        coverage_checks.run(task["kind"], task["arch"], backends, report)
        print(DONE + json.dumps({"programs": programs()}), flush=True)


# ----------------------------------------------------------------------------------------------- report


def _as_result(row: dict[str, Any]) -> dict[str, Any]:
    """A row of a written document as :func:`sweep` returns it."""
    return {"status": dict(row["status"]), "errors": row["errors"], "seconds": row["seconds"]}


def complete(kind: str, row: dict[str, Any], backends: list[str]) -> dict[str, str]:
    """Every check ``backends`` ran of a row, a timeout or crash charged to the first that did not report."""
    from coverage_checks import checks

    status = dict(row["status"])
    trouble = status.pop("_", None)
    names = ["reference"] + [f"{b}.{check}" for b in backends for check in checks(kind, b)]
    for name in names:
        if name not in status:
            status[name] = trouble or "skip"
            trouble = "skip" if trouble else None
    return status


def _columns(kind: str, backends: list[str]) -> list[str]:
    """A kind's check columns, every backend's, those a backend leaves out included (shown as not run)."""
    from coverage_checks import KINDS

    return [f"{b}.{check}" for b in backends for check in KINDS[kind][1]]


def _combined(old: dict[str, Any] | None, new: dict[str, Any], ran: list[str]) -> dict[str, Any]:
    """A row whose reference and ``ran`` backends' cells come from ``new``, the other backends' from ``old``."""
    if old is None:
        return new
    mine = tuple(f"{backend}." for backend in ran)

    def kept(name: str) -> bool:
        return name != "reference" and name != "_" and not name.startswith(mine)

    status = {k: v for k, v in old["status"].items() if kept(k)}
    errors = {k: v for k, v in old["errors"].items() if kept(k)}
    return {
        "status": {**status, **new["status"]},
        "errors": {**errors, **new["errors"]},
        "seconds": new["seconds"],
    }


def first_failure(row: dict[str, Any], status: dict[str, str], backend: str = "") -> str:
    """The first failing check of a row (of ``backend``'s, and the reference, if given) with its error."""
    errors = row["errors"]
    for name, state in status.items():
        if backend and name != "reference" and not name.startswith(f"{backend}."):
            continue
        if state in ("fail", "timeout", "crash"):
            return f"{name}: {errors.get(name) or errors.get('_', state)}"
    return ""


def first_failures(row: dict[str, Any], backends: list[str]) -> list[str]:
    """The reference's failure, or else each backend's first failure."""
    status = row["status"]
    if status["reference"] != "pass":
        return [first_failure(row, status)]
    return [failure for b in backends if (failure := first_failure(row, status, b))]


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

    ``merge``: ``results`` re-ran some architectures, on some backends; in their rows the reference and the
    backends this run had replace the previous run's cells, the other backends' cells and the other rows
    stay, and ``rerun`` records which rows ran when. A backend new to the document gets its columns so
    (``--merge`` from the torch_xla venv adds the torch_xla column to the JAX rows).
    """
    from coverage_checks import KINDS

    ran_backends = meta["backends"]
    backends = list(ran_backends)
    document: dict[str, Any] = {
        **{key: value for key, value in meta.items() if key != "whole"},
        "kinds": {},
        "totals": {},
        "floor": {},
    }
    document["mapped"] = {**(previous or {}).get("mapped", {}), **meta.get("mapped", {})}
    previous_versions = (previous or {}).get("column_versions", {})
    # A merge run on other versions than a column's whole sweep (a newer transformers) leaves the column's
    # versions as they were and names its own beside the rows it re-ran: the column stays what its sweep ran.
    other_versions: dict[str, str] = {}
    if merge:
        for backend in set(ran_backends) & set(previous_versions):
            swept = previous_versions[backend]
            other_versions.update(
                (name, version)
                for name, version in meta["versions"].items()
                if swept.get(name, version) != version
            )
    document["column_versions"] = {
        **previous_versions,
        **{
            backend: meta["versions"]
            for backend in ran_backends
            if not (other_versions and backend in previous_versions)
        },
    }
    # How long each backend's sweep of every row took, kept from its last whole run.
    document["column_minutes"] = {
        **(previous or {}).get("column_minutes", {}),
        **{backend: meta["minutes"] for backend in ran_backends if meta.get("whole")},
    }
    ran = set() if merge else set(results)  # kinds this run swept whole
    rows_by_kind = {
        kind: {
            arch: {**row, "status": complete(kind, row, ran_backends)}
            for arch, row in archs.items()
        }
        for kind, archs in results.items()
    }
    if merge:
        if previous is None:
            raise ValueError("--merge needs a previous coverage.json to merge into")
        backends = previous["backends"] + [b for b in ran_backends if b not in previous["backends"]]
        document.update(
            {
                key: previous[key]
                for key in ("generated", "minutes", "versions", "unavailable")
                if key in previous
            }
        )
        document["backends"] = backends
        document["rerun"] = {**previous.get("rerun", {})}
        when = meta["generated"]
        if ran_backends != previous["backends"]:
            when += f", {', '.join(ran_backends)} only"
        if other_versions:
            when += " with " + ", ".join(f"{n} {v}" for n, v in sorted(other_versions.items()))
        for kind, archs in results.items():
            ran = document["rerun"].setdefault(when, [])
            # A row run twice on one day (again after a fix) is listed once.
            ran.extend(
                row for row in (f"{kind}/{arch}" for arch in sorted(archs)) if row not in ran
            )
        merged = {
            kind: {arch: _as_result(row) for arch, row in section["rows"].items()}
            for kind, section in previous["kinds"].items()
        }
        for kind, archs in rows_by_kind.items():
            for arch, row in archs.items():
                merged.setdefault(kind, {})[arch] = _combined(
                    merged.get(kind, {}).get(arch), row, ran_backends
                )
        rows_by_kind = merged
    for kind in KINDS:
        if kind not in rows_by_kind:
            continue
        columns = ["reference"] + _columns(kind, backends)
        rows = {}
        for arch in sorted(rows_by_kind[kind]):
            row = rows_by_kind[kind][arch]
            status = {name: row["status"].get(name, "none") for name in columns}
            rows[arch] = {"status": status, "errors": row["errors"], "seconds": row["seconds"]}
        document["kinds"][kind] = {"checks": list(KINDS[kind][1]), "rows": rows}
        totals = {"architectures": len(rows)}
        for name in columns:
            if any(row["status"][name] != "none" for row in rows.values()):
                totals[name] = sum(r["status"][name] == "pass" for r in rows.values())
        for backend in backends:
            totals[f"{backend}.rows"] = sum(
                any(v != "none" for k, v in r["status"].items() if k.startswith(f"{backend}."))
                for r in rows.values()
            )
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
    # A backend's floor outlives a run without it: the JAX sweep rewrites the document before the torch_xla
    # column is merged back, and that merge must still not fall below what the column passed before.
    document["floor"] = {
        name: floor for name, floor in old_floor.items() if name.split(".")[1] not in backends
    }
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
        ", ".join(f"{name} {version}" for name, version in document["versions"].items())
        + f"; generated {document['generated']} in {document['minutes']} min"
        + "".join(
            f"; the {kind} rows by the run of {date}"
            for kind, date in sorted(document.get("carried", {}).items())
        )
        + "".join(
            f"; re-run on {date}: {', '.join(_listed(rows))}"
            for date, rows in sorted(document.get("rerun", {}).items())
        )
        + ".",
        "",
        *[
            f"Backend `{name}` is installed but did not load here, so it has no columns: {why}.\n"
            for name, why in sorted(document.get("unavailable", {}).items())
        ],
        "Every architecture of transformers' auto mappings, as a tiny random model (hidden size 64, 2 layers, 4 "
        "heads, 2 KV heads, vocabulary 256; `hfax.testing.shrink`), saved and loaded with `from_pretrained`, "
        "float32. Each check compares hfax with the same weights run by PyTorch on CPU:",
        "",
        "- **reference**: transformers itself builds and runs the model (forward and `generate`).",
        "- **load**: `hfax.AutoModelForTPU.from_pretrained(dir, backend=...)` (the class in the saved `architectures`).",
        "- **forward**: the forward run eagerly (JAX: the pure `model.apply(params, ...)`; torch_xla: the module "
        "op by op on the XLA device): logits (hidden states for encoders, start and end logits for question "
        "answering, `logits_per_image` for zero-shot image classification) within 1e-4 of PyTorch on every "
        "real token, for a batch with one left-padded row (two random images, or two random audio clips).",
        "- **jit**: the compiled forward `model(...)`, the same comparison.",
        "- **generate**: greedy `model.generate` (prefill and the whole decode loop in one compiled program, "
        "slot KV cache) gives transformers' tokens, 12 new tokens, for the unpadded prompt of the batch.",
        "- **padded**: the same for the left-padded prompt of the batch. Where transformers' own padded row "
        "differs from the same prompt generated alone (its padding leaks into the row), the row alone is the "
        "reference: the tokens the attention mask asks for.",
        "- **sharded**: loaded over an 8-device mesh (`hfax.make_mesh(model=8)`, CPU devices) and run again "
        "(generate, or the forward for encoders). Not run on torch_xla: PyTorch/XLA chooses SPMD before a "
        "process's first computation, so a mesh needs a process of its own (hfax-torchxla's tests run it).",
        "",
        "Image-text-to-text prompts hold one random image each and as many image tokens as the model makes "
        "features of it; speech models get random log-mel features (or raw samples). The torch_xla column runs "
        "from its own venv (`nox -s coverage_torchxla`), a worker process per few architectures (a torch_xla "
        "process compiles at most ~48 programs), and is merged into the JAX rows.",
        "",
        *[
            f"Column `{backend}`: "
            + ", ".join(f"{name} {version}" for name, version in sorted(found.items()))
            + (
                f"; its last sweep of every row took {document['column_minutes'][backend]} min"
                if backend in document.get("column_minutes", {})
                else ""
            )
            + "."
            for backend, found in sorted(document.get("column_versions", {}).items())
        ],
        "",
        f"{MARK['pass']} pass, {MARK['fail']} fail, {MARK['skip']} skipped (a check it needs failed), "
        f"{MARK['timeout']} timed out, {MARK['crash']} worker crashed, {MARK['none']} not run.",
        "",
        "## Totals",
        "",
    ]
    lines += [
        "Per kind: the architectures of its transformers mapping, the rows run (fewer: an even sample of "
        "the mapping, `--sample`), and per backend the rows it ran and how many pass each check.",
        "",
    ]
    header = ["kind", "in transformers", "rows", "reference"]
    header += [f"{b} {c}" for b in backends for c in ("rows", *KINDS["causal"][1])]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind, totals in document["totals"].items():
        # Runs from before --sample ran every architecture of the mapping.
        mapped = document.get("mapped", {}).get(kind, totals["architectures"])
        cells = [kind, str(mapped)]
        cells += [str(totals["architectures"]), str(totals["reference"])]
        for backend in backends:
            for check in ("rows", *KINDS["causal"][1]):
                value = totals.get(f"{backend}.{check}")
                if check == "rows" and value is None:  # a document from before rows were counted
                    value = totals["architectures"]
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
            failures = "; ".join(first_failures(row, backends))
            cells.append(failures.replace("|", "\\|")[:240])
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Failures by cause",
        "",
        "The first failing check of each architecture on each backend, grouped by its error.",
        "",
    ]
    for kind, section in document["kinds"].items():
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for arch, row in section["rows"].items():
            for failure in first_failures(row, backends):
                check, _, message = failure.partition(": ")
                groups[f"{check}: {cause(message)}"].append(arch)
        if not groups:
            continue
        lines += [f"### {kind}", ""]
        for key, archs in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
            lines.append(f"- **{len(archs)}** `{key.replace('`', '')}`: {', '.join(archs)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _listed(rows: list[str]) -> list[str]:
    """``kind/arch`` names, those of a kind with more than a few rows counted instead."""
    by_kind: dict[str, list[str]] = collections.defaultdict(list)
    for row in rows:
        by_kind[row.split("/")[0]].append(row)
    return [
        entry
        for kind, names in by_kind.items()
        for entry in (names if len(names) <= 4 else [f"{len(names)} {kind} rows"])
    ]


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("transformers", "torch", "jax", "torchax", "torch_xla"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kinds",
        default=DEFAULT_KINDS,
        help=f"comma-separated kinds of rows, or 'all' (default {DEFAULT_KINDS})",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        help="run this many architectures of each kind, spread evenly over its mapping (default: all)",
    )
    parser.add_argument(
        "--tasks-per-worker",
        type=int,
        default=TASKS_PER_WORKER,
        help=f"architectures a worker process runs before a fresh one starts (default {TASKS_PER_WORKER}); "
        f"one whose process compiled {PROGRAMS_PER_WORKER} torch_xla programs is replaced sooner",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated architectures (default: all); prints, writes nothing",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace the rows run (their cells of the backends installed here) in the written matrix",
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
    from coverage_checks import KINDS

    kinds = list(KINDS) if args.kinds == "all" else [kind for kind in args.kinds.split(",") if kind]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    only = {arch for arch in args.only.split(",") if arch}
    tasks = [
        (kind, arch)
        for kind in kinds
        for arch in sampled(architectures(kind), args.sample)
        if not only or arch in only
    ]
    started = time.monotonic()
    results = sweep(tasks, args.jobs, args.timeout, tasks_per_worker=args.tasks_per_worker)
    backends, unavailable = usable_backends()
    meta = {
        "generated": datetime.date.today().isoformat(),
        "minutes": round((time.monotonic() - started) / 60, 1),
        "versions": versions(),
        "backends": backends,
        "unavailable": unavailable,
        "mapped": {kind: len(architectures(kind)) for kind in kinds},
        "whole": not only and not args.sample and set(kinds) == set(KINDS),
    }
    path = args.out / "coverage.json"
    previous = json.loads(path.read_text()) if path.exists() else None
    document = summarize(results, meta, previous, merge=args.merge)
    for kind, totals in document["totals"].items():
        print(kind, json.dumps(totals))
    if only and not args.merge:
        for kind, section in document["kinds"].items():
            for arch, row in section["rows"].items():
                failures = "; ".join(first_failures(row, document["backends"]))
                print(f"{kind:14s} {arch:28s} {failures or 'all pass'}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=False, ensure_ascii=False) + "\n")
    (args.out / "COVERAGE.md").write_text(render(document))
    print(f"wrote {args.out / 'COVERAGE.md'} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
