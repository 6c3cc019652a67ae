"""Fake installed distributions: what ``pip install`` of a plugin would leave in ``site-packages``.

``write_distribution`` lays out a ``.dist-info`` folder with ``entry_points.txt``, plus the plugin's modules.
``installed_distribution`` also puts it on ``sys.path`` for the duration of a ``with`` block, so hfax finds the
plugin through its entry point, as it would find an installed one::

    plugin = {"hfax_myfamily": SOURCE}  # module name -> source
    with installed_distribution(tmp_path / "d", "hfax-myfamily", {"myfamily": "hfax_myfamily"}, plugin):
        assert hfax.detect_family(config) == "myfamily"

Needs neither torch nor numpy: hfax-core's own tests use it.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import textwrap
from pathlib import Path
from typing import Iterator, Mapping

from hfax.plugins import reset_plugins


def write_distribution(
    directory: str | Path,
    name: str,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
    version: str = "0.0.0",
) -> Path:
    """Write an installed distribution ``name`` into ``directory`` and return its ``.dist-info`` folder.

    ``entry_points`` maps plugin names to the objects the ``hfax`` group points at (``"module"`` or
    ``"module:attribute"``); ``modules`` maps module names to their source (dedented).
    """
    directory = Path(directory)
    dist_info = directory / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    lines = [f"{plugin} = {target}" for plugin, target in entry_points.items()]
    (dist_info / "entry_points.txt").write_text("[hfax]\n" + "\n".join(lines) + "\n")
    for module, source in (modules or {}).items():
        (directory / f"{module}.py").write_text(textwrap.dedent(source))
    return dist_info


@contextlib.contextmanager
def installed_distribution(
    directory: str | Path,
    name: str,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
    version: str = "0.0.0",
) -> Iterator[Path]:
    """Write a distribution into the new folder ``directory`` and make it visible to hfax until the block ends.

    Plugins are reloaded on the next use, inside the block and again after it. ``directory`` must be a
    folder of its own: importlib.metadata caches a folder's listing by its modification time.
    """
    write_distribution(directory, name, entry_points, modules, version)
    path = str(directory)
    sys.path.insert(0, path)
    importlib.invalidate_caches()
    reset_plugins()
    try:
        yield Path(directory)
    finally:
        sys.path.remove(path)
        for module in modules or {}:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()
        reset_plugins()
