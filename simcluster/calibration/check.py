"""Predicted vs measured time of the real layer: the paper's Table 4 experiment on any device.

The prediction is the simulator's own: the op graph of `simcluster.workload.layer` for the
same layer on rank 0 of t, priced by `simcluster.costs.chunk.price_ops` with the profile.
One change makes it the experiment that was run: the measured process is one GPU playing
one rank with `ShardStandInComm`, whose collectives are local copies, so each collective
op is replaced by the copy the stand-in makes, priced as a memory-bound kernel
(`calibration.shapes.standin_ops`; all-reduce is the identity and costs nothing). Network
terms of the profile play no part. Backward includes the recompute the layer re-runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from simcluster import units
from simcluster.calibration.records import LayerRun, LayerTiming
from simcluster.calibration.shapes import LayerShape, standin_ops
from simcluster.config.choices import Dtype, Recompute
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.chunk import price_ops
from simcluster.costs.network import GroupPlacement
from simcluster.workload.layer import layer_ops

ONE_DEVICE = GroupPlacement(num_ranks=1, ranks_per_node=1)


@dataclass(frozen=True)
class LayerCheck:
    """One held-out configuration: measured and predicted seconds."""

    timing: LayerTiming
    predicted_forward_s: float
    predicted_total_s: float
    host_floor_s: float = 0.0  # priced ops × the eager host cost per op (0: unknown)

    @property
    def host_bound(self) -> bool:
        """The host needs longer to issue the ops than the device to run them (GPU)."""
        return self.host_floor_s > self.predicted_total_s

    @property
    def forward_error(self) -> float:
        """predicted / measured − 1 for the forward alone."""
        return self.predicted_forward_s / self.timing.forward_s - 1

    @property
    def error(self) -> float:
        """predicted / measured − 1 for forward + backward (the per-layer figure of merit)."""
        return self.predicted_total_s / self.timing.total_s - 1


def predict_layer_s(
    shape: LayerShape,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    hw: HardwareProfile,
    dtype: Dtype = Dtype.BF16,
) -> tuple[float, float, int]:
    """(forward, forward + backward + recompute seconds, ops priced) of one stand-in layer."""
    cfg = shape.config(tp, sequence_parallel, recompute, dtype)
    ops = layer_ops(cfg)
    phases = [standin_ops(seq, tp) for seq in (ops.forward, ops.backward, ops.recompute)]
    fwd, bwd, rec = (price_ops(seq, hw, ONE_DEVICE, dtype).total_s for seq in phases)
    return fwd, fwd + bwd + rec, sum(len(seq) for seq in phases)


def compare(run: LayerRun, hw: HardwareProfile) -> list[LayerCheck]:
    """Predict every timed configuration. Where the profile records the eager host cost
    per op (`calibration.layer_overhead_us`, from `calibrate`), each check also carries the
    host floor: ops × that cost, which a GPU run cannot beat however fast its kernels."""
    overhead_s = units.us_to_s(float(hw.calibration.get("layer_overhead_us", 0.0)))
    checks = []
    for timing in run.timings:
        fwd, total, num_ops = predict_layer_s(
            timing.shape, timing.tp, timing.sequence_parallel, Recompute(timing.recompute), hw
        )
        checks.append(LayerCheck(timing, fwd, total, num_ops * overhead_s))
    return checks


@dataclass(frozen=True)
class CheckSummary:
    """Error statistics over a check (|predicted / measured − 1| of forward + backward)."""

    num_runs: int
    median_abs_error: float
    max_abs_error: float
    median_error: float
    per_shape_median_abs_error: dict[str, float]
    within_10_percent: int
    num_host_bound: int = 0

    def meets_target(self) -> bool:
        """Issue 4's target: every run within 10 %, median within 5 %."""
        return self.max_abs_error <= 0.10 and self.median_abs_error <= 0.05


def shape_label(shape: LayerShape) -> str:
    return (
        f"h={shape.hidden_size} a={shape.num_attention_heads} s={shape.seq_length} b={shape.micro_batch_size}"
    )


def summarize(checks: list[LayerCheck]) -> CheckSummary:
    errors = [abs(c.error) for c in checks]
    by_shape: dict[str, list[float]] = {}
    for c in checks:
        by_shape.setdefault(shape_label(c.timing.shape), []).append(abs(c.error))
    return CheckSummary(
        num_runs=len(checks),
        median_abs_error=statistics.median(errors),
        max_abs_error=max(errors),
        median_error=statistics.median(c.error for c in checks),
        per_shape_median_abs_error={k: statistics.median(v) for k, v in by_shape.items()},
        within_10_percent=sum(e <= 0.10 for e in errors),
        num_host_bound=sum(c.host_bound for c in checks),
    )
