"""Predicted vs measured time of the real layer: the paper's Table 4 experiment on any device.

The prediction is the simulator's own: the op graph of `simcluster.workload.layer` for the
same layer on rank 0 of t, priced by `simcluster.costs.chunk.price_ops` with the profile.
One change makes it the experiment that was run: the measured process is one GPU playing
one rank with `ShardStandInComm`, whose collectives are local copies, so each collective
op is replaced by the copy the stand-in makes, priced as a memory-bound kernel
(`calibration.shapes.standin_ops`; all-reduce is the identity and costs nothing). Network
terms of the profile play no part. Backward includes the recompute the layer re-runs. A
timing of a modern layer (GQA, SwiGLU, RMSNorm, RoPE, flash attention) is priced from its
own `workload.LayerConfig` (`records.LayerTiming.layer_config`).

Each prediction is also split by op kind (`costs.op_kind`: GEMM, attention core,
memory-bound; and the stand-in's copies apart, `KINDS`). The timings are whole-layer
times, so the split is of the *predicted* time; `kind_summary` sets each kind's share
beside the layer errors, so a miss that grows with one kind's share points at that kind.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from simcluster import units
from simcluster.calibration.host_fit import CheckpointHost, checkpoint_regions
from simcluster.calibration.records import LayerRun, LayerTiming
from simcluster.calibration.shapes import LayerShape, standin_ops
from simcluster.config.choices import Dtype, Recompute
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.chunk import op_time_s, price_ops
from simcluster.costs.network import GroupPlacement
from simcluster.costs.op_kind import OpKind, op_kind
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module, Op

ONE_DEVICE = GroupPlacement(num_ranks=1, ranks_per_node=1)


HOST_BOUND_MARGIN = 0.05
"""A run is host-bound when issuing its ops makes it at least this much slower than its
device time: the median target (5 %), so no device-profile error is judged on a run whose
own host cost is as large as the tolerance."""


def host_pipeline_s(
    device_s: list[float], host_per_op_s: float, host_before_s: dict[int, float] | None = None
) -> float:
    """Seconds of ops run in order by a GPU as a host issues them, one every `host_per_op_s`
    plus `host_before_s[i]` more host seconds before op i: op i starts when issued and when
    op i − 1 has ended. Eager torch is this two-stage pipeline: the GPU waits wherever the
    host falls behind."""
    end_s = extra_s = 0.0
    for i, seconds in enumerate(device_s):
        extra_s += (host_before_s or {}).get(i, 0.0)
        end_s = max((i + 1) * host_per_op_s + extra_s, end_s) + seconds
    return end_s


def checkpoint_host(hw: HardwareProfile) -> CheckpointHost:
    """The host seconds torch.utils.checkpoint adds per region and per replayed op
    (`host_fit.checkpoint_host`, kept under `calibration.host_issue`); zeros where the profile
    has none."""
    issue = hw.calibration.get("host_issue", {})
    return CheckpointHost(
        units.us_to_s(float(issue.get("checkpoint_us", 0.0))),
        units.us_to_s(float(issue.get("replayed_op_us", 0.0))),
    )


def checkpoint_host_before_s(cfg: LayerConfig, p: Prediction, host: CheckpointHost) -> dict[int, float]:
    """The checkpoints' extra host seconds by the op they delay (`host_pipeline_s`): the
    regions' set-up where the backward starts (it replays them first), and each replayed op's
    own excess before that op."""
    before = {p.num_forward_ops + i: host.per_replayed_op_s for i in range(p.num_recompute_ops)}
    before[p.num_forward_ops] = (
        before.get(p.num_forward_ops, 0.0) + checkpoint_regions(cfg) * host.per_checkpoint_s
    )
    return before


STANDIN_COPY = "standin_copy"
KINDS = (OpKind.GEMM.value, OpKind.ATTENTION.value, OpKind.MEMORY_BOUND.value, STANDIN_COPY)
"""The kinds a stand-in layer's predicted time splits into: `costs.op_kind`'s, with the
stand-in's local copies (`calibration.shapes.standin_ops`) apart from the memory-bound
kernels; a 16-bit layer on one device has no FP8 cast and no communication."""


def check_kind(op: Op) -> str:
    """The kind of one priced op of a stand-in layer (`KINDS`)."""
    if op.module in (Module.STANDIN_ALL_GATHER, Module.STANDIN_REDUCE_SCATTER):  # `shapes.standin_ops`
        return STANDIN_COPY
    return op_kind(op).value


@dataclass(frozen=True)
class LayerCheck:
    """One held-out configuration: measured and predicted seconds, the prediction by kind."""

    timing: LayerTiming
    predicted_forward_s: float
    predicted_total_s: float
    host_floor_s: float = 0.0  # priced ops × the eager host cost per op (0: unknown)
    predicted_by_kind_s: dict[str, float] = field(default_factory=dict)  # forward + backward
    with_host_s: float = 0.0  # the device times issued by the host (`host_pipeline_s`); 0: unknown

    def kind_share(self, kind: str) -> float:
        """This kind's fraction of the predicted forward + backward time."""
        return self.predicted_by_kind_s.get(kind, 0.0) / self.predicted_total_s

    @property
    def host_bound(self) -> bool:
        """The host's issue time moves the layer time by at least `HOST_BOUND_MARGIN`: the
        device prices alone cannot be judged to the median target there (GPU)."""
        return self.with_host_s >= (1 + HOST_BOUND_MARGIN) * self.predicted_total_s

    @property
    def forward_error(self) -> float | None:
        """predicted / measured − 1 for the forward alone (None: not timed)."""
        if self.timing.forward_s is None:
            return None
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
    """(forward, forward + backward + recompute seconds, ops priced) of one stand-in layer
    of the paper's shape."""
    prediction = predict_config(shape.config(tp, sequence_parallel, recompute, dtype), hw)
    return prediction.forward_s, prediction.total_s, prediction.num_ops


