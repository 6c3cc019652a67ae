"""The coverage floor: what docs/coverage.json records as passing keeps passing, and no count falls.

The full sweep is ``nox -s coverage`` and ``nox -s coverage_torchxla`` (``tools/coverage.py``); docs/COVERAGE.md
is rendered from the JSON they write. Here a sample of the architectures it recorded as passing runs again
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
#: A run's metadata for the tests that summarize made-up rows.
RUN_META = {
    "generated": "2026-01-02",
    "minutes": 1.0,
    "versions": DOCUMENT["versions"],
    "backends": ["jax"],
    "unavailable": {},
}
SAMPLE = int(os.environ.get("HFAX_COVERAGE_SAMPLE", "5"))


def _passing(kind: str, check: str = "jax.generate") -> list[str]:
    section = DOCUMENT["kinds"].get(kind, {"rows": {}})
    return sorted(
        arch for arch, row in section["rows"].items() if row["status"].get(check) == "pass"
    )


#: One architecture of each of these kinds joins the sample, by the check of its floor: one kind per path
#: the sweep's worker takes (a decoder's and an encoder-decoder's generate, with an image, with audio, and a
#: compiled forward; the other kinds' checks are compiled forwards too). Each costs a worker's start and
#: compiles, so the sample stays small (docs/PERFORMANCE.md, "CI time").
SAMPLED_KINDS = (
    ("seq2seq", "jax.generate"),
    ("encoder", "jax.jit"),
    ("image_text_to_text", "jax.generate"),
    ("speech_seq2seq", "jax.generate"),
)


def sample() -> list[tuple[str, str]]:
    """``SAMPLE`` architectures: one of each of SAMPLED_KINDS, the rest causal ones spread evenly over those
    passing generate (at least one)."""
    causal = _passing("causal")
    count = max(SAMPLE - len(SAMPLED_KINDS), 1)
    picked = [("causal", arch) for arch in causal[:: max(len(causal) // count, 1)][:count]]
    for kind, check in SAMPLED_KINDS:
        passing = _passing(kind, check)
        if passing:
            picked.append((kind, passing[len(passing) // 2]))
    return picked


def test_counts_meet_the_floor():
    # The promise guarded above all: causal LMs whose greedy generate (compiled decode loop) equals transformers'.
    assert "causal.jax.generate" in DOCUMENT["floor"], sorted(DOCUMENT["floor"])
    # Every kind keeps a floor on every backend that ran it.
    for kind, totals in DOCUMENT["totals"].items():
        for backend in DOCUMENT["backends"]:
            if totals.get(f"{backend}.rows"):
                assert any(name.startswith(f"{kind}.{backend}.") for name in DOCUMENT["floor"]), (
                    f"{kind} on {backend} has no floor in docs/coverage.json"
                )
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
    installed = tuple(f"{backend}." for backend in coverage.usable_backends()[0])
    results = coverage.sweep(
        tasks, jobs=int(os.environ.get("HFAX_COVERAGE_JOBS", "2")), timeout=300, progress=False
    )
    regressions = []
    for kind, arch in tasks:
        recorded = DOCUMENT["kinds"][kind]["rows"][arch]["status"]
        row = results[kind][arch]
        for check, state in recorded.items():
            if check != "reference" and not check.startswith(installed):
                continue  # a backend of another environment (torch_xla's column)
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
    meta = RUN_META
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
    meta = RUN_META
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


def test_a_merge_on_a_newer_transformers_names_it_beside_its_rows_and_keeps_the_columns_versions():
    """Rows of a new transformers release's architectures, run and merged on that release, say so: the
    column still names the versions its sweep of every row ran on."""
    meta = RUN_META
    passing = {"status": {"reference": "pass", "jax.load": "pass"}, "errors": {}, "seconds": 1.0}
    previous = coverage.summarize(
        {"causal": {"llama": passing}}, {**meta, "generated": "2026-01-01"}, None
    )
    newer = {**meta["versions"], "transformers": "9.9.0"}
    merged = coverage.summarize(
        {"causal": {"newarch": passing}}, {**meta, "versions": newer}, previous, merge=True
    )
    assert merged["column_versions"]["jax"] == meta["versions"]
    assert set(merged["kinds"]["causal"]["rows"]) == {"llama", "newarch"}
    rendered = coverage.render(merged)
    assert "re-run on 2026-01-02 with transformers 9.9.0: causal/newarch" in rendered
    same = coverage.summarize({"causal": {"newarch": passing}}, meta, previous, merge=True)
    assert "re-run on 2026-01-02: causal/newarch" in coverage.render(same)


def test_a_backends_run_adds_its_column_to_the_rows():
    """The torch_xla column comes from its own venv: merged, its cells join the JAX rows, which stay."""
    meta = RUN_META
    jax_row = {"status": {"reference": "pass", "jax.load": "pass"}, "errors": {}, "seconds": 1.0}
    previous = coverage.summarize(
        {"causal": {"llama": jax_row, "gpt2": jax_row}}, {**meta, "generated": "2026-01-01"}, None
    )
    failing = {
        "status": {"reference": "pass", "torch_xla.load": "fail"},
        "errors": {"torch_xla.load": "ValueError: boom"},
        "seconds": 2.0,
    }
    merged = coverage.summarize(
        {"causal": {"llama": failing}}, {**meta, "backends": ["torch_xla"]}, previous, merge=True
    )
    assert merged["backends"] == ["jax", "torch_xla"]
    rows = merged["kinds"]["causal"]["rows"]
    assert rows["llama"]["status"]["jax.load"] == "pass"
    assert rows["llama"]["status"]["torch_xla.load"] == "fail"
    assert rows["llama"]["status"]["torch_xla.sharded"] == "none"  # left out on torch_xla
    assert rows["gpt2"]["status"]["torch_xla.load"] == "none"  # not run there
    totals = merged["totals"]["causal"]
    assert (totals["jax.load"], totals["torch_xla.load"], totals["torch_xla.rows"]) == (2, 0, 1)
    assert "torch_xla.sharded" not in totals and merged["floor"]["causal.torch_xla.jit"] == 0
    rendered = coverage.render(merged)
    assert "torch_xla.load: ValueError: boom" in rendered
    assert "re-run on 2026-01-02, torch_xla only: causal/llama" in rendered


def test_the_torch_xla_floor_outlives_a_jax_sweep_and_each_whole_column_keeps_its_minutes():
    """`nox -s coverage` rewrites the document with JAX alone before `coverage_torchxla` merges its column
    back: the column's floor must survive that, and each backend's whole sweep keeps its own duration."""
    meta = {**RUN_META, "whole": True}
    passing = {"status": {"reference": "pass", "jax.jit": "pass"}, "errors": {}, "seconds": 1.0}
    on_both = {
        "status": {"reference": "pass", "torch_xla.jit": "pass"},
        "errors": {},
        "seconds": 1.0,
    }
    jax_run = coverage.summarize({"causal": {"llama": passing}}, {**meta, "minutes": 30.0}, None)
    both = coverage.summarize(
        {"causal": {"llama": on_both}},
        {**meta, "backends": ["torch_xla"], "minutes": 50.0},
        jax_run,
        merge=True,
    )
    assert both["floor"]["causal.torch_xla.jit"] == 1
    assert both["column_minutes"] == {"jax": 30.0, "torch_xla": 50.0} and "whole" not in both
    assert "its last sweep of every row took 50.0 min" in coverage.render(both)
    jax_again = coverage.summarize({"causal": {"llama": passing}}, {**meta, "minutes": 20.0}, both)
    assert jax_again["floor"]["causal.torch_xla.jit"] == 1  # the column is not in this run
    assert jax_again["column_minutes"] == {"jax": 20.0, "torch_xla": 50.0}
    failing = {
        "status": {"reference": "pass", "torch_xla.jit": "fail"},
        "errors": {"torch_xla.jit": "ValueError: boom"},
        "seconds": 1.0,
    }
    sampled = coverage.summarize(
        {"causal": {"llama": failing}},
        {**RUN_META, "backends": ["torch_xla"], "minutes": 1.0},
        jax_again,
        merge=True,
    )
    # The merged column passes less than before: the floor stays where it was, so the floor test fails.
    assert sampled["floor"]["causal.torch_xla.jit"] == 1
    assert sampled["totals"]["causal"]["torch_xla.jit"] == 0
    # A sample's minutes are not a whole sweep's.
    assert sampled["column_minutes"]["torch_xla"] == 50.0


def test_a_worker_near_its_compile_budget_is_replaced():
    # torch_xla compiles at most ~48 programs a process: a worker is replaced by what its process compiled
    # (it reports the count after each architecture), not only after a number of architectures.
    class Running:
        def poll(self):
            return None

    worker = object.__new__(coverage.Worker)
    worker.process, worker.tasks, worker.programs = Running(), 1, 0
    assert not worker.spent(tasks_per_worker=20)
    worker.programs = coverage.PROGRAMS_PER_WORKER
    assert worker.spent(tasks_per_worker=20)
    worker.programs = 0
    worker.tasks = 20
    assert worker.spent(tasks_per_worker=20)


def test_a_padded_row_is_checked_against_the_row_alone_where_transformers_padded_row_is_wrong(
    tmp_path,
):
    import coverage_checks
    import numpy as np
    import pytest

    import hfax

    # git's tiny model: transformers' own left-padded row differs from the same prompt generated alone.
    ref = coverage_checks._reference("causal", "git", str(tmp_path))
    padded_row = ref["tokens"][1, ref["start"] :].numpy()
    assert ref["alone"] is not None and not np.array_equal(padded_row, ref["alone"])
    checks = {
        name: check
        for name, check, _ in coverage_checks._backend_checks(
            hfax, "causal", "jax", str(tmp_path), ref
        )
    }
    checks["load"]()
    checks["padded"]()  # hfax's row equals the row alone
    ref["alone"] = ref["alone"][
        ::-1
    ].copy()  # a row alone that hfax's does not equal: the check fails
    with pytest.raises(coverage_checks.Mismatch, match="tokens differ"):
        checks["padded"]()
