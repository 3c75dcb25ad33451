"""Issue 20's goal on the second H100's eager paper grid (docs/calibration/h100-2026-11-27-script/
layer_timing_eager_full.json: all 96 eager paper layers, the harness without the
bias-dropout-add mask-row loop, with the host's issue times of every layer of at most 30 ms).

The profile is the one

    simcluster calibrate --measurements docs/calibration/h100-2026-11-26/microbench.json \\
        --tiny-layers docs/calibration/h100-2026-11-27-script/followup.json

writes: kernels of the 2026-11-26 H100 (eager microbench), host terms from the eager tiny
layers of the 2026-11-27 follow-up (two machines of the same kind, declared in the profile).
Nothing of the checked file is fitted. CPU only, committed files.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml

from simcluster.calibration.check import LayerCheck, compare, summarize
from simcluster.calibration.host_timeline import host_check, main, recompute_excess, timeline
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, LayerTiming, Measurements
from simcluster.calibration.tiny_layers import declare, with_tiny_layers
from simcluster.config.hardware import HardwareProfile, parse_hardware

DOCS = Path(__file__).resolve().parents[2] / "docs" / "calibration"
KERNELS = DOCS / "h100-2026-11-26" / "microbench.json"
FOLLOWUP = DOCS / "h100-2026-11-27-script" / "followup.json"
EAGER_FULL = DOCS / "h100-2026-11-27-script" / "layer_timing_eager_full.json"
OLD_EXCEPTION = (10240, 1, 8, False)  # tests/calibration/test_calibration_h100.py, full recompute


def _key(t: LayerTiming) -> tuple[int, int, int, bool, str]:
    return (t.hidden_size, t.micro_batch_size, t.tp, t.sequence_parallel, t.recompute)


@pytest.fixture(scope="module")
def fitted() -> HardwareProfile:
    meas, provenance = with_tiny_layers(
        Measurements.from_json(KERNELS.read_text()), FOLLOWUP.read_text(), str(FOLLOWUP)
    )
    return parse_hardware(declare(build_profile(meas), provenance, host_graph=False), "h100-fitted-tiny.yaml")


@pytest.fixture(scope="module")
def run() -> LayerRun:
    return LayerRun.from_json(EAGER_FULL.read_text())


@pytest.fixture(scope="module")
def checks(fitted: HardwareProfile, run: LayerRun) -> list[LayerCheck]:
    return compare(run, fitted)


def test_the_goal_is_met_on_the_96_eager_runs(fitted: HardwareProfile, checks: list[LayerCheck]) -> None:
    """Median ≤ 5 % over all 96 runs (3.0 %); over the GPU-bound runs median ≤ 5 % (2.9 %) and
    worst ≤ 10 % (5.1 %), with no named exception. The host-bound runs (9: the eager host's
    issue time adds ≥ 5 % to the device time, by the tiny layers' host terms) are the b 1,
    t 4-8 layers, where the device is fastest."""
    assert fitted.calibration["host_issue"]["checkpoint_us"] > 0  # the tiny layers' term is in use
    summary = summarize(checks)
    assert summary.num_runs == 96 and summary.median_abs_error <= 0.05
    assert summary.gpu_bound_median_abs_error is not None and summary.gpu_bound_median_abs_error <= 0.05
    assert summary.gpu_bound_max_abs_error is not None and summary.gpu_bound_max_abs_error <= 0.10
    host_bound = [c.timing for c in checks if c.host_bound]
    assert 0 < len(host_bound) <= 10
    assert all(t.micro_batch_size == 1 and t.tp >= 4 for t in host_bound)


def test_the_runs_left_out_are_host_limited_by_their_own_measurement(checks: list[LayerCheck]) -> None:
    """Each run the check leaves out as host-bound recorded a host issue time of at least 3/4
    of its whole time (0.77-2.35), where the GPU-bound runs' median is under 1/2 (0.43): the
    host is as slow as the run. The runs over 10 % (h 6144, b 1, t 8: SP off selective, SP on
    selective and full, -14 to -48 %) are among them, and their forwards, which run the same
    kernels under every recompute, are ≥ 25 % slower than their layout's forward without
    recompute, while in every layout but this one the three forwards agree within 5 %: the
    host, not the device."""
    timed = [c for c in checks if c.timing.host_total_s is not None]
    ratio = {_key(c.timing): c.timing.host_total_s / c.timing.total_s for c in timed}  # type: ignore[operator]
    assert all(ratio[_key(c.timing)] >= 0.75 for c in checks if c.host_bound)
    assert statistics.median(ratio[_key(c.timing)] for c in timed if not c.host_bound) < 0.5
    forwards: dict[tuple[int, int, int, bool], dict[str, float]] = {}
    for c in checks:
        assert c.timing.forward_s is not None
        forwards.setdefault(_key(c.timing)[:4], {})[c.timing.recompute] = c.timing.forward_s
    over = [c.timing for c in checks if abs(c.error) > 0.10]
    assert sorted(_key(t) for t in over) == [
        (6144, 1, 8, False, "selective"),
        (6144, 1, 8, True, "full"),
        (6144, 1, 8, True, "selective"),
    ]
    assert all(c.host_bound for c in checks if abs(c.error) > 0.10)
    assert all(t.forward_s >= 1.25 * forwards[_key(t)[:4]]["none"] for t in over)  # type: ignore[operator]
    others = [f for layout, f in forwards.items() if layout[:3] != (6144, 1, 8)]
    assert len(others) == 30 and all(max(f.values()) <= 1.05 * min(f.values()) for f in others)


def test_the_old_exception_was_the_harness_loop(fitted: HardwareProfile, run: LayerRun) -> None:
    """The 2026-11-26 file's named exception (h 10240, b 1, t 8, SP off, full recompute: 10.6 %
    fast, full minus no recompute 1.51 ms over one forward) was timed with the bias-dropout-add
    mask-row loop in every call (2,048 rows with SP off). Without it, full minus none is one
    forward (within 3 %, SP off and on) and the run is priced within 5 %."""
    excess = {
        (r.hidden_size, r.micro_batch_size, r.tp, r.sequence_parallel): r for r in recompute_excess(run)
    }
    for sp in (False, True):
        assert abs(excess[(*OLD_EXCEPTION[:3], sp)].excess) < 0.03
    (timing,) = [t for t in run.timings if _key(t) == (*OLD_EXCEPTION, "full")]
    assert abs(timeline(timing, fitted, run.dropout_prob).error) < 0.05


def test_the_host_terms_against_the_measured_host_times(fitted: HardwareProfile, run: LayerRun) -> None:
    """The 57 runs with host times: the one-repeat pipeline (check-profile's `with_host_s`)
    prices the repeats started on an idle GPU, which it models, within 2.3 % (median). The
    tiny layers' checkpoint term prices selective recompute's host cost as measured (1.67 vs
    1.63 ms, medians), but full recompute's at 2.4 ms against 4.0 ms measured, and the
    layers' plain issue time at 1/1.64 of the measured (117 µs per priced op against the tiny
    layers' 71.7 µs): a host the tiny layers under-price, which the GPU-bound runs do not see."""
    check = host_check([timeline(t, fitted, run.dropout_prob) for t in run.timings])
    assert check is not None and check.num_runs == 57
    assert check.pipeline_median_abs_error < 0.05
    measured, priced = check.recompute_host_s["selective"]
    assert priced == pytest.approx(measured, rel=0.10)
    measured, priced = check.recompute_host_s["full"]
    assert priced < 0.7 * measured
    assert check.measured_over_priced_host["none"] > 1.3


def test_host_timeline_prints_the_host_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m simcluster.calibration.host_timeline` adds the host check where the run
    recorded host times (JSON key `host_check`), and none for the 2026-11-26 file (no host
    times recorded)."""
    meas, provenance = with_tiny_layers(
        Measurements.from_json(KERNELS.read_text()), FOLLOWUP.read_text(), str(FOLLOWUP)
    )
    profile = tmp_path / "fitted.yaml"
    profile.write_text(yaml.safe_dump(declare(build_profile(meas), provenance, host_graph=False)))
    assert main([str(profile), "--measurements", str(EAGER_FULL), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["host_check"]
    assert printed["num_runs"] == 57 and set(printed["recompute_host_s"]) == {"selective", "full"}
    old = DOCS / "h100-2026-11-26" / "layer_timing.json"
    assert main([str(profile), "--measurements", str(old), "--tp", "8"]) == 0
    assert "host times measured" not in capsys.readouterr().out
