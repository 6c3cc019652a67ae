"""Counting XLA compilations through ``jax.monitoring``, so tests and stats can see what was compiled."""

from __future__ import annotations

import dataclasses
import threading

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


@dataclasses.dataclass
class CompileCounter:
    """Running totals of XLA programs built (compiled or read from the persistent cache) and time spent."""

    compiles: int = 0
    compile_seconds: float = 0.0
    trace_seconds: float = 0.0
    #: compiles by function, as JAX names it: ``"jit(_generate_all)"`` is the whole generate program
    by_function: dict[str, int] = dataclasses.field(default_factory=dict)


_totals = CompileCounter()
_lock = threading.Lock()
_installed = False


def _listener(event: str, duration: float, fun_name: str = "?", **_: object) -> None:
    if event == _COMPILE_EVENT:
        with _lock:
            _totals.compiles += 1
            _totals.compile_seconds += duration
            _totals.by_function[fun_name] = _totals.by_function.get(fun_name, 0) + 1
    elif event == _TRACE_EVENT:
        with _lock:
            _totals.trace_seconds += duration


def install() -> None:
    """Start counting (idempotent)."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


def snapshot() -> CompileCounter:
    """The totals so far; subtract two snapshots to see what happened in between."""
    install()
    with _lock:
        return dataclasses.replace(_totals, by_function=dict(_totals.by_function))
