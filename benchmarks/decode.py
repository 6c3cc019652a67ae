"""Greedy decoding with hfax against what users would otherwise run, side by side in one run.

    python benchmarks/decode.py                      # everything: ~134M Llama and Gemma 3 270M, f32 and bf16
    python benchmarks/decode.py --models llama --dtypes float32 --batch 1 --prompt 32 --new-tokens 32
    PJRT_DEVICE=CPU python benchmarks/decode.py --python hfax-torchxla=.nox/torchxla/bin/python  # torch_xla's venv

Every engine runs in its own process (peak memory is per process, and importing torchax breaks
``torch.compile`` in-process); compiling engines run a second time in a fresh process that finds the
first one's persistent compilation cache. For each model, dtype, batch and prompt length the script
reports time to first token, steady decode throughput, trace and compile time of the first call (cold
and cached), peak host memory, and the fraction of the memory-bandwidth bound: the bytes of weights and
KV cache one decode step must read, divided by this machine's bandwidth (measured here with a large
array copy), over the measured step time. Beside that bound it measures what XLA:CPU's products reach over
the same weights with nothing else in the loop (:func:`weight_products`), the ceiling for hfax's batch-1
step on this machine. It prints a table, writes a JSON record and regenerates docs/PERFORMANCE.md.

torch_xla 2.9 pins torch 2.9 and the rest runs torch 2.13, so no one environment holds every engine:
``--python ENGINE=PYTHON`` runs an engine's workers under another interpreter (one that has this
checkout's hfax packages and the engine's own, such as the venv of ``nox -s torchxla``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("llama", "gemma")
ENGINES = (
    "transformers-sdpa",
    "transformers-eager",
    "transformers-compile",
    "torchax-recipe",
    "hfax-jax",
    "hfax-torchxla",
)
#: Engines whose first call compiles; they run again in a second process that finds the persistent cache.
CACHED_ENGINES = ("transformers-compile", "hfax-jax")
BASELINES = ("transformers-sdpa", "transformers-eager")
AGREE_TOKENS = 16
WORKER_TIMEOUT_S = 3600

#: The benchmark Llama: random weights, ~134M parameters.
LLAMA_CONFIG = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=12,
    intermediate_size=2048,
    vocab_size=32000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


@dataclasses.dataclass
class Case:
    """One measured configuration and what was measured (seconds, bytes)."""

    model: str
    dtype: str
    batch: int
    prompt: int
    new_tokens: int
    engine: str
    ttft_s: float | None = None
    step_s: float | None = None
    first_call_s: float | None = None
    trace_s: float | None = None
    compile_s: float | None = None
    cached_first_call_s: float | None = None
    cached_trace_s: float | None = None
    cached_compile_s: float | None = None
    peak_rss_bytes: int | None = None
    repeats: int = 0
    tokens: list[int] | None = None
    error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Steady decode throughput over the whole batch."""
        return self.batch / self.step_s if self.step_s else None


# ----------------------------------------------------------------------------------------------------------
# Measuring the machine


