import os
import subprocess
import sys

import pytest

import hfax


def test_listing_plugins_imports_neither_torch_nor_torch_xla():
    code = (
        "import sys, hfax.plugins as p; names = p.backends(); assert 'torch_xla' in names, names; "
        "heavy = {'torch', 'torch_xla'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "HFAX_STRICT_PLUGINS": "1"}
    )


def test_the_backend_lists_its_devices():
    devices = hfax.get_backend("torch_xla").devices()
    assert devices and all(":" in device for device in devices)


def test_the_backend_has_no_serving_engine_and_says_so():
    # hfax serve asks serves() before loading anything; serving_engine itself refuses by name.
    backend = hfax.get_backend("torch_xla")
    assert backend.serves() is False
    with pytest.raises(
        NotImplementedError, match="the torch_xla backend has no continuous-batching"
    ):
        backend.serving_engine(None, slots=2, length=64, chunk=4)


def test_compiled_programs_go_to_the_persistent_cache(tiny):
    import torch_xla.runtime as xr

    tiny("llama")[2].generate([[1, 5, 9]], max_new_tokens=4)
    path = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
    assert path and path.startswith(os.environ["HFAX_CACHE"]), path
    assert os.listdir(path), "no compiled program was written to the persistent cache"
    assert xr.get_num_cached_compilation_graph() > 0
