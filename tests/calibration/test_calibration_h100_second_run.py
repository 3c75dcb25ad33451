"""The second H100 script run (docs/calibration/h100-2026-11-27-script/) held against the first
machines' files and the shipped H100 profile, on CPU (docs/calibration/second_h100_run.md).

Measured data, not this machine's speed. The bounds are the committed figures with a small
margin (stated beside each), so a change of the fit, the op graph or the shipped profile that
moves a figure past its margin fails here and must be reported in second_h100_run.md.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from simcluster.calibration.check import LayerCheck, compare
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.config.hardware import HardwareProfile, load_hardware, parse_hardware
from simcluster.costs.compute import kind_efficiency

CAL = Path(__file__).resolve().parents[2] / "docs" / "calibration"
FIRST = CAL / "h100-2026-11-26"
SCRIPT_A = CAL / "h100-2026-11-26-script"
SCRIPT_B = CAL / "h100-2026-11-27-script"
MODERN_FUSED = ("modern_layers_fused.json", "modern_layers_fused_rest.json")
BIG_SITE_BYTES = 2e8  # sites above the fused forward kinds' host-bound range


def _meas(path: Path) -> Measurements:
    return Measurements.from_json(path.read_text())


def _run(path: Path) -> LayerRun:
    return LayerRun.from_json(path.read_text())


@pytest.fixture(scope="module")
def shipped() -> HardwareProfile:
    return load_hardware("h100-sxm5-80gb")


@pytest.fixture(scope="module")
def fitted() -> HardwareProfile:
    """What `simcluster calibrate --measurements <script B>/microbench.json` writes."""
    return parse_hardware(build_profile(_meas(SCRIPT_B / "microbench.json")), "h100b.yaml")


@pytest.fixture(scope="module")
def paper(fitted: HardwareProfile, shipped: HardwareProfile) -> tuple[list[LayerCheck], list[LayerCheck]]:
    run = _run(SCRIPT_B / "layer_timing_fused.json")
    return compare(run, fitted), compare(run, shipped)


@pytest.fixture(scope="module")
def modern(fitted: HardwareProfile, shipped: HardwareProfile) -> tuple[list[LayerCheck], list[LayerCheck]]:
    runs = [_run(SCRIPT_B / name) for name in MODERN_FUSED]
    return [c for r in runs for c in compare(r, fitted)], [c for r in runs for c in compare(r, shipped)]


def _gpu_bound(fit: list[LayerCheck], other: list[LayerCheck]) -> list[float]:
    """`other`'s errors on the runs the fitted profile's host term (this machine's tiny
    layers) leaves GPU-bound: one set of runs for both profiles (the shipped profile's host
    term is Megatron's issue cost, not this torch layer's)."""
    return [o.error for f, o in zip(fit, other, strict=True) if not f.host_bound]


def test_the_files_are_fused_sustained_and_complete() -> None:
    meas = _meas(SCRIPT_B / "microbench.json")
    assert meas.layer_mode == "fused" and meas.load == "sustained" and meas.warmup["settled"]
    assert len(_run(SCRIPT_B / "layer_timing_fused.json").timings) == 49
    modern = [t for name in MODERN_FUSED for t in _run(SCRIPT_B / name).timings]
    assert len(modern) == 14
    assert len({(t.layer["name"], t.shape, t.tp, t.recompute) for t in modern}) == 14  # no repeat


def test_the_sustained_gemm_ceiling_carries_over() -> None:
    """Settled heat GEMM (8192 × 4096 × 28672) 673.5 TFLOP/s at 1,335 MHz, 698 W on the second
    machine against 687.4 (30 s, measure4.py) on the first: 2.0 % apart, both at the 700 W cap."""
    warm = _meas(SCRIPT_B / "microbench.json").warmup
    first = json.loads((FIRST / "gemm_burst_vs_sustained.json").read_text())["phases"][1]["tflops_median"]
    assert warm["power_w"] == pytest.approx(700, rel=0.01)
    assert warm["settled_tflop_per_s"] == pytest.approx(first, rel=0.03)


def test_the_same_gemm_shapes_run_at_the_same_rate_on_both_script_machines() -> None:
    """122 GEMMs of at least 1 TFLOP timed on both: median time ratio 1.004."""

    def times(path: Path) -> dict[tuple, float]:
        return {(g.name, g.m, g.n, g.k, g.batch): g.seconds for g in _meas(path).gemms}

    a, b = times(SCRIPT_A / "microbench_static_rows.json"), times(SCRIPT_B / "microbench.json")
    big = [k for k in a.keys() & b.keys() if 2 * k[1] * k[2] * k[3] * k[4] >= 1e12]
    assert len(big) >= 100
    assert statistics.median(b[k] / a[k] for k in big) == pytest.approx(1.0, abs=0.01)


def _site_rates(path: Path) -> dict[str, float]:
    by_kind: dict[str, list[float]] = {}
    for e in _meas(path).elementwise:
        if e.bytes_moved >= BIG_SITE_BYTES:
            by_kind.setdefault(e.name, []).append(e.bytes_moved / e.seconds)
    return {k: statistics.median(v) for k, v in by_kind.items()}


def test_memory_bound_sites_agree_across_machines() -> None:
    """Every fused site kind above 200 MB within 5 % between the two script machines (static
    row lengths on both), but the bias-dropout-add backward (+15 %): a compiled backward is
    host-bound up to 0.45-0.8 GB in the microbench (grid_and_host.md), so its figure is the
    host's, which differs between machines."""
    a, b = _site_rates(SCRIPT_A / "microbench_static_rows.json"), _site_rates(SCRIPT_B / "microbench.json")
    assert len(a.keys() & b.keys()) >= 14
    off = {k: b[k] / a[k] - 1 for k in a.keys() & b.keys() if abs(b[k] / a[k] - 1) > 0.05}
    assert set(off) == {"bias_dropout_add.backward"}, off


