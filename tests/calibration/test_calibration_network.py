"""`--network`: the all-reduce sweep (gloo on CPU here, NCCL on GPUs) and what it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import AllReducePoint, Measurements
from simcluster.config.hardware import parse_hardware
from simcluster.profiler.bench.netbench import measure_allreduce
from tests.calibration.test_calibration_fit import GEMMS, SITES, _measurements


def test_the_sweep_runs_on_every_rank_and_reports_busbw() -> None:
    """Two gloo processes: one point per message size, busbw = 2(n−1)/n · bytes / time."""
    points = measure_allreduce(2, quick=True, backend="gloo")
    assert [p.message_bytes for p in points] == [2**15, 2**20, 2**24]
    assert all(p.num_ranks == 2 and p.seconds > 0 for p in points)
    assert points[0].busbw_bytes_per_s == pytest.approx(2**15 / points[0].seconds)


def test_a_measured_sweep_replaces_the_nvlink_table(tmp_path: Path) -> None:
    """The profile says 'measured', keeps the base's other numbers and cites each one."""
    meas: Measurements = _measurements(GEMMS, SITES)
    sweep = [AllReducePoint(2**20, 20e-6, 8), AllReducePoint(2**30, 4e-3, 8)]
    profile = parse_hardware(build_profile(meas, network=sweep), "synthetic.yaml")
    assert profile.network.measured == "measured"
    assert profile.network.gpus_per_node == 8
    mb, busbw = profile.network.nvlink_allreduce_busbw[1]
    assert mb == pytest.approx(2**30 / 1e6) and busbw == pytest.approx(1.75 * 2**30 / 4e-3 / 1e9, rel=1e-3)
    assert profile.calibration["network_measured"] is True
    assert profile.network.nvlink_allgather_busbw is None  # the base's ring table would not match
    assert "from h100-sxm5-80gb" in profile.network.sources["nic_achieved_gb_per_s"]