def memory_bandwidth(size_bytes: int = 512 << 20, repeats: int = 5) -> dict[str, float]:
    """Bytes per second moved by copying a ``size_bytes`` array (read + write), with one thread and with one
    per core; the best of ``repeats`` each. The array is far larger than any CPU cache. ``bytes_per_s``, the
    bound's bandwidth, is the best copy; reading alone (a sum over the array) is measured beside it, since a
    decode step mostly reads."""
    source = np.ones(size_bytes // 8)
    target = np.zeros_like(source)

    def timed(work: Callable[[int, int], Any], threads: int) -> float:
        chunks = np.array_split(np.arange(source.size), threads)
        bounds = [(int(c[0]), int(c[-1]) + 1) for c in chunks]
        workers = [threading.Thread(target=work, args=b) for b in bounds]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - started

    cores = os.cpu_count() or 1
    result = {}
    for threads in sorted({1, cores}):
        best = min(
            timed(lambda lo, hi: np.copyto(target[lo:hi], source[lo:hi]), threads)
            for _ in range(repeats)
        )
        result[f"copy_{threads}_threads"] = 2 * source.nbytes / best
    for threads in sorted({1, cores}):
        best = min(timed(lambda lo, hi: source[lo:hi].sum(), threads) for _ in range(repeats))
        result[f"read_{threads}_threads"] = source.nbytes / best
    result["bytes_per_s"] = max(value for key, value in result.items() if key.startswith("copy"))
    return result


def weight_products(path: str, dtype: str, steps: int = 64, repeats: int = 5) -> dict[str, float]:
    """The products alone: one row multiplied by every weight matrix of the model (each ``nn.Linear``, the
    output layer among them) in a jitted loop of ``steps`` steps, in the forms hfax's JAX backend gives them
    on one CPU device (``lowerings.linear``; 16-bit weights carried through the loop past a barrier and
    multiplied as ``lowerings.row_products``). No attention, norms, cache writes or sampling: the speed of
    XLA:CPU's own products over these bytes, so the batch-1 rows can be read against what XLA reaches at
    all as well as against the copy bandwidth. Random weights of the model's shapes, best of ``repeats``."""
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from hfax.backends.jax import lowerings

    config = transformers.AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    kind = getattr(jnp, dtype)
    rng = np.random.default_rng(0)
    weights = [
        jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.02, kind) for shape in shapes
    ]
    widths = sorted({n for shape in shapes for n in shape})
    sixteen_bits = jnp.finfo(kind).bits == 16

    def step(_: Any, carry: Any) -> Any:
        vectors, ws = carry
        vectors = dict(vectors)
        for w in ws:  # each product reads the last output of its input width: the order is kept
            out = lowerings.linear(vectors[w.shape[1]][None], w)[0]
            vectors[w.shape[0]] = vectors[w.shape[0]] + out * 1e-3
        return vectors, jax.lax.optimization_barrier(ws) if sixteen_bits else ws

    @jax.jit
    def loop(vectors: Any, ws: Any) -> Any:
        with lowerings.row_products(sixteen_bits):
            return jax.lax.fori_loop(0, steps, step, (vectors, ws))[0]

    vectors = {n: jnp.full((n,), 0.01, kind) for n in widths}
    jax.block_until_ready(loop(vectors, weights))
    best = min(
        timed(lambda: jax.block_until_ready(loop(vectors, weights)))[0] for _ in range(repeats)
    )
    return {"step_s": best / steps, "bytes": float(sum(w.nbytes for w in weights))}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = int(line.split()[1]) * 1024
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions(),
    }


VERSIONED = ("torch", "jax", "jaxlib", "torchax", "transformers", "torch_xla")


def versions() -> dict[str, str]:
    """The versions of what the engines run on, as installed for this interpreter."""
    found = {}
    for name in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


class PeakMemory:
    """Peak resident memory of this process between ``reset()`` and ``peak()``.

    Linux resets the high-water mark on writing 5 to /proc/self/clear_refs; elsewhere the peak since the
    process started is reported.
    """

    def reset(self) -> None:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
        import resource

        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


# ----------------------------------------------------------------------------------------------------------
# Models and the bytes one decode step reads


def llama_path() -> str:
    """The benchmark Llama, built once with random weights (seed 0) in hfax's cache dir."""
    from hfax.user_cache import cache_dir

    target = cache_dir() / "bench" / "llama-134m"
    if not (target / "config.json").exists():
        import torch
        import transformers

        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_CONFIG))
        staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        model.save_pretrained(staging)
        staging.rename(target)
    return str(target)


def model_path(name: str) -> str:
    if name == "llama":
        return llama_path()
    from hfax.demo import default_model

    return default_model()


