"""scripts/gpu_calibrate.sh --smoke on the CPU: every file of the GPU run, readable by
simcluster.calibration, carrying the layer mode, the load and the clock/power fields."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.calibration.records import LayerRun, Measurements

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "microbench.json",
    "layer_timing_fused.json",
    "layer_timing_eager.json",
    "modern_layers_fused.json",
    "modern_layers_eager.json",
    "host_graph.json",
    "gpu_memory.md",
    "run.log",
}


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_smoke_run_writes_every_file(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/gpu_calibrate.sh", "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr
    assert "FAIL" not in done.stdout, (tmp_path / "run.log").read_text()[-3000:]
    assert {p.name for p in tmp_path.iterdir()} == FILES  # <= 8: the device tool's limit

    meas = Measurements.from_json((tmp_path / "microbench.json").read_text())
    assert meas.layer_mode == "eager" and meas.load == "sustained"
    assert meas.warmup is not None and meas.warmup["blocks"] >= 1
    assert len(meas.gemms) + len(meas.elementwise) == 4  # --limit 4
    kinds = {k.kind for k in meas.modern}
    assert {"memory_bound", "attention", "gemm_bf16", "optimizer"} <= kinds
    assert {k.name for k in meas.modern} >= {"rms_norm.forward", "rope.backward", "swiglu.forward"}
    assert all(r.sm_clock_mhz is None and r.power_w is None for r in meas.gemms + meas.elementwise)
    assert len(meas.grouped_gemms) == 24  # the quick grid's grouped expert GEMMs (issue 18)

    for name in ("layer_timing_fused.json", "layer_timing_eager.json"):
        run = LayerRun.from_json((tmp_path / name).read_text())
        assert len(run.timings) == 2 and run.load == "sustained"
        assert all(t.total_s > t.forward_s > 0 for t in run.timings)
        # the host's issue times (a quick CPU run records them for every layer)
        assert all(t.host_total_s is not None and t.host_forward_s is not None for t in run.timings)
        assert all(t.host_total_s > t.host_forward_s > 0 for t in run.timings)  # type: ignore[operator]
    modern = LayerRun.from_json((tmp_path / "modern_layers_eager.json").read_text())
    assert modern.layer_mode == "eager" and modern.timings[0].layer is not None
    assert modern.timings[0].layer["activation"] == "swiglu"

    host = json.loads((tmp_path / "host_graph.json").read_text())
    assert host["cases"][0]["graph_s"] is None and host["cases"][0]["eager_s"] > 0
    moe = host["moe_cases"][0]  # the MoE block (issue 18) ran, forward + backward
    assert "error" not in moe and moe["eager_s"] > 0 and moe["local_experts"] == 4
