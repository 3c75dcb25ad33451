"""Sustained load: the settling loop stops when the rate settles or at its bound; the keep-warm
runs only after its interval; sensors answer None where there is no NVML."""

from __future__ import annotations

import pytest
import torch

from simcluster.profiler.bench.sustained import GpuSensors, SustainedLoad

CPU = torch.device("cpu")


def _load(block_seconds: list[float], **kw: float) -> tuple[SustainedLoad, list[int]]:
    """A CPU load whose blocks take the given seconds, in turn; counts the blocks run."""
    load = SustainedLoad(CPU, **{"min_s": 0.0, "max_s": 60.0, "window": 2, **kw})  # type: ignore[arg-type]
    calls = [0]

    def block_s() -> float:
        calls[0] += 1
        return block_seconds[min(calls[0], len(block_seconds)) - 1]

    load._block_s = block_s  # type: ignore[method-assign]
    return load, calls


def test_cpu_has_no_sensors() -> None:
    sensors = GpuSensors(CPU)
    assert not sensors.available and sensors.read() == (None, None)


def test_settle_stops_once_two_windows_agree() -> None:
    """Blocks of 1, 1, 1 s, then 2 s: windows of 2 first agree at block 7 ([2, 2] vs [2, 2])."""
    load, calls = _load([1.0, 1.0, 1.0] + [2.0] * 20)
    log = load.settle()
    assert log["settled"] is True and log["blocks"] == 7 == calls[0]
    assert log["settled_tflop_per_s"] == pytest.approx(load._flop / 2.0 / 1e12, rel=1e-3)
    assert log["first_tflop_per_s"] == pytest.approx(load._flop / 1.0 / 1e12, rel=1e-3)
    assert log["sm_clock_mhz"] is None and log["power_w"] is None


def test_settle_is_bounded_when_the_rate_never_settles() -> None:
    """max_s 0: one block, then the bound ends the loop, reported as not settled."""
    load, calls = _load([1.0, 2.0] * 50, max_s=0.0)
    log = load.settle()
    assert log["blocks"] == 1 == calls[0] and log["settled"] is False


def test_maintain_reheats_only_after_its_interval() -> None:
    load, calls = _load([1.0], interval_s=3600.0, reheat_s=0.0)
    load.settle()
    before = calls[0]
    load.maintain()  # within the interval: nothing runs
    assert calls[0] == before
    load.interval_s = 0.0
    load.reheat_s = 0.0
    load.maintain()  # interval passed: the loop body runs until reheat_s has passed (at once)
    assert calls[0] == before
    load.reheat_s = 1e-3
    load.maintain()
    assert calls[0] > before
