"""The host's cost of torch.utils.checkpoint (`calibration.host_fit.checkpoint_host_s`): the
microbench keeps every tiny-layer run with its checkpoint regions, the fit tells the per-op
cost from the per-checkpoint cost, and check-profile's host pipeline issues the checkpoints'
cost where the backward replays them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simcluster.calibration.check import checkpoint_host as profile_checkpoint_host
from simcluster.calibration.check import (
    checkpoint_host_before_s,
    compare,
    host_per_op_s,
    host_pipeline_s,
    predict_config,
)
from simcluster.calibration.host_fit import (
    CheckpointHost,
    checkpoint_host,
    checkpoint_regions,
    priced_ops,
    tiny_layer_per_op_s,
)
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, LayerTiming, Measurements, TinyLayerRecord
from simcluster.calibration.shapes import LayerShape, standin_ops
from simcluster.config.choices import Recompute
from simcluster.config.hardware import parse_hardware
from simcluster.config.moe_choices import RecomputeModule
from simcluster.workload.layer import layer_ops

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26"
SHAPE = LayerShape(6144, 48, 2048, 1)


@pytest.fixture(scope="module")
def meas() -> Measurements:
    return Measurements.from_json((FOLDER / "microbench.json").read_text())


def test_checkpoint_regions_are_the_torch_layers_checkpoint_calls() -> None:
    """profiler/layer/transformer.py: full wraps the layer once; selective wraps the core and,
    with `--recompute-modules mlp`, the MLP too; none wraps nothing."""
    assert checkpoint_regions(SHAPE.config(8, False, Recompute.NONE)) == 0
    assert checkpoint_regions(SHAPE.config(8, False, Recompute.FULL)) == 1
    selective = SHAPE.config(8, False, Recompute.SELECTIVE)
    assert checkpoint_regions(selective) == 1
    both = dataclasses.replace(
        selective, recompute_modules=frozenset({RecomputeModule.CORE_ATTN, RecomputeModule.MLP})
    )
    assert checkpoint_regions(both) == 2


def _with_runs(meas: Measurements, per_op_s: float, host: CheckpointHost) -> Measurements:
    """The committed file with tiny-layer runs that cost exactly per_op · ops + the
    checkpoints' `host` terms."""
    runs = []
    for tp in (1, 8):
        for sp in (False, True):
            for recompute in Recompute:
                cfg = LayerShape(64, 8, 8, 1).config(tp, sp, recompute)
                ops, cps = priced_ops(cfg), checkpoint_regions(cfg)
                replayed = len(standin_ops(layer_ops(cfg).recompute, tp))
                seconds = ops * per_op_s + cps * host.per_checkpoint_s + replayed * host.per_replayed_op_s
                runs.append(TinyLayerRecord(tp, sp, recompute.value, ops, replayed, cps, seconds))
    return dataclasses.replace(meas, tiny_layers=runs)


def test_the_fit_tells_the_checkpoint_and_the_replayed_ops_from_the_ops(meas: Measurements) -> None:
    """Selective and full recompute each run one checkpoint but replay 4 and 14-18 ops: the
    fit recovers both terms and the plain per-op cost, and the profile carries them."""
    with_runs = _with_runs(meas, 80e-6, CheckpointHost(300e-6, 150e-6))
    assert tiny_layer_per_op_s(with_runs) == pytest.approx(80e-6)
    fitted = checkpoint_host(with_runs)
    assert fitted is not None
    assert fitted.per_checkpoint_s == pytest.approx(300e-6)
    assert fitted.per_replayed_op_s == pytest.approx(150e-6)
    profile = parse_hardware(build_profile(with_runs), "x.yaml")
    assert host_per_op_s(profile) == pytest.approx(80e-6, rel=1e-4)
    kept = profile_checkpoint_host(profile)
    assert (kept.per_checkpoint_s, kept.per_replayed_op_s) == pytest.approx((300e-6, 150e-6), rel=1e-4)
    assert Measurements.from_json(with_runs.to_json()).tiny_layers == with_runs.tiny_layers


def test_a_negative_term_is_dropped_not_fitted(meas: Measurements) -> None:
    """Runs whose excess is all per replayed op, less a little per checkpoint (noise): the
    checkpoint term is held at 0 and the replayed-op term fits alone."""
    noisy = _with_runs(meas, 80e-6, CheckpointHost(-50e-6, 150e-6))
    fitted = checkpoint_host(noisy)
    assert fitted is not None and fitted.per_checkpoint_s == 0.0
    assert 100e-6 < fitted.per_replayed_op_s < 150e-6


