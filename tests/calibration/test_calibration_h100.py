"""The fit against the committed H100 measurements (docs/calibration/h100-2026-11-26/).

A test of the fit on measured data, not of this machine's speed: the profile is fitted to
`microbench.json` alone and checked against `layer_timing.json` (96 held-out eager runs of
the real layer) and the modern layers, on CPU, without torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simcluster.calibration.check import (
    KINDS,
    LayerCheck,
    compare,
    gpu_bound_kind_summary,
    host_pipeline_s,
    kind_summary,
    summarize,
)
from simcluster.calibration.fit import best_gemm_tflop_per_s, copy_gb_per_s
from simcluster.calibration.host_fit import checkpoint_host
from simcluster.calibration.measured_layers import measured_layer_run
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.calibration.report import format_summary, to_json
from simcluster.cli import app
from simcluster.config.hardware import HardwareProfile, parse_hardware
from simcluster.costs.compute import gemm_time_s, measured_gemm_flop_per_s
from simcluster.workload.ops import GemmShape

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26"


@pytest.fixture(scope="module")
def meas() -> Measurements:
    return Measurements.from_json((FOLDER / "microbench.json").read_text())


@pytest.fixture(scope="module")
def fitted(meas: Measurements) -> HardwareProfile:
    return parse_hardware(build_profile(meas), "h100-fitted.yaml")


@pytest.fixture(scope="module")
def paper_run() -> LayerRun:
    return LayerRun.from_json((FOLDER / "layer_timing.json").read_text())


@pytest.fixture(scope="module")
def paper_checks(fitted: HardwareProfile, paper_run: LayerRun) -> list[LayerCheck]:
    return compare(paper_run, fitted)


def test_the_ceiling_is_the_best_gemm_measured(meas: Measurements, fitted: HardwareProfile) -> None:
    """807 TFLOP/s (FLOPs / median time of the fastest GEMM in the file), not the 989 datasheet
    peak the launch-subtracted rate of a tiny GEMM reached before."""
    best = max(g.flops / g.seconds for g in [*meas.gemms, meas.peak_gemm]) / 1e12
    assert best == pytest.approx(807, abs=1)
    assert best_gemm_tflop_per_s(meas) == pytest.approx(best)
    assert fitted.compute.gemm_max_efficiency * fitted.gpu.peak_bf16_tflop_per_s == pytest.approx(
        best, rel=1e-3
    )


def test_a_measured_gemm_comes_back_at_its_measured_time(meas: Measurements, fitted: HardwareProfile) -> None:
    """Every shape measured once: launch + FLOPs / fitted rate == its median time."""
    counts: dict[tuple[int, int, int, int], int] = {}
    for g in meas.gemms:
        counts[(g.m, g.n, g.k, g.batch)] = counts.get((g.m, g.n, g.k, g.batch), 0) + 1
    single = [g for g in meas.gemms if counts[(g.m, g.n, g.k, g.batch)] == 1]
    assert len(single) > 100
    for g in single:
        assert gemm_time_s(GemmShape(g.m, g.n, g.k, g.batch), fitted) == pytest.approx(g.seconds, rel=2e-3)


UNMEASURED = [
    GemmShape(2048, 2048, 128, 40),  # attn.qk, h 10240 t 8 b 4: 40 heads of 128
    GemmShape(2048, 96, 2048, 256),  # attn.av, h 6144 t 1 b 4: head dim 96
    GemmShape(8192, 18432, 6144, 1),  # attn.qkv, h 6144 t 1, 8192 tokens
    GemmShape(65536, 65536, 16, 1),  # far outside: skinny, memory-bound
    GemmShape(100_000, 100_000, 100_000, 1),  # far outside: huge
    GemmShape(64, 64, 64, 4096),  # far outside: tiny batched
]


@pytest.mark.parametrize("shape", UNMEASURED)
def test_an_unmeasured_gemm_never_beats_the_measured_roofline(
    shape: GemmShape, meas: Measurements, fitted: HardwareProfile
) -> None:
    """Rate ≤ best measured GEMM, time ≥ launch + bytes / measured copy bandwidth."""
    best_flop_per_s = best_gemm_tflop_per_s(meas) * 1e12
    copy_bytes_per_s = copy_gb_per_s(meas) * 1e9
    assert measured_gemm_flop_per_s(shape, fitted) <= best_flop_per_s * (1 + 1e-3)
    roofline_s = max(shape.flops / best_flop_per_s, shape.bytes_moved(2) / copy_bytes_per_s)
    assert gemm_time_s(shape, fitted) >= fitted.kernel_launch_s + roofline_s * (1 - 1e-3)


def test_an_attention_bmm_between_measured_batches_gets_their_rate(
    meas: Measurements, fitted: HardwareProfile
) -> None:
    """attn.qk at 40 heads lies between the measured 32 and 48 (≈ 290-300 TFLOP/s), not at the
    88 TFLOP/s the eager element-wise curve's 'memory roofline' gave it."""
    rates = {
        g.batch: g.flops / g.seconds
        for g in meas.gemms
        if g.name == "bmm_qk" and (g.m, g.n, g.k) == (2048, 2048, 128) and g.batch in (32, 48)
    }
    shape = GemmShape(2048, 2048, 128, 40)
    rate = shape.flops / (gemm_time_s(shape, fitted) - fitted.kernel_launch_s)
    assert 0.9 * min(rates.values()) <= rate <= 1.1 * max(rates.values())