@dataclass(frozen=True)
class Prediction:
    """One stand-in layer priced: forward, forward + backward + recompute, ops, by kind."""

    forward_s: float
    total_s: float
    num_ops: int
    by_kind_s: dict[str, float]
    op_s: list[float]  # every op's device seconds in issue order: forward, recompute, backward
    num_forward_ops: int = 0  # op_s[num_forward_ops] is the first op after the forward
    num_recompute_ops: int = 0  # then the recompute's ops, then the backward's


def predict_config(cfg: LayerConfig, hw: HardwareProfile) -> Prediction:
    """Price `cfg`'s op graph on one device with the stand-in's copies for its collectives
    (module docstring); the by-kind seconds sum to the total."""
    ops = layer_ops(cfg)
    forward, backward, recompute = (
        standin_ops(seq, cfg.tp) for seq in (ops.forward, ops.backward, ops.recompute)
    )
    fwd, bwd, rec = (
        price_ops(seq, hw, ONE_DEVICE, cfg.dtype).total_s for seq in (forward, backward, recompute)
    )
    by_kind = dict.fromkeys(KINDS, 0.0)
    op_s = []
    for op in (*forward, *recompute, *backward):
        seconds = op_time_s(op, hw, ONE_DEVICE, cfg.dtype)
        kind = check_kind(op)
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        op_s.append(seconds)
    return Prediction(fwd, fwd + bwd + rec, len(op_s), by_kind, op_s, len(forward), len(recompute))


def host_per_op_s(hw: HardwareProfile) -> float:
    """The host's seconds per priced op a check prices with: the profile's
    `compute.host_issue_us_per_op` (`calibration.host_fit`: what `costs.host` prices a run
    with), else the tiny-layer cost older calibrated profiles kept apart
    (`calibration.layer_overhead_us`), else 0 (unknown)."""
    per_op = hw.compute.host_issue_s_per_op
    if per_op is not None:
        return per_op
    return units.us_to_s(float(hw.calibration.get("layer_overhead_us", 0.0)))


def compare(run: LayerRun, hw: HardwareProfile) -> list[LayerCheck]:
    """Predict every timed configuration. Where the profile prices the host
    (`host_per_op_s`), each check also carries the host floor: ops × that cost, which a GPU
    run cannot beat however fast its kernels, and the time with the host's issue
    (`host_pipeline_s`) that marks a run host-bound."""
    overhead_s = host_per_op_s(hw)
    checkpoint = checkpoint_host(hw)
    checks = []
    for timing in run.timings:
        if timing.layer_mode is None:  # the run's mode, so every check names its own
            timing = replace(timing, layer_mode=run.layer_mode)
        cfg = timing.layer_config(run.dropout_prob)
        p = predict_config(cfg, hw)
        before = checkpoint_host_before_s(cfg, p, checkpoint)
        with_host_s = host_pipeline_s(p.op_s, overhead_s, before) if overhead_s else 0.0
        checks.append(
            LayerCheck(
                timing,
                p.forward_s,
                p.total_s,
                p.num_ops * overhead_s + sum(before.values()),
                p.by_kind_s,
                with_host_s,
            )
        )
    return checks


