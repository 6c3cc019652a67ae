"""The PyTorch/XLA runtime as hfax uses it: started once (SPMD or not, persistent compilation cache),
what it reports about compilation and CPU fallbacks, and compiled calls that leave nothing broken behind
when they fail.

Two choices must come before the first XLA computation of the process and cannot be undone: SPMD mode
(``torch_xla.runtime.use_spmd``) and the persistent cache (``torch_xla.runtime.initialize_cache``). hfax
makes both when it places the first model's weights, so the first model decides whether the process runs
SPMD.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from typing import Any, Callable

import torch
import torch_xla
import torch_xla.debug.metrics as metrics
import torch_xla.runtime as xr

_lock = threading.Lock()
_spmd: bool | None = None  # None until the runtime was started by hfax


class RuntimeModeError(RuntimeError):
    """SPMD was asked for after the process already ran XLA without it (or the other way round)."""


def _enable_compilation_cache() -> None:
    """Keep compiled programs on disk so a second process does not compile again (unless the user chose a dir)."""
    if os.environ.get("HFAX_NO_COMPILATION_CACHE") or os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
        return
    if torch_xla._XLAC._xla_computation_cache_is_initialized():
        return  # something ran on XLA before hfax: too late for a persistent cache, and harmless
    from hfax.demo import cache_dir

    path = cache_dir() / "torch_xla"
    path.mkdir(parents=True, exist_ok=True)
    xr.initialize_cache(str(path), readonly=False)


def start(spmd: bool) -> None:
    """Start the runtime once per process, in SPMD mode when ``spmd``; later calls must agree."""
    global _spmd
    with _lock:
        if _spmd is None:
            if spmd:
                xr.use_spmd()  # the very first runtime call: later, shardings silently become replication
            _enable_compilation_cache()
            _spmd = spmd or xr.is_spmd()
        elif spmd and not _spmd:
            raise RuntimeModeError(
                "this process already runs PyTorch/XLA without SPMD, and SPMD must be chosen before the first "
                "XLA computation: load the sharded model first (mesh=...), or in a new process"
            )


def device() -> torch.device:
    """The XLA device tensors go to (in SPMD mode, the one virtual device that spans the mesh)."""
    return torch_xla.device()


def platform() -> str:
    """The devices' platform, as PJRT names it: ``"CPU"``, ``"TPU"``, ``"CUDA"``."""
    return xr.device_type() or "?"


def devices() -> list[str]:
    """Every addressable device, as ``platform:index``."""
    return [f"{platform()}:{index}" for index in range(xr.global_runtime_device_count())]


@dataclasses.dataclass(frozen=True)
class Counters:
    """Running totals from ``torch_xla.debug.metrics``: XLA programs compiled, their compile time, and the
    aten:: operations that fell back to the CPU (by name, with how often they ran)."""

    compiles: int
    compile_seconds: float
    fallbacks: dict[str, int]

    def __sub__(self, earlier: Counters) -> Counters:
        fallbacks = {
            name: count - earlier.fallbacks.get(name, 0) for name, count in self.fallbacks.items()
        }
        return Counters(
            self.compiles - earlier.compiles,
            self.compile_seconds - earlier.compile_seconds,
            {name: count for name, count in fallbacks.items() if count},
        )


def counters() -> Counters:
    """The totals so far; subtract two snapshots to see what happened in between.

    A program read back from the persistent cache counts as compiled: it holds as much host memory. (On
    CPU none is: torch_xla 2.9 writes CPU programs to the cache but fails to deserialize them.)
    """
    data = metrics.metric_data("CompileTime")
    compiles, nanoseconds = (data[0], data[1]) if data else (0, 0.0)
    compiles += metrics.counter_value("PersistentCacheHit") or 0
    fallbacks = {
        name: metrics.counter_value(name) or 0
        for name in metrics.counter_names()
        if name.startswith("aten::")
    }
    return Counters(compiles, nanoseconds / 1e9, fallbacks)


def flushed_on_failure(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` (a ``torch.compile``d step) that, when a call fails, syncs what it left pending first.

    A call that fails inside torch_xla 2.9's dynamo bridge (a graph break it cannot resume, e.g. in
    Reformer's forward) can leave live tensors holding a graph that a program compiled during the failed
    trace claims by hash but does not fit: the next sync fails with "Execution supplied 19 buffers but
    compiled program expected 18 buffers", in whichever model's call makes it. Syncing here spends that
    error inside the call that caused it (the call's own error is the one raised), and the process keeps
    working."""

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except Exception:
            with contextlib.suppress(RuntimeError):
                torch_xla.sync()
            raise

    return call