def test_a_file_without_the_runs_has_no_checkpoint_term(meas: Measurements) -> None:
    """The committed H100 microbench kept only the median per op over all tiny runs."""
    assert meas.tiny_layers == []
    assert checkpoint_host(meas) is None
    profile = parse_hardware(build_profile(meas), "x.yaml")
    assert profile_checkpoint_host(profile) == CheckpointHost(0.0, 0.0)
    assert host_per_op_s(profile) == pytest.approx(meas.layer_overhead_s, rel=1e-4)


def test_the_pipeline_issues_the_extra_host_time_before_its_op() -> None:
    device = [1.0, 1.0, 1.0]
    assert host_pipeline_s(device, 0.5) == host_pipeline_s(device, 0.5, {1: 0.0}) == 3.5
    # op 1 is issued at 0.5 + 0.5 + 4 = 5: the GPU waits 3.5 s after op 0 (ends 1.5)
    assert host_pipeline_s(device, 0.5, {1: 4.0}) == pytest.approx(7.0)


def test_check_profile_issues_the_checkpoint_where_the_backward_starts(meas: Measurements) -> None:
    """A full-recompute run at b 1, t 8 (the GPU runs its recompute in about a forward's time)
    becomes host-bound when its replayed ops cost the host more; without recompute it does
    not move."""
    cfg_full = SHAPE.config(8, False, Recompute.FULL)
    timings = [
        LayerTiming(6144, 48, 2048, 1, 8, False, recompute.value, 2e-3, 6e-3, None, 10)
        for recompute in (Recompute.NONE, Recompute.FULL)
    ]
    run = LayerRun(meas.device, "", "cuda", "bf16", 0.1, timings)
    host = CheckpointHost(1e-3, 200e-6)
    plain = parse_hardware(build_profile(_with_runs(meas, 80e-6, CheckpointHost(0.0, 0.0))), "x.yaml")
    costly = parse_hardware(build_profile(_with_runs(meas, 80e-6, host)), "y.yaml")
    none_plain, full_plain = compare(run, plain)
    none_costly, full_costly = compare(run, costly)
    assert none_costly.with_host_s == none_plain.with_host_s
    assert none_costly.host_floor_s == none_plain.host_floor_s
    p = predict_config(cfg_full, costly)
    before = checkpoint_host_before_s(cfg_full, p, host)
    replayed = len(standin_ops(layer_ops(cfg_full).recompute, 8))
    assert p.num_recompute_ops == replayed > 0
    assert sum(before.values()) == pytest.approx(1e-3 + replayed * 200e-6)
    assert min(before) == p.num_forward_ops and max(before) == p.num_forward_ops + replayed - 1
    assert full_costly.with_host_s == pytest.approx(host_pipeline_s(p.op_s, 80e-6, before), rel=1e-6)
    assert full_costly.host_floor_s == pytest.approx(full_plain.host_floor_s + sum(before.values()), rel=1e-6)
    assert full_costly.host_bound and not full_plain.host_bound


def test_the_microbench_keeps_every_tiny_run_with_its_checkpoints() -> None:
    """On CPU (plumbing, not speed): one record per timed run, its ops as the check counts
    them and its checkpoint calls; the per-op figure is the median over the records."""
    import statistics

    import torch

    from simcluster.profiler.bench.microbench import OVERHEAD_SHAPE, layer_overhead_s

    per_op_s, runs = layer_overhead_s(torch.device("cpu"), quick=True, limit=3)
    assert [(r.tp, r.sequence_parallel, r.recompute, r.checkpoints) for r in runs] == [
        (1, False, "none", 0),
        (1, False, "selective", 1),
        (1, False, "full", 1),
    ]
    for r in runs:
        cfg = OVERHEAD_SHAPE.config(1, False, Recompute(r.recompute))
        assert r.priced_ops == priced_ops(cfg)
        assert r.replayed_ops == len(standin_ops(layer_ops(cfg).recompute, 1))
        assert r.total_s > 0
    assert per_op_s == statistics.median(r.total_s / r.priced_ops for r in runs)