def test_the_profile_says_which_shapes_were_measured(meas: Measurements, fitted: HardwareProfile) -> None:
    grid = fitted.calibration["measured_grid"]
    assert grid["gemm"]["m"] == [min(g.m for g in meas.gemms), max(g.m for g in meas.gemms)]
    assert grid["gemm"]["batch"] == [1, 192]
    assert grid["attention_seq_lengths"] == [512, 16384]
    softmax = [e.bytes_moved for e in meas.elementwise if e.op == "attn.softmax.bwd"]
    assert grid["memory_bound_bytes"]["softmax.bwd"] == [
        pytest.approx(min(softmax), rel=1e-3),
        pytest.approx(max(softmax), rel=1e-3),
    ]


def test_the_fit_predicts_the_held_out_eager_layer(paper_checks: list[LayerCheck]) -> None:
    """96 held-out runs: the median within 5 % (issue 20's goal: 4.3 % with the device
    envelope, `calibration.device_envelope`; 4.9 % before it, 5.1 % before the attention GEMMs
    at head dim 96 were held within their measured neighbours; at first 26.6 % median, 52 %
    worst, every run too slow), and every GPU-bound run within 10 % but one: h 10240, b 1,
    t 8, SP off, full recompute, 10.6 % fast (8.4 % before the envelope priced the eager
    backward sites' device time instead of their host time), a run the host limits
    (`test_the_one_run_over_ten_percent_is_limited_by_the_host`). The host-bound runs
    (h 6144, b 1, t 8: eager issue time, not kernels) are counted apart."""
    summary = summarize(paper_checks)
    assert summary.num_runs == 96
    assert summary.num_host_bound <= 8
    assert summary.gpu_bound_max_abs_error is not None and summary.gpu_bound_median_abs_error is not None
    over = [c.timing for c in paper_checks if not c.host_bound and abs(c.error) > 0.10]
    assert [(t.hidden_size, t.micro_batch_size, t.tp, t.sequence_parallel, t.recompute) for t in over] == [
        (10240, 1, 8, False, "full")
    ]
    assert summary.gpu_bound_max_abs_error <= 0.11
    assert summary.gpu_bound_median_abs_error <= 0.05
    assert summary.median_abs_error <= 0.05