def test_swiglu_runs_alike_on_both_machines_and_the_shipped_profile_prices_it_so(
    shipped: HardwareProfile,
) -> None:
    """The fused SwiGLU at Llama 3 8B's shape: 3,013 / 3,014 GB/s forward and 2,971 / 2,971
    backward on the two script machines. The shipped profile priced both at 2,248 (measure2.py's
    compiled SwiGLU, timed one synchronised call at a time: a lower bound, 25 % below both);
    it now takes the two machines' mean (`benchmarks/h100_measured.py --constants`)."""
    hbm = shipped.gpu.memory_bandwidth_gb_per_s * 1e9
    price = {
        "swiglu.forward": kind_efficiency(shipped, "swiglu") * hbm,
        "swiglu.backward": kind_efficiency(shipped, "swiglu.bwd") * hbm,
    }

    def rates(path: Path) -> dict[str, float]:
        return {
            m.name: m.bytes_moved / m.seconds
            for m in _meas(path).modern
            if m.name.startswith("swiglu") and m.layer_mode == "fused" and list(m.dims) == [8192, 28672]
        }

    a, b = rates(SCRIPT_A / "microbench.json"), rates(SCRIPT_B / "microbench.json")
    assert set(a) == set(b) == {"swiglu.forward", "swiglu.backward"}
    for name in a:
        assert b[name] == pytest.approx(a[name], rel=0.01)
        assert price[name] == pytest.approx(a[name], rel=0.01)
        assert price[name] > 1.25 * 2248e9  # the former price


def test_fused_paper_layers_reproduce_across_machines() -> None:
    """The 49 fused paper layers both script runs timed: median ratio 1.007; the 24 b 4 runs
    (GPU-bound on both) 0.99-1.04."""
    key = lambda t: (t.shape, t.tp, t.sequence_parallel, t.recompute)  # noqa: E731
    a = {key(t): t.total_s for t in _run(SCRIPT_A / "layer_timing_fused.json").timings}
    b = _run(SCRIPT_B / "layer_timing_fused.json").timings
    ratios = [t.total_s / a[key(t)] for t in b]
    b4 = [t.total_s / a[key(t)] for t in b if t.shape.micro_batch_size == 4]
    assert len(ratios) == 49 and len(b4) == 24
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.01)
    assert all(0.98 < r < 1.05 for r in b4)


def test_the_fused_llama3_8b_layer_reproduces_across_machines() -> None:
    """t 1, s 8192: 20.63 ms (script A) and 20.43 ms (script B); measure3.py's whole-layer
    torch.compile of the same layer took 22.44 ms on the first machine (second_h100_run.md)."""
    a = _run(SCRIPT_A / "modern_layers_fused.json").timings[0]
    b = _run(SCRIPT_B / "modern_layers_fused.json").timings[0]
    assert a.layer["name"] == b.layer["name"] == "llama3-8b" and a.tp == b.tp == 1
    assert b.total_s == pytest.approx(a.total_s, rel=0.02)