@dataclass(frozen=True)
class CheckSummary:
    """Error statistics over a check (|predicted / measured − 1| of forward + backward), over
    every run and over the GPU-bound ones (not `LayerCheck.host_bound`)."""

    num_runs: int
    median_abs_error: float
    max_abs_error: float
    median_error: float
    per_shape_median_abs_error: dict[str, float]
    within_10_percent: int
    num_host_bound: int = 0
    gpu_bound_median_abs_error: float | None = None  # None: every run host-bound
    gpu_bound_max_abs_error: float | None = None
    # the host-bound runs priced with the host's issue time (`LayerCheck.with_host_s`):
    # median |with_host_s / measured − 1|; None where no run is host-bound
    host_bound_with_host_median_abs_error: float | None = None
    host_bound_device_median_abs_error: float | None = None

    def meets_target(self) -> bool:
        """Issue 4's target: every run within 10 %, median within 5 %."""
        return self.max_abs_error <= 0.10 and self.median_abs_error <= 0.05

    def gpu_bound_meets_target(self) -> bool:
        """The same target over the GPU-bound runs alone."""
        median, worst = self.gpu_bound_median_abs_error, self.gpu_bound_max_abs_error
        return median is not None and worst is not None and worst <= 0.10 and median <= 0.05


def shape_label(shape: LayerShape) -> str:
    return (
        f"h={shape.hidden_size} a={shape.num_attention_heads} s={shape.seq_length} b={shape.micro_batch_size}"
    )


def run_label(timing: LayerTiming) -> str:
    """The paper grid's shape, or a modern layer's name, length, micro-batch and mode."""
    if timing.name:
        mode = timing.layer_mode or ""
        return f"{timing.name} s={timing.seq_length} b={timing.micro_batch_size} {mode}".rstrip()
    return shape_label(timing.shape)


def summarize(checks: list[LayerCheck]) -> CheckSummary:
    errors = [abs(c.error) for c in checks]
    gpu_bound = [abs(c.error) for c in checks if not c.host_bound]
    host_bound = [c for c in checks if c.host_bound]
    by_shape: dict[str, list[float]] = {}
    for c in checks:
        by_shape.setdefault(run_label(c.timing), []).append(abs(c.error))
    return CheckSummary(
        num_runs=len(checks),
        median_abs_error=statistics.median(errors),
        max_abs_error=max(errors),
        median_error=statistics.median(c.error for c in checks),
        per_shape_median_abs_error={k: statistics.median(v) for k, v in by_shape.items()},
        within_10_percent=sum(e <= 0.10 for e in errors),
        num_host_bound=sum(c.host_bound for c in checks),
        gpu_bound_median_abs_error=statistics.median(gpu_bound) if gpu_bound else None,
        gpu_bound_max_abs_error=max(gpu_bound) if gpu_bound else None,
        host_bound_with_host_median_abs_error=(
            statistics.median(abs(c.with_host_s / c.timing.total_s - 1) for c in host_bound)
            if host_bound
            else None
        ),
        host_bound_device_median_abs_error=(
            statistics.median(abs(c.error) for c in host_bound) if host_bound else None
        ),
    )


@dataclass(frozen=True)
class KindSummary:
    """One op kind over a check: its share of the predicted time, and the median signed
    layer error of the runs where it weighs more than its median share and of the rest.
    A kind priced too slow shows a larger error where it weighs more."""

    kind: str
    share_of_predicted: float  # Σ this kind's predicted seconds / Σ predicted seconds
    median_share: float
    median_error_heavy: float | None  # runs where its share is above its median share
    median_error_light: float | None  # the others


def kind_summary(checks: list[LayerCheck]) -> list[KindSummary]:
    """Each kind's share and the split errors (class docstring), in `KINDS` order."""
    total = sum(c.predicted_total_s for c in checks)
    out = []
    for kind in KINDS:
        shares = [c.kind_share(kind) for c in checks]
        middle = statistics.median(shares)
        heavy = [c.error for c, share in zip(checks, shares, strict=True) if share > middle]
        light = [c.error for c, share in zip(checks, shares, strict=True) if share <= middle]
        out.append(
            KindSummary(
                kind=kind,
                share_of_predicted=sum(c.predicted_by_kind_s.get(kind, 0.0) for c in checks) / total,
                median_share=middle,
                median_error_heavy=statistics.median(heavy) if heavy else None,
                median_error_light=statistics.median(light) if light else None,
            )
        )
    return out


def gpu_bound_kind_summary(checks: list[LayerCheck]) -> list[KindSummary] | None:
    """`kind_summary` over the GPU-bound runs alone, where some runs are host-bound and some
    are not (None otherwise): a host-bound run's error is the host's, so over all runs the
    kinds that weigh more in small layers (memory-bound) look mispriced when they are not."""
    gpu_bound = [c for c in checks if not c.host_bound]
    if not gpu_bound or len(gpu_bound) == len(checks):
        return None
    return kind_summary(gpu_bound)