def test_the_one_run_over_ten_percent_is_limited_by_the_host(paper_run: LayerRun, meas: Measurements) -> None:
    """Full recompute re-runs the forward once, so on the device it costs one forward more
    than no recompute: so it measures in every b 4 run (within 3 % of a forward) and every
    t 1-4 run. At b 1, t 8 the eager host issues the recompute and the backward more slowly
    than the GPU runs them, and the measured difference exceeds a forward by 0.6-1.5 ms: in the
    runs marked host-bound (h 6144) and at h 10240, whose SP-off run is the one the device
    prices more than 10 % fast (the op graph prices exactly one forward more). The excess is
    the host's: full minus none is 3.60 ms at h 6144 and 3.69 ms at h 10240, whose forwards
    differ by 1.7x on the device. This file's harness found the bias-dropout-add mask rows
    with a Python loop in every call (2,048 rows with SP off, 256 with SP on at t 8), since
    removed (`profiler/layer/transformer.py`, `_dropout_runs`): timed without it on the second
    H100 (docs/calibration/h100-2026-11-27-script/layer_timing_eager_full.json), full minus
    none is one forward at this layout (SP off and on) and the run is priced within 5 %
    (test_calibration_h100_eager_full.py). The run stays the named exception of this file,
    whose measurements keep the loop; the committed microbench kept only the tiny layers'
    median, so its profile has no checkpoint term either. (A size-independent host term,
    overlapped with the GPU, cannot explain it: the h 6144 run issues the same calls
    host-bound in 7.88 ms; test_calibration_host_timeline.py.)"""
    assert checkpoint_host(meas) is None
    runs = {
        (t.hidden_size, t.micro_batch_size, t.tp, t.sequence_parallel, t.recompute): t
        for t in paper_run.timings
    }

    def extra(key: tuple[int, int, int, bool]) -> float:
        full, none = runs[(*key, "full")], runs[(*key, "none")]
        assert full.forward_s is not None
        return (full.total_s - none.total_s - full.forward_s) / full.forward_s

    device_bound = [key[:4] for key in runs if key[4] == "full" and (key[1] == 4 or key[2] <= 4)]
    assert len(device_bound) == 28 and all(abs(extra(k)) < 0.09 for k in device_bound)
    assert extra((10240, 1, 8, False)) > 0.6 and extra((6144, 1, 8, False)) > 0.2

    def excess_s(hidden: int) -> float:
        return runs[(hidden, 1, 8, False, "full")].total_s - runs[(hidden, 1, 8, False, "none")].total_s

    assert excess_s(10240) == pytest.approx(excess_s(6144), rel=0.05)


def test_the_split_by_kind_sums_to_the_prediction(paper_checks: list[LayerCheck]) -> None:
    for check in paper_checks:
        assert math.fsum(check.predicted_by_kind_s.values()) == pytest.approx(
            check.predicted_total_s, rel=1e-9
        )
    shares = [k.share_of_predicted for k in kind_summary(paper_checks)]
    assert math.fsum(shares) == pytest.approx(1.0)


def test_t1_has_no_standin_copy_and_sp_does(paper_checks: list[LayerCheck]) -> None:
    """One GPU at t = 1 makes no stand-in copy; with SP at t = 8 it copies for its all-gathers."""
    by_tp = {(c.timing.tp, c.timing.sequence_parallel): c for c in paper_checks}
    assert by_tp[(1, False)].predicted_by_kind_s["standin_copy"] == 0
    assert by_tp[(8, True)].predicted_by_kind_s["standin_copy"] > 0


def test_the_committed_modern_records_are_what_the_converter_writes() -> None:
    """modern_layer_timing.json == measured_layer_run(the folder): reproducible by its command."""
    committed = json.loads((FOLDER / "modern_layer_timing.json").read_text())
    assert committed == json.loads(measured_layer_run(FOLDER).to_json())


def test_the_modern_records_are_the_measured_layers() -> None:
    """12 eager layers (measure.py) + 3 layers eager and torch.compile'd (fused) at t = 1
    (measure3.py)."""
    run = measured_layer_run(FOLDER)
    modes = [t.layer_mode for t in run.timings]
    assert (modes.count("eager"), modes.count("fused")) == (15, 3)
    llama = next(t for t in run.timings if t.name == "llama3-8b" and t.layer_mode == "fused")
    cfg = llama.layer_config(run.dropout_prob)
    assert (cfg.num_query_groups, cfg.activation.value, cfg.normalization.value) == (8, "swiglu", "rmsnorm")
    assert (cfg.position_embedding.value, cfg.attention_backend.value, cfg.hidden_dropout) == (
        "rope",
        "flash",
        0.0,
    )
    assert llama.total_s == pytest.approx(0.02244, rel=1e-3) and llama.forward_s is None
    paper = next(t for t in run.timings if t.name == "gpt3-175b-paper")
    assert paper.is_paper_layer and paper.layer_config(0.0).hidden_dropout == 0.1
    assert not llama.is_paper_layer


def test_a_layer_key_that_is_no_layer_config_field_is_refused() -> None:
    timing = measured_layer_run(FOLDER).timings[0]
    bad = dataclasses.replace(timing, layer={**(timing.layer or {}), "swiglu": True})
    with pytest.raises(ValueError, match="swiglu"):
        bad.layer_config(0.0)