@functools.lru_cache(maxsize=None)
def step_bytes(path: str, dtype: str, batch: int, context: float) -> dict[str, float]:
    """Bytes a decode step must read: every weight once (the input embedding only for the rows it looks up,
    unless the output layer shares it) and every layer's keys and values over ``context`` tokens (at most
    its sliding window)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    width = getattr(torch, dtype).itemsize
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings().weight
    weights = sum(p.numel() for p in model.parameters()) * width
    if embedding is not output:
        weights -= (embedding.shape[0] - batch) * embedding.shape[1] * width
    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    window = getattr(text, "sliding_window", None)
    seen = [
        min(context, window) if kind == "sliding_attention" and window else context
        for kind in types
    ]
    kv = 2 * batch * text.num_key_value_heads * head_dim * width * sum(seen)
    return {"weights": float(weights), "kv_cache": float(kv), "total": float(weights + kv)}


# ----------------------------------------------------------------------------------------------------------
# Engines: each loads one model in one dtype and generates exactly n greedy tokens


class JaxCompileClock:
    """Seconds JAX spent tracing (jaxpr and MLIR) and compiling (or reading the persistent cache)."""

    TRACE = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
    )
    COMPILE = ("/jax/core/compile/backend_compile_duration",)

    def __init__(self) -> None:
        import jax

        self.trace = self.compile = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **_: Any) -> None:
        if event in self.TRACE:
            self.trace += duration
        elif event in self.COMPILE:
            self.compile += duration

    def read(self) -> tuple[float, float]:
        return self.trace, self.compile


class Transformers:
    """transformers ``generate`` on PyTorch/CPU with the given attention implementation."""

    def __init__(self, path: str, dtype: str, attention: str | None = None) -> None:
        import torch
        import transformers

        kwargs = {"attn_implementation": attention} if attention else {}
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), **kwargs
        ).eval()
        self.options: dict[str, Any] = {}
        self.clock = None

    def generate(self, ids: np.ndarray, n: int) -> np.ndarray:
        torch = self.torch
        pad = self.model.generation_config.pad_token_id
        pad = pad if pad is not None else 0
        with torch.inference_mode():
            out = self.model.generate(
                torch.from_numpy(ids),
                attention_mask=torch.ones(ids.shape, dtype=torch.long),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=pad,
                **self.options,
            )
        return out[:, ids.shape[1] :].numpy()


class TransformersCompiled(Transformers):
    """transformers ``generate`` with the static cache and its decode step compiled by ``torch.compile``."""

    def __init__(self, path: str, dtype: str) -> None:
        from transformers import CompileConfig

        super().__init__(path, dtype)
        config = CompileConfig(fullgraph=True, mode="default")
        config._compile_all_devices = True  # transformers compiles on GPU only unless asked
        self.options = {"cache_implementation": "static", "compile_config": config}


class TorchaxRecipe:
    """The recipe of the public torchax write-ups, written out: the one-token step jitted with the weights as
    arguments and a static KV cache, a Python loop over steps, the next token chosen on the host."""

    def __init__(self, path: str, dtype: str) -> None:
        import copy

        import jax
        import torch
        import transformers

        from hfax.backends.jax.runtime import (
            torchax,
        )  # torchax under torch 2.13 needs hfax's import bridge
        from hfax.signatures import cache_parameter

        self.jax, self.torch, self.transformers = jax, torch, transformers
        self.env = torchax.default_env()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype)
        ).eval()
        self.model = model
        # The forward's cache parameter, however the installed transformers spells it.
        self.cache_argument = cache_parameter(model.forward)
        self.weights = {
            name: self.env.to_xla(t)
            for name, t in [*model.named_parameters(), *model.named_buffers()]
        }
        # Every layer keeps full-length keys and values: StaticCache's sliding layers count tokens in Python
        # ints, which a jitted step would freeze. transformers' masks still apply each layer's window.
        self.cache_config = copy.deepcopy(model.config.get_text_config(decoder=True))
        self.cache_config.layer_types = ["full_attention"] * self.cache_config.num_hidden_layers
        self.cache_config.sliding_window = None
        eos = model.generation_config.eos_token_id
        self.eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.step = torchax.interop.jax_jit(self._step, kwargs_for_jax_jit={"donate_argnums": (3,)})
        self.clock = JaxCompileClock()

    def _step(self, weights: Any, input_ids: Any, cache_position: Any, kv: Any) -> Any:
        cache = self.transformers.StaticCache(
            config=self.cache_config, max_cache_len=kv[0][0].shape[2]
        )
        for layer, (keys, values) in zip(cache.layers, kv):
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            layer.cumulative_length = cache_position[0].clone()
        inputs = {
            self.cache_argument: cache,
            "cache_position": cache_position,
            "use_cache": True,
            "logits_to_keep": 1,
        }
        out = self.torch.func.functional_call(self.model, weights, (input_ids,), inputs)
        return out.logits[:, -1], [(layer.keys, layer.values) for layer in cache.layers]

    def _choose(self, logits: Any) -> np.ndarray:
        scores = np.asarray(self.jax.device_get(self.env.t2j_iso(logits))).astype(np.float32)
        scores[:, self.eos] = -np.inf  # exactly n tokens, like min_new_tokens=n in transformers
        return scores.argmax(-1)

    def generate(self, ids: np.ndarray, n: int) -> np.ndarray:
        torch, config = self.torch, self.cache_config
        batch, length = ids.shape
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        shape = (batch, config.num_key_value_heads, length + n, head_dim)
        with self.env:
            kv = [
                (
                    torch.zeros(shape, dtype=self.model.dtype, device="jax"),
                    torch.zeros(shape, dtype=self.model.dtype, device="jax"),
                )
                for _ in range(config.num_hidden_layers)
            ]
            logits, kv = self.step(
                self.weights,
                self.env.to_xla(torch.from_numpy(ids)),
                torch.arange(length, device="jax"),
                kv,
            )
        tokens = []
        for index in range(n):
            tokens.append(self._choose(logits))
            if index + 1 < n:
                with self.env:
                    position = torch.tensor([length + index], device="jax")
                    logits, kv = self.step(
                        self.weights,
                        self.env.to_xla(torch.from_numpy(tokens[-1][:, None])),
                        position,
                        kv,
                    )
        return np.stack(tokens, axis=1)


class Hfax:
    """hfax's ``generate``: prefill and the whole decode loop as one compiled program."""

    def __init__(self, path: str, dtype: str, backend: str) -> None:
        import hfax

        self.model = hfax.AutoModelForCausalLM.from_pretrained(path, backend=backend, dtype=dtype)
        self.clock = JaxCompileClock() if backend == "jax" else None

    def generate(self, ids: np.ndarray, n: int) -> np.ndarray:
        out = self.model.generate(ids, max_new_tokens=n, min_new_tokens=n)
        if hasattr(out, "cpu"):  # torch_xla's generate gives a tensor on the XLA device
            out = out.cpu()
        return np.asarray(out)[:, ids.shape[1] :]