def test_the_calibration_loop_on_the_second_machine(paper: tuple, modern: tuple) -> None:
    """`calibrate` on this run's microbench, `check-profile` on its fused layers, GPU-bound:
    paper median 2.6 %, worst 6.3 % (30 runs); modern worst 3.6 % (7 runs). Margins: +0.5 /
    +1 point; issue 20's targets (5 % / 10 %) are wider."""
    fit_paper, _ = paper
    fit_modern, _ = modern
    p = [abs(e) for e in _gpu_bound(fit_paper, fit_paper)]
    m = [abs(e) for e in _gpu_bound(fit_modern, fit_modern)]
    assert len(p) >= 25 and len(m) >= 5  # 30 and 7 today; the host term (host_fit) sets the split
    assert statistics.median(p) <= 0.031
    assert max(p) <= 0.073
    assert max(m) <= 0.046


@pytest.mark.parametrize(
    ("microbench", "layers", "median", "worst"),
    [
        # fitted on the first script machine (static rows), checked on the second: 3.0 / 7.8 %
        (SCRIPT_A / "microbench_static_rows.json", SCRIPT_B / "layer_timing_fused.json", 0.035, 0.083),
        # fitted on the second, checked on the first script machine's 57 layers: 3.0 / 8.6 %
        (SCRIPT_B / "microbench.json", SCRIPT_A / "layer_timing_fused.json", 0.035, 0.091),
    ],
)
def test_the_calibration_loop_carries_across_machines(
    microbench: Path, layers: Path, median: float, worst: float
) -> None:
    """A profile fitted on one machine's microbench prices the other machine's fused paper
    layers (GPU-bound) as well as its own (2.6-3.3 % median): bounds = figure + 0.5 point."""
    profile = parse_hardware(build_profile(_meas(microbench)), "other.yaml")
    errors = [abs(c.error) for c in compare(_run(layers), profile) if not c.host_bound]
    assert len(errors) >= 25  # 31 and 38 today
    assert statistics.median(errors) <= median
    assert max(errors) <= worst


def test_the_shipped_profile_on_the_second_machines_fused_layers(paper: tuple, modern: tuple) -> None:
    """Out of sample (the profile is from the first machine's files): GPU-bound fused paper
    layers median 4.9 %, worst 9.0 %, fast (−4.4 %); GPU-bound fused modern layers within 10 %
    (issue 20's modern goal): worst +9.1 %, median +6.7 % before the dropout-0 bias add and the
    two machines' SwiGLU rates; worst +5.1 %, median +4.4 % after, still every one slow."""
    fit_paper, ship_paper = paper
    fit_modern, ship_modern = modern
    p, m = _gpu_bound(fit_paper, ship_paper), _gpu_bound(fit_modern, ship_modern)
    assert statistics.median(abs(e) for e in p) <= 0.055
    assert max(abs(e) for e in p) <= 0.10
    assert statistics.median(p) < 0
    assert max(abs(e) for e in m) <= 0.06
    assert min(m) > 0 and statistics.median(m) > 0.04  # the t = 1 and b 2 rows 4.4-5.1 % slow: not hidden


@pytest.mark.xfail(
    strict=True,
    reason="issue 20's goal 'the shipped H100 profile within 5 % of each compiled layer' is met "
    "against measure3.py's compiled layers (first machine: -4.3 / +1.7 / +0.0 %) and all but one "
    "of the fused modern layers of the script machines: Llama 3 8B t 1 +5.1 % (b 2 t 2 +4.9 %, "
    "GPT-3 175B flash t 1 +4.8 %, Llama 3 70B t 1 / t 4 +4.4 %); in-layer GEMMs run 3-4 % above "
    "the GEMM-only sustained rate (docs/calibration/h100_apportioning.md)",
)
def test_the_shipped_profile_within_5_percent_of_each_fused_modern_layer(modern: tuple) -> None:
    fit_modern, ship_modern = modern
    assert max(abs(e) for e in _gpu_bound(fit_modern, ship_modern)) <= 0.05


def test_the_report_script_runs() -> None:
    """docs/calibration/second_h100_run.py, whose output second_h100_run.md quotes."""
    spec = importlib.util.spec_from_file_location("second_h100_run", CAL / "second_h100_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.paper_layers_across_machines()["common"] == 49
    rows = {row["layer"]: row for row in module.compiled_t1()}
    assert set(rows) == {"llama3-8b", "llama3-70b", "gpt3-175b-flash"}
    # the three t = 1 fused layers of script B run faster than measure3.py's compiled ones
    assert all(row["script_b_fused_s"] < row["measure3_compiled_s"] for row in rows.values())
