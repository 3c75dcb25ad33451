"""The host's issue time per op: what `compute.host_issue_us_per_op` means and how
`calibrate` fits it.

One definition, the one `costs.host` prices with: host seconds to issue one *priced op* of
the op graph (`workload.ops.Op`, one kernel or collective; `costs.host.kernels_issued`). For
the one-process layers calibrate and check-profile time, the priced ops are those of the
stand-in layer (`shapes.standin_ops` of forward, recompute and backward: an all-reduce is
the identity and issues nothing), as `check.predict_config` counts them.

It is the host cost of the layer that was measured (this project's torch layer, in the
measured `layer_mode`: eager, or fused with torch.compile'd regions, whose compiled calls
cost more host time per op than eager kernels), not of Megatron-core / Transformer Engine,
which issue their fused kernels with less Python per op (the shipped profiles' 42.3 µs per
kernel is that declared assumption). Two measurements give it:

- `tiny_layer_per_op_s`: what every calibrate run measures (`Measurements.layer_overhead_s`):
  layers too small for their kernels to matter (h 64, s 8, t 1 and 8, SP off / on, every
  recompute), forward + backward over their priced ops. The GPU waits for the host
  throughout, so the device time is the host's.
- `host_graph_per_op_s`: the host's wall time to issue whole layers (`profiler.bench.host_graph`:
  perf_counter around forward + backward) over their priced ops, median over the cases that
  are host-bound (eager time at least (1 + `HOST_BOUND_MARGIN`) × the CUDA-graph replay's):
  in a GPU-bound case the host's wall time also holds its waits on the GPU (the caching
  allocator, a full launch queue), which are not issue time (the committed H100 Llama 3 8B
  t 1: 323 µs per op against 104-168 in the host-bound cases).

The torch layer's recompute is `torch.utils.checkpoint(use_reentrant=False)`, one call per
checkpointed region (`checkpoint_regions`), and it costs the host more than the ops it runs:
each call sets up a frame and saved-tensor hooks, and in backward the first unpack replays
the region under recomputation hooks (the RNG state restored; a Python pack hook per
recomputed tensor, an unpack hook per saved one), so a replayed op costs more than its first
run. The host's cost of a layer is then

    priced_ops · per_op + checkpoints · per_checkpoint + replayed_ops · per_replayed_op

and the microbench's tiny layers, timed at every recompute and kept run by run
(`records.TinyLayerRecord`), measure all three (`CheckpointHost`, `checkpoint_host`):
`per_op` from the runs without a checkpoint, the other two by least squares of the other
runs' excess over `priced_ops · per_op` (selective and full recompute replay different
numbers of ops through one checkpoint each, which tells them apart). Files written before the
runs were kept hold only the median per op over every tiny run (the checkpoints' cost spread
over all ops); they give no checkpoint terms.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from simcluster.calibration.named_layers import NAMED_LAYERS, dropout_of
from simcluster.calibration.records import Measurements
from simcluster.calibration.shapes import standin_ops
from simcluster.config.choices import Recompute
from simcluster.config.moe_choices import RecomputeModule
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig

HOST_BOUND_MARGIN = 0.05  # as `check.HOST_BOUND_MARGIN`: eager ≥ 1.05 × graph replay is host-bound


@dataclass(frozen=True)
class HostCase:
    """One host_graph.json case: its priced ops and the host's seconds per op."""

    name: str
    tp: int
    priced_ops: int
    host_issue_s: float
    eager_s: float
    graph_s: float | None

    @property
    def per_op_s(self) -> float:
        return self.host_issue_s / self.priced_ops

    @property
    def host_bound(self) -> bool:
        """The GPU waited for the host: eager ≥ (1 + margin) × the CUDA-graph replay."""
        return self.graph_s is not None and self.eager_s >= (1 + HOST_BOUND_MARGIN) * self.graph_s


def priced_ops(cfg: LayerConfig) -> int:
    """Ops the stand-in layer issues for one forward + backward (with its recompute)."""
    ops = layer_ops(cfg)
    return sum(len(standin_ops(seq, cfg.tp)) for seq in (ops.forward, ops.recompute, ops.backward))


def case_config(row: dict[str, Any]) -> LayerConfig:
    """The LayerConfig of a host_graph.json row: its `layer` fields, or (files written before
    rows carried them) those of its named layer (`named_layers.NAMED_LAYERS`). Raises
    ValueError naming the row for a name it does not know."""
    model = row.get("layer") or NAMED_LAYERS.get(row["name"])
    if model is None:
        known = ", ".join(sorted(NAMED_LAYERS))
        raise ValueError(
            f"host_graph case {row['name']!r}: no 'layer' fields and not a named layer ({known})"
        )
    dropout = dropout_of(model)
    return LayerConfig(
        seq_length=row["seq_length"],
        micro_batch_size=row.get("micro_batch_size", 1),
        tp=row["tp"],
        sequence_parallel=row["sequence_parallel"],
        recompute=Recompute(row.get("recompute", "none")),
        hidden_dropout=dropout,
        attention_dropout=dropout,
        **model,
    )


def host_cases(doc: dict[str, Any]) -> list[HostCase]:
    """Every case of a host_graph.json document."""
    return [
        HostCase(
            row["name"],
            row["tp"],
            priced_ops(case_config(row)),
            row["host_issue_s"],
            row["eager_s"],
            row.get("graph_s"),
        )
        for row in doc["cases"]
    ]