def torchxla_missing(python: str | None = None) -> str | None:
    """Why the torch_xla backend cannot run under ``python`` (default: this interpreter), or None."""
    if python is not None:
        probe = subprocess.run(
            [python, __file__, "--probe-torchxla"], capture_output=True, text=True
        )
        if probe.returncode != 0:
            tail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            return f"{python} cannot run this script: {tail}"
        return probe.stdout.strip() or None
    if importlib.util.find_spec("torch_xla") is None:
        return "torch_xla is not installed"
    from hfax import plugins

    if "torch_xla" not in plugins.backends():
        return "hfax's torch_xla backend (hfax-torchxla) is not installed"
    return None


def make_engine(name: str, path: str, dtype: str) -> Any:
    factories: dict[str, Callable[[], Any]] = {
        "transformers-sdpa": lambda: Transformers(path, dtype),
        "transformers-eager": lambda: Transformers(path, dtype, "eager"),
        "transformers-compile": lambda: TransformersCompiled(path, dtype),
        "torchax-recipe": lambda: TorchaxRecipe(path, dtype),
        "hfax-jax": lambda: Hfax(path, dtype, "jax"),
        "hfax-torchxla": lambda: Hfax(path, dtype, "torch_xla"),
    }
    return factories[name]()


# ----------------------------------------------------------------------------------------------------------
# The worker: one engine, one model, one dtype, every shape


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def measure(
    engine: Any, case: Case, ids: np.ndarray, repeats: int, budget_s: float, cached: bool
) -> None:
    """Fill ``case``: the first call (with what it spent compiling), then time to first token and the steady
    step time as the best of up to ``repeats`` calls each (fewer when a call takes more than ``budget_s``)."""
    memory = PeakMemory()
    memory.reset()
    before = engine.clock.read() if engine.clock else None
    first, tokens = timed(lambda: engine.generate(ids, case.new_tokens))
    if before is not None:
        after = engine.clock.read()
        trace, compile_ = after[0] - before[0], after[1] - before[1]
    if cached:
        case.cached_first_call_s = first
        if before is not None:
            case.cached_trace_s, case.cached_compile_s = trace, compile_
        return
    case.first_call_s = first
    case.tokens = [int(t) for t in tokens[0, :AGREE_TOKENS]]
    timed(lambda: engine.generate(ids, 1))  # compiles the one-token program where there is one
    whole, single = [], []
    while len(whole) < repeats:
        whole.append(timed(lambda: engine.generate(ids, case.new_tokens))[0])
        single.append(timed(lambda: engine.generate(ids, 1))[0])
        if sum(whole) + sum(single) > budget_s:
            break
    case.repeats = len(whole)
    case.ttft_s = min(single)
    case.step_s = max(min(whole) - case.ttft_s, 1e-9) / (case.new_tokens - 1)
    if before is not None:
        case.trace_s, case.compile_s = trace, compile_
    else:
        case.compile_s = max(
            first - min(whole), 0.0
        )  # whatever the first call spent beyond a steady one
    case.peak_rss_bytes = memory.peak()


