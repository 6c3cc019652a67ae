"""The coverage floor: what docs/coverage.json records as passing keeps passing, and no count falls.

The full sweep is ``nox -s coverage`` (``tools/coverage.py``, about an hour on two cores); docs/COVERAGE.md
is rendered from the JSON it writes. Here a sample of the architectures it recorded as passing runs again
through the sweep's own workers (a few minutes), and every check recorded as passing must still pass.
``HFAX_COVERAGE_SAMPLE`` sets the sample size.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
# By path and under its own name: `import coverage` may find coverage.py, the measuring tool.
_spec = importlib.util.spec_from_file_location(
    "hfax_coverage_sweep", ROOT / "tools" / "coverage.py"
)
coverage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(coverage)

DOCUMENT = json.loads((ROOT / "docs" / "coverage.json").read_text())
SAMPLE = int(os.environ.get("HFAX_COVERAGE_SAMPLE", "8"))


def _passing(kind: str, check: str = "jax.generate") -> list[str]:
    section = DOCUMENT["kinds"].get(kind, {"rows": {}})
    return sorted(
        arch for arch, row in section["rows"].items() if row["status"].get(check) == "pass"
    )


def sample() -> list[tuple[str, str]]:
    """Causal architectures spread evenly over those passing generate, plus one of every other kind."""
    causal = _passing("causal")
    count = max(SAMPLE - 3, 1)
    picked = [("causal", arch) for arch in causal[:: max(len(causal) // count, 1)][:count]]
    for kind, check in (
        ("seq2seq", "jax.generate"),
        ("encoder", "jax.jit"),
        ("classification", "jax.jit"),
    ):
        passing = _passing(kind, check)
        if passing:
            picked.append((kind, passing[len(passing) // 2]))
    return picked


def test_counts_meet_the_floor():
    # The promise guarded above all: causal LMs whose greedy generate (compiled decode loop) equals transformers'.
    assert "causal.jax.generate" in DOCUMENT["floor"], sorted(DOCUMENT["floor"])
    for name, floor in DOCUMENT["floor"].items():
        kind, backend, check = name.split(".")
        count = DOCUMENT["totals"][kind][f"{backend}.{check}"]
        assert count >= floor, (
            f"{name}: {count} architectures pass, below the floor of {floor} recorded in docs/coverage.json; fix the "
            "regression (docs/COVERAGE.md lists each failure) or, if the drop is deliberate, lower the floor there"
        )


def test_matrix_is_the_sweeps_output():
    assert (ROOT / "docs" / "COVERAGE.md").read_text() == coverage.render(DOCUMENT), (
        "docs/COVERAGE.md differs from what tools/coverage.py renders from docs/coverage.json: regenerate it "
        "with `nox -s coverage`, never edit it by hand"
    )


def test_sample_still_passes():
    tasks = sample()
    assert len(tasks) >= min(SAMPLE, len(_passing("causal"))), tasks
    results = coverage.sweep(
        tasks, jobs=int(os.environ.get("HFAX_COVERAGE_JOBS", "2")), timeout=300, progress=False
    )
    regressions = []
    for kind, arch in tasks:
        recorded = DOCUMENT["kinds"][kind]["rows"][arch]["status"]
        row = results[kind][arch]
        for check, state in recorded.items():
            if state == "pass" and row["status"].get(check) != "pass":
                error = (
                    row["errors"].get(check)
                    or row["errors"].get("_")
                    or row["status"].get(check, "not run")
                )
                regressions.append(f"{kind} {arch} {check}: {error}")
    assert not regressions, "recorded as passing in docs/coverage.json, failing now:\n" + "\n".join(
        regressions
    )


def test_a_run_of_some_kinds_keeps_the_other_kinds_rows():
    meta = {
        "generated": "2026-01-02",
        "minutes": 1.0,
        "versions": DOCUMENT["versions"],
        "backends": ["jax"],
        "unavailable": {},
    }
    row = {"status": {"reference": "pass"}, "errors": {}, "seconds": 1.0}
    previous = coverage.summarize(
        {"causal": {"llama": row}, "encoder": {"bert": row}},
        {**meta, "generated": "2026-01-01"},
        None,
    )
    again = coverage.summarize({"causal": {"llama": row}}, meta, previous)
    assert again["kinds"]["encoder"] == previous["kinds"]["encoder"] and again["carried"] == {
        "encoder": "2026-01-01"
    }
    assert "the encoder rows by the run of 2026-01-01" in coverage.render(again)
    other_backends = coverage.summarize(
        {"causal": {"llama": row}}, {**meta, "backends": ["jax", "torch_xla"]}, previous
    )
    assert (
        "encoder" not in other_backends["kinds"]
    )  # rows without the new backend's columns are not kept


def test_merge_replaces_the_rows_it_ran_again():
    meta = {
        "generated": "2026-01-02",
        "minutes": 1.0,
        "versions": DOCUMENT["versions"],
        "backends": ["jax"],
        "unavailable": {},
    }
    passing = {"status": {"reference": "pass", "jax.load": "pass"}, "errors": {}, "seconds": 1.0}
    failing = {"status": {"reference": "fail"}, "errors": {"reference": "boom"}, "seconds": 1.0}
    previous = coverage.summarize(
        {"causal": {"llama": failing, "gpt2": passing}}, {**meta, "generated": "2026-01-01"}, None
    )
    merged = coverage.summarize({"causal": {"llama": passing}}, meta, previous, merge=True)
    assert merged["kinds"]["causal"]["rows"]["llama"]["status"]["jax.load"] == "pass"
    assert merged["kinds"]["causal"]["rows"]["gpt2"] == previous["kinds"]["causal"]["rows"]["gpt2"]
    assert merged["totals"]["causal"]["jax.load"] == 2 and merged["generated"] == "2026-01-01"
    assert "re-run on 2026-01-02: causal/llama" in coverage.render(merged)