def host_graph_per_op_s(doc: dict[str, Any]) -> float:
    """Median host seconds per priced op over the host-bound cases (module docstring).
    Raises ValueError when no case is host-bound (a CPU file: no graph replay)."""
    bound = [c.per_op_s for c in host_cases(doc) if c.host_bound]
    if not bound:
        raise ValueError(
            "host_graph: no host-bound case (eager ≥ 1.05 × CUDA-graph replay) to fit the host from"
        )
    return statistics.median(bound)


def checkpoint_regions(cfg: LayerConfig) -> int:
    """torch.utils.checkpoint calls the torch layer makes for `cfg` (profiler/layer/
    transformer.py): the whole layer under full recompute, else one per checkpointed module
    of selective recompute (the attention core, the MLP)."""
    if cfg.recompute is Recompute.FULL:
        return 1
    return sum(cfg.recomputes(m) for m in (RecomputeModule.CORE_ATTN, RecomputeModule.MLP))


def tiny_layer_per_op_s(meas: Measurements) -> float:
    """Host seconds per priced op of the tiny layers the microbench timed (module docstring):
    the median over the runs without a checkpoint where the runs were kept, else the file's
    median over every run."""
    plain = [r.total_s / r.priced_ops for r in meas.tiny_layers if r.checkpoints == 0]
    return statistics.median(plain) if plain else meas.layer_overhead_s


@dataclass(frozen=True)
class CheckpointHost:
    """Host seconds torch.utils.checkpoint adds beyond the ops' own cost (module docstring)."""

    per_checkpoint_s: float
    per_replayed_op_s: float


def checkpoint_host(meas: Measurements) -> CheckpointHost | None:
    """Least squares (each term ≥ 0) of the tiny runs' excess over `priced_ops · per_op`
    (`tiny_layer_per_op_s`) on their checkpoints and replayed ops; None where the runs were
    not kept (older files) or none ran without, or none with, a checkpoint."""
    per_op = tiny_layer_per_op_s(meas)
    rows = [
        (float(r.checkpoints), float(r.replayed_ops), r.total_s - r.priced_ops * per_op)
        for r in meas.tiny_layers
        if r.checkpoints > 0
    ]
    if not rows or not any(r.checkpoints == 0 for r in meas.tiny_layers):
        return None
    kk = sum(k * k for k, _, _ in rows)
    rr = sum(r * r for _, r, _ in rows)
    kr = sum(k * r for k, r, _ in rows)
    ke = sum(k * e for k, _, e in rows)
    re = sum(r * e for _, r, e in rows)
    det = kk * rr - kr * kr
    if det > 1e-12 * kk * rr:
        per_checkpoint, per_replayed = (ke * rr - re * kr) / det, (re * kk - ke * kr) / det
        if per_checkpoint >= 0 and per_replayed >= 0:
            return CheckpointHost(per_checkpoint, per_replayed)
    # one term alone (the other ≥ 0 failed, or the runs cannot tell them apart): the better fit
    alone = [CheckpointHost(max(0.0, ke / kk), 0.0), CheckpointHost(0.0, max(0.0, re / rr) if rr else 0.0)]
    return min(
        alone,
        key=lambda h: sum((e - k * h.per_checkpoint_s - r * h.per_replayed_op_s) ** 2 for k, r, e in rows),
    )


def host_section(meas: Measurements, host_graph: dict[str, Any] | None) -> tuple[float, str, dict[str, Any]]:
    """(host_issue_us_per_op, its source, the detail kept under `calibration:`) for a GPU
    profile: from `host_graph` where given, else the tiny layers."""
    where = f"{meas.device.name}, {meas.device.date}, layer_mode {meas.layer_mode}"
    tiny_us = tiny_layer_per_op_s(meas) * 1e6
    detail: dict[str, Any] = {"tiny_layer_us_per_op": round(tiny_us, 2)}
    checkpoint = checkpoint_host(meas)
    if checkpoint is not None:  # read by check.checkpoint_host
        detail["checkpoint_us"] = round(checkpoint.per_checkpoint_s * 1e6, 2)
        detail["replayed_op_us"] = round(checkpoint.per_replayed_op_s * 1e6, 2)
    if host_graph is None:
        source = (
            "host seconds per priced op of this torch layer (simcluster.calibration.host_fit): "
            "tiny layers (h 64, s 8) forward + backward over their stand-in ops, the GPU waiting "
            f"for the host throughout ({where}); not Megatron's own per-kernel cost"
        )
        return round(tiny_us, 2), source, detail
    cases = host_cases(host_graph)
    per_op_us = host_graph_per_op_s(host_graph) * 1e6
    detail["host_graph_cases"] = [
        {"name": c.name, "tp": c.tp, "priced_ops": c.priced_ops, "us_per_op": round(c.per_op_s * 1e6, 2),
         "host_bound": c.host_bound}
        for c in cases
    ]  # fmt: skip
    mode = host_graph.get("layer_mode", meas.layer_mode)
    source = (
        "host seconds per priced op of this torch layer (simcluster.calibration.host_fit): the host's "
        "wall time to issue whole layers (simcluster.profiler.bench.host_graph, layer_mode "
        f"{mode}) over their stand-in ops, median over the {sum(c.host_bound for c in cases)} "
        f"host-bound cases ({host_graph.get('device', {}).get('name', meas.device.name)}); not "
        "Megatron's own per-kernel cost"
    )
    return round(per_op_us, 2), source, detail