def worker(spec: dict[str, Any]) -> None:
    """Run one engine over the shapes in ``spec``; append one JSON line per case to ``spec["out"]``."""
    cases = [Case(**c) for c in spec["cases"]]
    out = Path(spec["out"])
    try:
        engine = make_engine(spec["engine"], spec["path"], spec["dtype"])
    except Exception as error:
        for case in cases:
            case.error = f"load failed: {type(error).__name__}: {error}"
            _append(out, case)
        raise
    vocab = engine_vocab(spec["path"])
    for case in cases:
        ids = (
            np.random.default_rng(0).integers(0, vocab, (case.batch, case.prompt)).astype(np.int64)
        )
        try:
            measure(engine, case, ids, spec["repeats"], spec["budget_s"], spec["cached"])
        except Exception as error:  # one failing shape must not hide the others
            case.error = f"{type(error).__name__}: {str(error)[:300]}"
        _append(out, case)


def engine_vocab(path: str) -> int:
    import transformers

    return transformers.AutoConfig.from_pretrained(path).get_text_config(decoder=True).vocab_size


def _append(path: Path, case: Case) -> None:
    with path.open("a") as f:
        f.write(json.dumps(dataclasses.asdict(case)) + "\n")


# ----------------------------------------------------------------------------------------------------------
# The orchestrator


@dataclasses.dataclass
class Sweep:
    """The runs one invocation makes: every model x engine x dtype x batch x prompt length."""

    models: list[str]
    engines: list[str]
    dtypes: list[str]
    batches: list[int]
    prompts: list[int]
    new_tokens: int
    repeats: int
    budget_s: float
    #: Engines whose workers run under another interpreter than this one.
    pythons: dict[str, str] = dataclasses.field(default_factory=dict)


