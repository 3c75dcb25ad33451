"""Text tables for people: a run's summary and the validation table."""

from __future__ import annotations

import math
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


# Largest first: a duration is shown in the largest unit in which it reads at least 1.
_TIME_UNITS = (("s", 1.0), ("ms", units.SECONDS_PER_MS), ("µs", units.SECONDS_PER_US))


def format_duration(seconds: float) -> str:
    """A duration for people in the largest of s / ms / µs in which it reads >= 1: "4.617 s",
    "12.34 ms", "85.20 µs". Seconds keep the three decimals the tables always had; ms and µs
    keep four significant digits, so a tiny model's times read as numbers, not "0.000 s".
    `--json` keeps SI seconds."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    for unit, scale in _TIME_UNITS:
        value = seconds / scale
        if unit == "s":
            text = f"{value:.3f}"
        else:
            decimals = 1 if abs(value) >= 100 else 2 if abs(value) >= 10 else 3
            text = f"{value:.{decimals}f}"
        if abs(float(text)) >= 1 or unit == _TIME_UNITS[-1][0]:  # after rounding: 0.9996 s is 1.000 s
            return f"{text} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def _mfu_rows(result: SimulationResult) -> list[list[object]]:
    """MFU and HFU with their denominator named: the dense peak of the run's 16-bit (or
    fp32) tensor cores, so an FP8 run's MFU is of the BF16 peak and can pass 90 %; its MFU
    of the FP8 peak follows, and a note says what compares across precisions."""
    peak = result.mfu_peak_flop_per_s
    if not peak:  # a result built without the denominator (older code paths)
        return [["MFU", f"{100 * result.mfu:.1f} %"], ["HFU", f"{100 * result.hfu:.1f} %"]]
    of_peak = f"{result.mfu_peak_dtype.upper()} peak {units.flop_per_s_to_tflop_per_s(peak):,.0f} TFLOP/s"
    rows: list[list[object]] = [
        [f"MFU (of {of_peak})", f"{100 * result.mfu:.1f} %"],
        [f"HFU (of {of_peak})", f"{100 * result.hfu:.1f} %"],
    ]
    for name, peak_s, mfu, _ in _low_precision_peaks(result):
        low_peak = units.flop_per_s_to_tflop_per_s(peak_s)
        rows.append([f"MFU of the {name} peak ({low_peak:,.0f} TFLOP/s)", f"{100 * mfu:.1f} %"])
    return rows


FP4_MFU_NOTE = (
    "FP4 run: MFU and HFU divide by the BF16 peak (so they can pass 100 %); to compare runs of "
    "different precision or GPU, compare tokens/s per GPU (or model TFLOP/s per GPU)."
)

FP8_MFU_NOTE = (
    "FP8 run: MFU and HFU divide by the BF16 peak (so they can pass 90 %); to compare runs of "
    "different precision or GPU, compare tokens/s per GPU (or model TFLOP/s per GPU)."
)


def _low_precision_peaks(result: SimulationResult) -> list[tuple[str, float, float, str]]:
    """(precision, its dense peak FLOP/s, the run's MFU of it, the note) for an FP8 or FP4
    run; empty for the others."""
    candidates = (
        ("FP8", result.fp8_peak_flop_per_s, result.fp8_peak_mfu, FP8_MFU_NOTE),
        ("FP4", result.fp4_peak_flop_per_s, result.fp4_peak_mfu, FP4_MFU_NOTE),
    )
    return [(name, peak, mfu, note) for name, peak, mfu, note in candidates if peak and mfu is not None]


def format_result(result: SimulationResult) -> str:
    t = result.iteration_time_s
    summary = format_table(
        ["metric", "value"],
        [
            ["scenario", result.scenario],
            ["hardware", result.hardware],
            ["GPUs", result.num_gpus],
            ["iteration time", format_duration(t)],
            *_mfu_rows(result),
            ["model TFLOP/s per GPU", f"{result.tflops_per_gpu:.1f}"],
            ["tokens/s per GPU", f"{result.tokens_per_s_per_gpu:,.0f}"],
            ["pipeline idle (bubble share)", f"{100 * result.pipeline_idle_fraction:.1f} %"],
            ["bubble / busy time", f"{result.bubble_to_busy_ratio:.3f}"],
            [
                "layer forward / backward",
                f"{format_duration(result.layer.forward_s)} / {format_duration(result.layer.backward_s)}",
            ],
            *_host_rows(result),
        ],
    )
    for *_, note in _low_precision_peaks(result):
        summary += "\n" + note
    note = host_note(result)
    if note:
        summary += "\n" + note
    breakdown = format_table(
        ["time (mean stage)", "time", "share"],
        [[k, format_duration(v), f"{100 * v / t:.1f} %"] for k, v in result.time_breakdown_s.items()],
    )
    shown = stages_to_show(result)
    memory = stage_memory_table(shown, merge_identical=True)
    hidden = sorted({s.stage for s in result.stages} - {s.stage for s in shown})
    if hidden:
        memory += (
            f"\nnot shown: stage{'s' if len(hidden) > 1 else ''} {stage_ranges(hidden)} "
            "(each fits, and none is fuller than the fullest shown)"
        )
    return "\n\n".join([summary, breakdown, memory])


NEAR_HOST_BOUND = 0.8  # host issue at 80 % of the GPU's time: a slower host CPU would show


def _host_rows(result: SimulationResult) -> list[list[str]]:
    share = result.host_issue_share
    return [] if share is None else [["host issue / GPU time (busiest chunk)", f"{100 * share:.0f} %"]]


def host_note(result: SimulationResult) -> str:
    """A line where the host's issue time is near the GPU's or above it: the prediction then
    rests on the profile's host cost per launch as much as on the GPU's rates."""
    share = result.host_issue_share
    if share is None or share < NEAR_HOST_BOUND:
        return ""
    state = "host-bound" if share >= 1 else "near host-bound"
    return (
        f"{state}: the host issues the busiest chunk's kernels in {100 * share:.0f} % of its GPU time, so "
        "this prediction depends on the host CPU's speed per launch (compute.host_issue_us_per_op) "
        "as much as on the GPU (docs/moe_host.md)."
    )


def stages_to_show(result: SimulationResult, limit: int = 8) -> list[StageMemory]:
    """Every stage for short pipelines; otherwise the first, the last, the fullest and every
    stage that does not fit (a pp-16 run whose stages 1-14 overflow shows all fourteen)."""
    stages = list(result.stages)
    if len(stages) <= limit:
        return stages
    picked = {stages[0].stage, result.fullest_stage.stage, stages[-1].stage}
    picked.update(result.stages_not_fitting)
    return [s for s in stages if s.stage in picked]


def stage_ranges(indices: Sequence[int]) -> str:
    """Sorted stage indices as ranges: [1, 2, 3, 7] -> "1–3, 7"."""
    spans: list[list[int]] = []
    for index in indices:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def format_summary(results: Sequence[SimulationResult]) -> str:
    """One line per scenario, for `simcluster run FOLDER`: the fullest stage's peak (and
    which stage), and the stages that do not fit; a note under the table where FP8 runs'
    MFU is of the BF16 peak."""
    table = format_table(
        ["scenario", "GPUs", "iteration", "MFU %", "HFU %", "idle %", "peak GB (fullest stage)", "fits"],
        [
            [
                r.scenario,
                r.num_gpus,
                format_duration(r.iteration_time_s),
                f"{100 * r.mfu:.1f}",
                f"{100 * r.hfu:.1f}",
                f"{100 * r.pipeline_idle_fraction:.1f}",
                f"{_gb(r.fullest_stage.peak_memory_bytes)} (stage {r.fullest_stage.stage})",
                "yes" if r.fits_in_memory else _not_fitting(r),
            ]
            for r in results
        ],
    )
    noted: dict[str, list[str]] = {FP8_MFU_NOTE: [], FP4_MFU_NOTE: []}
    for r in results:
        for *_, note in _low_precision_peaks(r):
            noted[note].append(r.scenario)
    return table + "".join(f"\n{', '.join(names)}: {note}" for note, names in noted.items() if names)


def _not_fitting(result: SimulationResult) -> str:
    bad = result.stages_not_fitting
    return f"NO: stage{'s' if len(bad) > 1 else ''} {stage_ranges(bad)} of {len(result.stages)}"


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


def stage_memory_table(stages: Sequence[StageMemory], merge_identical: bool = False) -> str:
    """One row per stage: static parts, activations, transient, peak, fits. With
    `merge_identical`, neighbouring stages whose rows read the same share one row ("1–14")."""
    rows = [_stage_cells(s) for s in stages]
    if merge_identical:
        rows = _merged(rows)
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
        [[stage_ranges(indices), *cells] for indices, cells in rows],
    )


def _stage_cells(s: StageMemory) -> tuple[list[int], list[str]]:
    return [s.stage], [
        _gb(s.weight_bytes),
        _gb(s.gradient_bytes),
        _gb(s.optimizer_bytes),
        _gb(s.activation_bytes),
        _gb(s.transient_bytes),
        _gb(s.peak_memory_bytes),
        "yes" if s.fits else f"NO (> {_gb(s.capacity_bytes)})",
    ]


def _merged(rows: list[tuple[list[int], list[str]]]) -> list[tuple[list[int], list[str]]]:
    merged: list[tuple[list[int], list[str]]] = []
    for indices, cells in rows:
        if merged and merged[-1][1] == cells and merged[-1][0][-1] + 1 == indices[0]:
            merged[-1][0].extend(indices)
        else:
            merged.append((list(indices), cells))
    return merged


_KIND_LABELS = {
    "gemm": "GEMM",
    "attention": "attention",
    "memory_bound": "memory-bound",
    "fp8_cast": "FP8 casts",
    "tp_comm": "TP comm (exposed)",
    "ep_comm": "EP comm (MoE dispatch)",
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
    microbatch) by kind of work, each with its share (`costs.breakdown`). Kinds with no time
    in the step or the layer (FP8 casts of a BF16 run, CP comm at cp 1) are left out of the
    table; `--json` keeps every kind."""
    step, layer = result.time_by_kind_s, result.layer_time_by_kind_s
    step_total, layer_total = sum(step.values()) or 1.0, sum(layer.values()) or 1.0
    rows = []
    for kind, seconds in step.items():
        in_layer = layer.get(kind, 0.0) > 0
        if seconds <= 0 and not in_layer:
            continue
        rows.append(
            [
                _KIND_LABELS.get(kind, kind),
                format_duration(seconds),
                f"{100 * seconds / step_total:.1f} %",
                format_duration(layer[kind]) if in_layer else "",
                f"{100 * layer[kind] / layer_total:.1f} %" if in_layer else "",
            ]
        )
    return format_table(["where the time goes", "step", "share", "one layer", "share"], rows)
