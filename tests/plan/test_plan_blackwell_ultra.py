"""`plan` and `sweep` take the Blackwell Ultra profiles and an NVFP4 scenario (issue 19):
nothing in either is specific to a profile, and this checks it stays so."""

from __future__ import annotations

import json

import pandas as pd
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from tests.plan.plan_world import TINY


def _tiny_fp4(tmp_path, hardware: str, layout: bool = False):
    """The plan world's tiny model in NVFP4; without a layout for plan, with one for sweep."""
    data = {key: value for key, value in TINY.items() if layout or key != "parallel"}
    data["hardware"] = hardware
    data["training"] = {"global_batch_size": 16, "dtype": "fp4"} | ({"micro_batch_size": 1} if layout else {})
    path = tmp_path / "tiny-fp4.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_searches_an_nvfp4_run_on_gb300(tmp_path):
    """Every candidate keeps dtype fp4 and exports Megatron-core's FP4 flags."""
    result = CliRunner().invoke(
        app,
        [
            "plan",
            str(_tiny_fp4(tmp_path, "gb300-nvl72")),
            "--gpus",
            "8",
            "--top",
            "3",
            "--json",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    candidates = json.loads(result.output)["candidates"]
    assert candidates
    for candidate in candidates:
        assert candidate["scenario"]["training"]["dtype"] == "fp4"
        assert "--fp4-format e2m1" in candidate["megatron_args"]


def test_sweep_over_the_new_profiles(tmp_path):
    """A hardware axis of B300 and GB300 runs every NVFP4 row on each profile."""
    base = _tiny_fp4(tmp_path, "b300-sxm-288gb", layout=True)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "base": str(base),
                "num_gpus": 8,
                "axes": {"tp": [1, 2], "hardware": ["b300-sxm-288gb", "gb300-nvl72"]},
            }
        )
    )
    out = tmp_path / "rows.parquet"
    result = CliRunner().invoke(
        app, ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out)
    assert len(rows) == 4 and rows["iteration_time_s"].notna().all()
    assert sorted(rows["hardware"]) == ["b300-sxm-288gb"] * 2 + ["gb300-nvl72"] * 2
    assert (rows["dtype"] == "fp4").all()
