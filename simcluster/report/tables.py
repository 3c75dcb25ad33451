"""Text tables for people: a run's summary and the validation table."""

from __future__ import annotations

from collections.abc import Sequence

from simcluster import units
from simcluster.results import SimulationResult, StageMemory


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned first column, right-aligned others."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _gb(num_bytes: float) -> str:
    return f"{units.bytes_to_gb(num_bytes):.1f}"


def format_result(result: SimulationResult) -> str:
    t = result.iteration_time_s
    summary = format_table(
        ["metric", "value"],
        [
            ["scenario", result.scenario],
            ["hardware", result.hardware],
            ["GPUs", result.num_gpus],
            ["iteration time", f"{t:.3f} s"],
            ["MFU", f"{100 * result.mfu:.1f} %"],
            ["HFU", f"{100 * result.hfu:.1f} %"],
            ["model TFLOP/s per GPU", f"{result.tflops_per_gpu:.1f}"],
            ["tokens/s per GPU", f"{result.tokens_per_s_per_gpu:,.0f}"],
            ["pipeline idle (bubble share)", f"{100 * result.pipeline_idle_fraction:.1f} %"],
            ["bubble / busy time", f"{result.bubble_to_busy_ratio:.3f}"],
            [
                "layer forward / backward",
                f"{1e3 * result.layer.forward_s:.2f} / {1e3 * result.layer.backward_s:.2f} ms",
            ],
        ],
    )
    breakdown = format_table(
        ["time (mean stage)", "s", "share"],
        [[k, f"{v:.3f}", f"{100 * v / t:.1f} %"] for k, v in result.time_breakdown_s.items()],
    )
    memory = stage_memory_table(_stages_to_show(result))
    return "\n\n".join([summary, breakdown, memory])


def _stages_to_show(result: SimulationResult, limit: int = 8):
    """Every stage for short pipelines; otherwise the first, the last and the fullest."""
    stages = list(result.stages)
    if len(stages) <= limit:
        return stages
    fullest = max(stages, key=lambda s: s.peak_memory_bytes)
    picked = {stages[0].stage: stages[0], fullest.stage: fullest, stages[-1].stage: stages[-1]}
    return [picked[k] for k in sorted(picked)]


def format_summary(results: Sequence[SimulationResult]) -> str:
    """One line per scenario, for `simcluster run FOLDER`."""
    return format_table(
        ["scenario", "GPUs", "iteration s", "MFU %", "HFU %", "idle %", "peak GB (stage 0)", "fits"],
        [
            [
                r.scenario,
                r.num_gpus,
                f"{r.iteration_time_s:.3f}",
                f"{100 * r.mfu:.1f}",
                f"{100 * r.hfu:.1f}",
                f"{100 * r.pipeline_idle_fraction:.1f}",
                _gb(r.stages[0].peak_memory_bytes),
                "yes" if r.fits_in_memory else "NO",
            ]
            for r in results
        ],
    )


def _layers_per_stage(report) -> object:
    """The layer count when every stage has the same; else each stage's (uneven splits)."""
    counts = tuple(report.stage_num_layers) or (report.layers_per_stage,)
    return counts[0] if len(set(counts)) == 1 else " ".join(str(n) for n in counts)


def format_memory_report(report) -> str:
    """`simcluster memory`: the per-layer model, then every stage's peak."""
    head = format_table(
        ["memory model", "value"],
        [
            ["scenario", report.scenario],
            ["Table 2 row", report.table2_row],
            ["activations per layer (rank)", f"{report.predicted_bytes_per_layer / 1e6:,.1f} MB"],
            ["layers per stage", _layers_per_stage(report)],
            ["interleave factor 1 + (p-1)/(p·m)", f"{report.interleave_factor:.4f}"],
            ["embedding dropout mask / microbatch", f"{report.embedding_bytes_per_microbatch / 1e6:,.1f} MB"],
            [
                "output layer (LN, input, fp32 logits) / microbatch",
                f"{report.output_bytes_per_microbatch / 1e6:,.1f} MB",
            ],
            ["recompute workspace (one layer)", f"{report.transient_bytes / 1e6:,.1f} MB"],
        ],
    )
    stages = stage_memory_table(report.stages)
    return head + "\n\n" + stages


def stage_memory_table(stages: Sequence[StageMemory]) -> str:
    """One row per stage: static parts, activations, transient, peak, fits."""
    return format_table(
        [
            "stage",
            "weights GB",
            "grads GB",
            "optimizer GB",
            "activations GB",
            "transient GB",
            "peak GB",
            "fits",
        ],
        [
            [
                s.stage,
                _gb(s.weight_bytes),
                _gb(s.gradient_bytes),
                _gb(s.optimizer_bytes),
                _gb(s.activation_bytes),
                _gb(s.transient_bytes),
                _gb(s.peak_memory_bytes),
                "yes" if s.fits else f"NO (> {_gb(s.capacity_bytes)})",
            ]
            for s in stages
        ],
    )


_KIND_LABELS = {
    "gemm": "GEMM",
    "attention": "attention",
    "memory_bound": "memory-bound",
    "fp8_cast": "FP8 casts",
    "tp_comm": "TP comm (exposed)",
    "cp_comm": "CP comm (exposed)",
    "pp_comm": "PP comm (exposed)",
    "dp_comm": "DP comm (exposed)",
    "optimizer": "optimizer",
    "embedding_and_loss": "embedding and loss",
    "host_wait": "host-bound wait",
    "pipeline_idle": "pipeline idle",
}


def format_time_by_kind(result: SimulationResult) -> str:
    """Where the time goes: the mean stage's step and one layer (forward + backward per
    microbatch) by kind of work, each with its share (`costs.breakdown`)."""
    step, layer = result.time_by_kind_s, result.layer_time_by_kind_s
    step_total, layer_total = sum(step.values()) or 1.0, sum(layer.values()) or 1.0
    rows = []
    for kind, seconds in step.items():
        in_layer = kind in layer
        rows.append(
            [
                _KIND_LABELS.get(kind, kind),
                f"{seconds:.3f}",
                f"{100 * seconds / step_total:.1f} %",
                f"{1e3 * layer[kind]:.3f}" if in_layer else "",
                f"{100 * layer[kind] / layer_total:.1f} %" if in_layer else "",
            ]
        )
    return format_table(["where the time goes", "step s", "share", "layer ms", "share"], rows)
