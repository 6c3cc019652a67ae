"""The namespace split: several distributions share the `hfax` package, and none shadows a real library."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest

#: The module each first-party distribution puts into the shared `hfax` namespace.
MODULES = {
    "hfax-core": "hfax",
    "hfax-jax": "hfax.backends.jax",
    "hfax-patches-llama": "hfax.patches.llama",
    "hfax-patches-gemma": "hfax.patches.gemma",
    "hfax-serve": "hfax.serve",
    "hfax-testing": "hfax.testing",
}


def run_python(code: str) -> str:
    env = {**os.environ, "HFAX_STRICT_PLUGINS": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.parametrize("distribution", sorted(MODULES))
def test_each_module_comes_from_its_own_distribution(distribution):
    """All installed together, each package is found in its own distribution, editable or not.

    The `integration` session installs every package editable (`pip install -e`), which hatchling does
    with a path entry per package: this is the proof that such installs import together.
    """
    package = importlib.import_module(MODULES[distribution])
    folders = {Path(folder).resolve() for folder in package.__path__}  # several for `hfax` itself
    dist = importlib.metadata.distribution(distribution)
    relative = MODULES[distribution].replace(".", "/")
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        expected = Path(url2pathname(urlparse(direct_url["url"]).path)).resolve() / "src" / relative
    else:
        expected = Path(dist.locate_file(relative)).resolve()
    assert expected in folders, (
        f"{MODULES[distribution]} is imported from {sorted(folders)}, not {expected}"
    )
    for entry_point in dist.entry_points.select(group="hfax"):
        plugin = entry_point.load()
        assert Path(plugin.__file__).resolve().is_relative_to(expected), (
            f"{entry_point} loads {plugin.__file__}"
        )


def test_backend_package_does_not_shadow_jax():
    import jax

    import hfax.backends.jax

    assert jax.__name__ == "jax" and callable(jax.jit)
    assert jax is not hfax.backends.jax


def test_listing_plugins_imports_neither_torch_nor_jax():
    # A plugin module must stay cheap to import: `hfax plugins` imports every one of them.
    found = run_python(
        "import sys, json, hfax.plugins as p\n"
        "infos = p.plugin_infos()\n"
        "print(json.dumps({'heavy': sorted({'torch', 'jax'} & set(sys.modules)),"
        " 'status': {i.name: i.status for i in infos}, 'backends': sorted(p.backends())}))"
    )
    result = json.loads(found)
    assert result["heavy"] == []
    assert set(result["status"].values()) <= {"builtin", "loaded"}
    assert "jax" in result["backends"]
