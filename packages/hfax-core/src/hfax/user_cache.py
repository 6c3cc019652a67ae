"""The folder where hfax keeps what outlives a run: converted checkpoints, compiled programs, benchmark
models."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$HFAX_CACHE``, else ``hfax`` in the user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    if os.environ.get("HFAX_CACHE"):
        return Path(os.environ["HFAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hfax"
