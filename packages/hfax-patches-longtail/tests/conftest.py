"""Tests of the long-tail families: every plugin problem fails the run, as in hfax's CI."""

from __future__ import annotations

import os

os.environ.setdefault("HFAX_STRICT_PLUGINS", "1")