def run_worker(
    sweep: Sweep, engine: str, model: str, path: str, dtype: str, scratch: Path, cached: bool
) -> list[Case]:
    """One engine in a fresh process; compile caches live in ``scratch`` (empty for the cold run)."""
    out = scratch / f"{engine}-{model}-{dtype}-{'cached' if cached else 'cold'}.jsonl"
    cases = [
        Case(model, dtype, b, p, sweep.new_tokens, engine)
        for b in sweep.batches
        for p in sweep.prompts
    ]
    spec = dict(
        engine=engine,
        path=path,
        dtype=dtype,
        cases=[dataclasses.asdict(c) for c in cases],
        out=str(out),
        repeats=sweep.repeats,
        budget_s=sweep.budget_s,
        cached=cached,
    )
    env = dict(
        os.environ,
        HFAX_CACHE=str(scratch / "hfax"),
        TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
    )
    log = scratch / (out.stem + ".log")
    label = f"{engine} {model} {dtype}{' (cached)' if cached else ''}"
    print(f"  {label} ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    with log.open("w") as stderr:
        try:
            python = sweep.pythons.get(engine, sys.executable)
            status = subprocess.run(
                [python, __file__, "--worker", json.dumps(spec)],
                env=env,
                stdout=stderr,
                stderr=stderr,
                timeout=WORKER_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    print(f" {time.perf_counter() - started:.0f} s", file=sys.stderr)
    done = (
        [Case(**json.loads(line)) for line in out.read_text().splitlines()] if out.exists() else []
    )
    if status != 0 and len(done) < len(cases):
        tail = log.read_text()[-600:].strip().splitlines()
        reason = f"worker failed ({status}): {tail[-1] if tail else 'no output'}"
        finished = {(c.batch, c.prompt) for c in done}
        done += [
            dataclasses.replace(c, error=reason)
            for c in cases
            if (c.batch, c.prompt) not in finished
        ]
    return done


def run(sweep: Sweep) -> dict[str, Any]:
    started = datetime.datetime.now(datetime.timezone.utc)
    record: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": machine(),
        "load_average_before": load_average(),
    }
    for engine, python in sweep.pythons.items():  # what the engines under other interpreters ran on
        record["machine"].setdefault("engine_versions", {})[engine] = _ask_self(
            python, "--versions"
        )
    print("measuring memory bandwidth ...", file=sys.stderr)
    bandwidth = memory_bandwidth()
    results: list[Case] = []
    for model in sweep.models:
        path = model_path(model)
        for dtype in sweep.dtypes:
            print(f"{model} {dtype}:", file=sys.stderr)
            products = weight_products_in_worker(model, path, dtype)
            for engine in sweep.engines:
                if engine == "hfax-torchxla" and (
                    reason := torchxla_missing(sweep.pythons.get(engine))
                ):
                    results += [
                        Case(
                            model, dtype, b, p, sweep.new_tokens, engine, error=f"skipped: {reason}"
                        )
                        for b in sweep.batches
                        for p in sweep.prompts
                    ]
                    continue
                with tempfile.TemporaryDirectory(prefix="hfax-bench-") as scratch:
                    cold = run_worker(
                        sweep, engine, model, path, dtype, Path(scratch), cached=False
                    )
                    if engine in CACHED_ENGINES:
                        cached = {
                            (c.batch, c.prompt): c
                            for c in run_worker(
                                sweep, engine, model, path, dtype, Path(scratch), cached=True
                            )
                        }
                        for case in cold:
                            other = cached.get((case.batch, case.prompt))
                            if other is not None:
                                case.cached_first_call_s = other.cached_first_call_s
                                case.cached_trace_s, case.cached_compile_s = (
                                    other.cached_trace_s,
                                    other.cached_compile_s,
                                )
                    results += cold
            # Measured before and after the engines, the faster kept: the machine's speed drifts over minutes.
            both = [products, weight_products_in_worker(model, path, dtype)]
            measured = [p for p in both if "error" not in p]
            record.setdefault("weight_products", {}).setdefault(model, {})[dtype] = (
                min(measured, key=lambda p: p["step_s"]) if measured else both[-1]
            )
    # Measured again at the end: the larger figure is the conservative denominator.
    again = memory_bandwidth()
    bandwidth = {key: max(bandwidth[key], again[key]) for key in bandwidth}
    record.update(
        bandwidth=bandwidth,
        load_average_after=load_average(),
        finished=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    record["results"] = [summarize(case, results, bandwidth["bytes_per_s"]) for case in results]
    return record


def _ask_self(python: str, *args: str) -> dict[str, Any]:
    """This script run under ``python`` with ``args``: the JSON its last line prints, or its last error line."""
    found = subprocess.run(
        [python, __file__, *args], capture_output=True, text=True, timeout=WORKER_TIMEOUT_S
    )
    if found.returncode != 0:
        return {"error": (found.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(found.stdout.strip().splitlines()[-1])


def weight_products_in_worker(model: str, path: str, dtype: str) -> dict[str, Any]:
    """:func:`weight_products` in a fresh process (its weights' memory is its own); an error is recorded."""
    print(f"  weight products alone {model} {dtype} ...", end="", flush=True, file=sys.stderr)
    started = time.perf_counter()
    found = _ask_self(sys.executable, "--weight-products", json.dumps([path, dtype]))
    print(f" {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return found


def summarize(case: Case, results: list[Case], bandwidth: float) -> dict[str, Any]:
    """The case with what is derived from it: throughput, bandwidth fraction, speedups, token agreement."""
    row = dataclasses.asdict(case)
    row["tokens_per_s"] = case.tokens_per_s
    same = [
        c
        for c in results
        if (c.model, c.dtype, c.batch, c.prompt)
        == (case.model, case.dtype, case.batch, case.prompt)
    ]
    if case.step_s:
        path = model_path(case.model)
        reads = step_bytes(path, case.dtype, case.batch, case.prompt + case.new_tokens / 2)
        row["step_bytes"] = reads
        row["bound_fraction"] = reads["total"] / bandwidth / case.step_s
        baselines = [c.tokens_per_s for c in same if c.engine in BASELINES and c.tokens_per_s]
        row["vs_baseline"] = case.tokens_per_s / max(baselines) if baselines else None
    reference = next(
        (c.tokens for c in same if c.engine == "transformers-eager" and c.tokens), None
    )
    if reference and case.tokens:
        row["agree"] = next(
            (i for i, (a, b) in enumerate(zip(case.tokens, reference)) if a != b), len(reference)
        )
    return row


# ----------------------------------------------------------------------------------------------------------
# Reporting


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(value * scale if scale != 1.0 else value, spec)


def table(record: dict[str, Any]) -> str:
    """The results as a Markdown table, one row per model, dtype, shape and engine."""
    header = (
        "model",
        "dtype",
        "batch",
        "prompt",
        "engine",
        "TTFT ms",
        "decode tok/s",
        "% of BW bound",
        "× baseline",
        "trace s",
        "compile s",
        "cached trace+compile s",
        "peak RSS MB",
        f"agree /{AGREE_TOKENS}",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in record["results"]:
        if r["error"]:
            cells = [
                r["model"],
                r["dtype"],
                str(r["batch"]),
                str(r["prompt"]),
                r["engine"],
                r["error"][:80],
            ] + [""] * (len(header) - 6)
        else:
            cached = (
                None
                if r["cached_compile_s"] is None
                else r["cached_compile_s"] + (r["cached_trace_s"] or 0)
            )
            cells = [
                r["model"],
                r["dtype"],
                str(r["batch"]),
                str(r["prompt"]),
                r["engine"],
                _fmt(r["ttft_s"], ".0f", 1e3),
                _fmt(r["tokens_per_s"], ".1f"),
                _fmt(r.get("bound_fraction"), ".0f", 100),
                _fmt(r.get("vs_baseline"), ".2f"),
                _fmt(r["trace_s"], ".2f"),
                _fmt(r["compile_s"], ".2f"),
                _fmt(cached, ".2f"),
                _fmt(r["peak_rss_bytes"], ".0f", 1 / 2**20),
                _fmt(r.get("agree"), "d"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def products_lines(record: dict[str, Any]) -> list[str]:
    """One line per model and dtype: the weight products alone (:func:`weight_products`), and how close
    each batch-1 row of the JAX backend comes to them."""
    lines = []
    bandwidth = record["bandwidth"]["bytes_per_s"]
    for model, by_dtype in record.get("weight_products", {}).items():
        for dtype, floor in by_dtype.items():
            if "error" in floor:
                lines.append(f"{model} {dtype}: not measured ({floor['error']})")
                continue
            step, moved = floor["step_s"], floor["bytes"]
            rows = [
                r
                for r in record["results"]
                if (r["model"], r["dtype"], r["engine"], r["batch"])
                == (model, dtype, "hfax-jax", 1)
            ]
            reached = ", ".join(
                f"{step / r['step_s']:.0%} of it at prompt {r['prompt']}"
                for r in rows
                if r["step_s"]
            )
            lines.append(
                f"{model} {dtype}: {step * 1e3:.2f} ms per step, {1 / step:.1f} steps/s, {moved / step / 1e9:.1f} GB/s "
                f"({moved / step / bandwidth:.0%} of the copy bandwidth)"
                + (f"; hfax-jax's batch-1 step runs at {reached}" if reached else "")
            )
    return lines


#: Where the page's sections written by other benchmarks (benchmarks/train.py) begin; regenerating the
#: decode tables keeps them.
def kept_sections(page: Path) -> str:
    """The sections other benchmarks write on ``page`` (``## Loading``, ``## Training``, ...): everything
    from its first ``## `` heading on; this script's own part of the page has none."""
    text = page.read_text() if page.exists() else ""
    start = text.find("\n## ")
    return "" if start < 0 else "\n" + text[start + 1 :]


def write_section(page: Path, heading: str, section: str) -> None:
    """Put ``section`` (which starts with ``heading``, a ``## `` line) in place of that section of
    ``page``, which runs to the next ``## `` heading; appended when the page has none yet."""
    text = page.read_text() if page.exists() else "# Performance\n"
    start = text.find(f"\n{heading}\n")
    if start < 0:
        page.write_text(f"{text.rstrip()}\n\n{section.rstrip()}\n")
        return
    end = text.find("\n## ", start + 1)
    rest = "" if end < 0 else text[end:]
    page.write_text(f"{text[:start].rstrip()}\n\n{section.rstrip()}\n{rest}")


def markdown(record: dict[str, Any]) -> str:
    m, bw = record["machine"], record["bandwidth"]
    memory = f", {m['memory_bytes'] / 2**30:.0f} GiB RAM" if m.get("memory_bytes") else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    for engine, found in m.get("engine_versions", {}).items():
        versions += f"; {engine} under its own interpreter: " + ", ".join(
            f"{k} {v}" for k, v in found.items()
        )
    lines = products_lines(record)
    products = (
        "".join(
            [
                "- Weight products alone (one row times every weight matrix in a jitted loop, in the JAX backend's forms; no\n"
                "  attention, norms, cache writes or sampling; the most XLA:CPU's products reach over these bytes):\n"
            ]
            + [f"  - {line}\n" for line in lines]
        )
        if lines
        else ""
    )
    return f"""# Performance

Generated by `benchmarks/decode.py`; do not edit by hand: rerun the benchmark instead.

- Command: `{record["command"]}`
- Measured {record["started"]} to {record["finished"]} on {m["cpu"]} ({m["cores"]} cores{memory}), {m["platform"]}
- Load average (1, 5, 15 min) before: {record["load_average_before"]}, after: {record["load_average_after"]}
- Memory bandwidth (large array copy, read + write): {bw["bytes_per_s"] / 1e9:.1f} GB/s
  ({", ".join(f"{k.replace('_', ' ')}: {v / 1e9:.1f} GB/s" for k, v in bw.items() if k != "bytes_per_s")})
- Versions: {versions}
{products}
Greedy decoding of exactly `new_tokens` tokens from random prompts. *TTFT*: a one-token `generate`
(prefill and the first token), best of the repeats. *decode tok/s*: batch × (new_tokens − 1) ÷ (best
full call − TTFT). *% of BW bound*: (bytes of weights and KV cache one decode step reads ÷ bandwidth) ÷
step time. *× baseline*: over the faster of transformers' default (sdpa) and eager attention. *trace*,
*compile*: what the first call spent (JAX: tracing and lowering, XLA compile; torch.compile: everything the
first call took beyond a steady one); *cached*: the same in a second process with the persistent cache.
*agree*: leading tokens of the first sequence equal to transformers-eager's.

{table(record)}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, among {', '.join(MODELS)}"
    )
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help=f"comma-separated, among {', '.join(ENGINES)}"
    )
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--prompt", default="32,512", help="prompt lengths, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed calls per measurement (best is kept)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="stop repeating once a shape took this many seconds",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=ROOT / "benchmarks" / "results" / "decode.json",
        help="JSON record to write",
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        default=ROOT / "docs" / "PERFORMANCE.md",
        help="Markdown page to regenerate",
    )
    parser.add_argument("--no-markdown", action="store_true", help="do not touch the Markdown page")
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="ENGINE=PYTHON",
        help="run an engine's workers under another interpreter (repeatable)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--probe-torchxla", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--weight-products", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.probe_torchxla:
        print(torchxla_missing() or "")
        return 0
    if args.versions:
        print(json.dumps(versions()))
        return 0
    if args.weight_products:
        print(json.dumps(weight_products(*json.loads(args.weight_products))))
        return 0

    def items(text: str, allowed: tuple[str, ...] | None = None) -> list[str]:
        chosen = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in chosen if allowed and item not in allowed]
        if bad:
            parser.error(f"unknown {', '.join(bad)}; choose among {', '.join(allowed or ())}")
        return chosen

    pythons = {}
    for item in args.python:
        engine, _, python = item.partition("=")
        if engine not in ENGINES or not python:
            parser.error(
                f"--python takes ENGINE=PYTHON with ENGINE among {', '.join(ENGINES)}, got {item!r}"
            )
        if shutil.which(python) is None:
            parser.error(f"--python {item}: {python} is not an executable interpreter")
        pythons[engine] = python
    if args.new_tokens < 2:
        parser.error(
            "--new-tokens must be at least 2: the step time is the difference to a one-token call"
        )
    sweep = Sweep(
        models=items(args.models, MODELS),
        engines=items(args.engines, ENGINES),
        dtypes=items(args.dtypes, ("float32", "bfloat16")),
        batches=[int(b) for b in items(args.batch)],
        prompts=[int(p) for p in items(args.prompt)],
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        budget_s=args.budget,
        pythons=pythons,
    )
    record = run(sweep)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    print(f"\nwrote {args.json}", file=sys.stderr)
    if not args.no_markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(record) + kept_sections(args.markdown))
        print(f"wrote {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
