"""SPMD over CPU devices, each case in a fresh process: PyTorch/XLA takes SPMD mode only as the first runtime
call, and takes its CPU device count from CPU_NUM_DEVICES (XLA_FLAGS' host device count is ignored)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("spmd_worker.py")


def run(tmp_path, mesh: str, devices: int) -> dict:
    env = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(devices),
        "HFAX_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path / "llama"), mesh],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mesh", ["model=4", "data=2,model=2"])
def test_a_sharded_model_gives_the_tokens_of_one_device(tmp_path, mesh):
    result = run(tmp_path, mesh, devices=4)
    assert result["devices"] == 4
    assert result["logits_error"] < 1e-4 and result["same_tokens"], result
    # The family plan's layout: q by heads (rows), down_proj by its input (columns); Llama's two key/value
    # heads do not split four ways, so on model=4 k_proj stays whole.
    assert result["q_proj"].startswith("{devices=["), result
    assert result["down_proj"].startswith("{devices=["), result
    assert result["report_q_proj"] == ["model", None], result
    if mesh == "model=4":
        assert result["k_proj"] in ("", "{replicated}"), result


def test_plan_says_where_weights_go_without_starting_the_runtime(tiny, monkeypatch):
    import hfax

    directory, _, model = tiny("llama")
    layout = hfax.AutoModelForTPU.plan(str(directory), backend="torch_xla", mesh={"model": 4})
    specs = {placement.name: placement.spec for placement in layout.placements}
    assert specs["model.layers.0.self_attn.q_proj.weight"] == ("model", None)
    assert specs["model.layers.0.mlp.down_proj.weight"] == (None, "model")
    assert specs["model.layers.0.self_attn.k_proj.weight"] == (
        None,
        None,
    )  # 2 key/value heads, 4 devices
    assert layout.bytes_per_device < layout.bytes
    assert model.sharding_report().bytes == layout.bytes  # one device: everything whole
    monkeypatch.setenv("HFAX_DEVICE_MEMORY", "100KB")
    with pytest.raises(hfax.DeviceMemoryError, match="HFAX_DEVICE_MEMORY"):
        hfax.AutoModelForTPU.from_pretrained(str(directory), backend="torch_xla")