def test_modern_layers_are_checked_by_kind(fitted: HardwareProfile) -> None:
    """Flash layers put their attention in the attention kind and price no unfused BMM; the
    GEMM-bound GPT-3 175B flash shards (eager t 1, 4, 8 and compiled t 1) come within 10 %
    of the fitted profile (the Llama layers do not: their eager RMSNorm / RoPE / SwiGLU kinds
    are not in microbench.json, docs/calibration/README.md)."""
    run = measured_layer_run(FOLDER)
    checks = compare(run, fitted)
    flash = [c for c in checks if (c.timing.layer or {}).get("attention_backend") == "flash"]
    assert flash and all(c.predicted_by_kind_s["attention"] > 0 for c in flash)
    assert all(c.predicted_by_kind_s["gemm"] > 0 for c in flash)
    gpt3 = [c for c in checks if c.timing.name == "gpt3-175b-flash"]
    assert len(gpt3) == 4
    assert max(abs(c.error) for c in gpt3) <= 0.10


def test_the_host_pipeline_waits_for_the_slower_stage() -> None:
    """Host 1 s per op, GPU ops of 3, 0.5, 0.5 s: starts at 1, 4, 4.5 -> ends at 5; a host
    slower than every op (2 s per op) ends at 3 · 2 + 0.5."""
    assert host_pipeline_s([3.0, 0.5, 0.5], 1.0) == pytest.approx(5.0)
    assert host_pipeline_s([0.5, 0.5, 0.5], 2.0) == pytest.approx(6.5)
    assert host_pipeline_s([3.0, 0.5, 0.5], 0.0) == pytest.approx(4.0)


def test_check_profile_prints_the_split_by_kind_as_json(tmp_path: Path) -> None:
    """--json: a summary, one row per kind in KINDS order and one row per run whose kinds sum
    to its prediction; the CSV gets a column per kind."""
    result = CliRunner().invoke(
        app,
        [
            "check-profile",
            "h100-sxm5-80gb",
            "--measurements",
            str(FOLDER / "modern_layer_timing.json"),
            "--out-dir",
            str(tmp_path),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [k["kind"] for k in data["by_kind"]] == list(KINDS)
    assert data["summary"]["num_runs"] == len(data["runs"]) == 18
    for row in data["runs"]:
        assert math.fsum(row["predicted_by_kind_s"].values()) == pytest.approx(row["predicted_total_s"])
        assert row["total_error"] == pytest.approx(row["predicted_total_s"] / row["total_s"] - 1)
    header = (tmp_path / "h100-sxm5-80gb-cuda.csv").read_text().splitlines()[0].split(",")
    assert {f"predicted_{kind}_ms" for kind in KINDS} <= set(header)


def test_the_by_kind_split_is_also_given_over_the_gpu_bound_runs(
    paper_checks: list[LayerCheck], paper_run: LayerRun
) -> None:
    """Host-bound runs miss by the host's time, not their kinds': with both kinds of run, the
    split is repeated over the GPU-bound ones (text, markdown and JSON); with one kind only,
    it is not repeated."""
    gpu = [c for c in paper_checks if not c.host_bound]
    host = [c for c in paper_checks if c.host_bound]
    assert gpu and host  # the committed eager paper grid has both under its fitted host term
    assert gpu_bound_kind_summary(paper_checks) == kind_summary(gpu)
    assert gpu_bound_kind_summary(paper_checks) != kind_summary(paper_checks)
    assert gpu_bound_kind_summary(gpu) is None and gpu_bound_kind_summary(host) is None
    text = format_summary(
        summarize(paper_checks), kind_summary(paper_checks), gpu_bound_kind_summary(paper_checks)
    )
    assert f"by kind, the {len(gpu)} GPU-bound runs alone" in text
    doc = to_json(paper_checks, paper_run, "fitted")
    assert [k["kind"] for k in doc["by_kind_gpu_bound"]] == list(KINDS)
    assert doc["by_kind_gpu_bound"][0]["share_of_predicted"] == pytest.approx(
        kind_summary(gpu)[0].share_of_predicted
    )
    assert to_json(gpu, paper_run, "fitted")["by_kind_gpu_bound"] is None
