"""check-profile's table for people, and its CSV and markdown files.

Files: `<out_dir>/<profile>-<device>.csv` (one row per run, with the device, torch and
CUDA versions on every row) and `.md` (where, how, the table, the error summary).
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from pathlib import Path

from simcluster import units
from simcluster.calibration.check import (
    KINDS,
    CheckSummary,
    KindSummary,
    LayerCheck,
    gpu_bound_kind_summary,
    kind_summary,
    run_label,
    summarize,
)
from simcluster.calibration.records import LayerRun
from simcluster.output_files import write_atomically, write_text_atomically

COLUMNS = [
    "name",
    "mode",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "micro_batch_size",
    "tokens",
    "tp",
    "sequence_parallel",
    "recompute",
    "measured_forward_ms",
    "predicted_forward_ms",
    "forward_error",
    "measured_total_ms",
    "predicted_total_ms",
    "total_error",
    "spread",
    "repeats",
    "host_floor_ms",
    *(f"predicted_{kind}_ms" for kind in KINDS),
    "profile",
    "device_name",
    "torch_version",
    "cuda_version",
    "date",
]


def _ms(seconds: float) -> float:
    return units.s_to_ms(seconds)


def _ms_or_blank(seconds: float | None, digits: int = 4) -> str:
    return "" if seconds is None else f"{_ms(seconds):.{digits}f}"


def _percent(error: float | None, width: int = 6) -> str:
    return f"{'-':>{width + 1}}" if error is None else f"{100 * error:>+{width}.1f}%"


def _row(check: LayerCheck, run: LayerRun, profile: str) -> dict[str, object]:
    t = check.timing
    return {
        "name": t.name,
        "mode": t.layer_mode,
        "hidden_size": t.hidden_size,
        "num_attention_heads": t.num_attention_heads,
        "seq_length": t.seq_length,
        "micro_batch_size": t.micro_batch_size,
        "tokens": t.seq_length * t.micro_batch_size,
        "tp": t.tp,
        "sequence_parallel": t.sequence_parallel,
        "recompute": t.recompute,
        "measured_forward_ms": _ms_or_blank(t.forward_s),
        "predicted_forward_ms": f"{_ms(check.predicted_forward_s):.4f}",
        "forward_error": "" if check.forward_error is None else f"{check.forward_error:+.4f}",
        "measured_total_ms": f"{_ms(t.total_s):.4f}",
        "predicted_total_ms": f"{_ms(check.predicted_total_s):.4f}",
        "total_error": f"{check.error:+.4f}",
        "spread": "" if t.spread is None else f"{t.spread:.3f}",
        "repeats": t.repeats,
        "host_floor_ms": f"{_ms(check.host_floor_s):.4f}",
        **{f"predicted_{kind}_ms": f"{_ms(check.predicted_by_kind_s.get(kind, 0.0)):.4f}" for kind in KINDS},
        "profile": profile,
        "device_name": run.device.name,
        "torch_version": run.device.torch_version,
        "cuda_version": run.device.cuda_version,
        "date": run.device.date,
    }


KIND_HEADERS = {"gemm": "GEMM", "attention": "attn", "memory_bound": "mem", "standin_copy": "copy"}


def format_table(checks: list[LayerCheck]) -> str:
    """A fixed-width table: layer, t, SP, recompute, measured / predicted ms, errors, and the
    predicted forward + backward split by kind (% of the prediction)."""
    kinds = " ".join(f"{KIND_HEADERS[kind]:>5}" for kind in KINDS)
    head = (
        f"{'layer':<34} {'t':>2} {'SP':>3} {'recompute':<9} {'fwd ms':>9} {'pred':>9} "
        f"{'err':>7} {'f+b ms':>9} {'pred':>9} {'err':>7}  {kinds}"
    )
    lines = [head, "-" * len(head)]
    for c in checks:
        t = c.timing
        forward = f"{'-':>9}" if t.forward_s is None else f"{_ms(t.forward_s):>9.3f}"
        shares = " ".join(f"{100 * c.kind_share(kind):>4.0f}%" for kind in KINDS)
        lines.append(
            f"{run_label(t):<34} {t.tp:>2} {'on' if t.sequence_parallel else 'off':>3} "
            f"{t.recompute:<9} {forward} {_ms(c.predicted_forward_s):>9.3f} "
            f"{_percent(c.forward_error)} {_ms(t.total_s):>9.3f} "
            f"{_ms(c.predicted_total_s):>9.3f} {_percent(c.error)}  {shares}{' host' if c.host_bound else ''}"
        )
    return "\n".join(lines)


def format_summary(
    summary: CheckSummary,
    kinds: list[KindSummary] | None = None,
    gpu_bound_kinds: list[KindSummary] | None = None,
) -> str:
    lines = [
        f"forward+backward |error|: median {100 * summary.median_abs_error:.1f}%, "
        f"max {100 * summary.max_abs_error:.1f}%, {summary.within_10_percent}/"
        f"{summary.num_runs} runs within 10% (median signed error "
        f"{100 * summary.median_error:+.1f}%)"
    ]
    for shape, error in summary.per_shape_median_abs_error.items():
        lines.append(f"  {shape}: median |error| {100 * error:.1f}%")
    if summary.num_host_bound:
        lines.append(
            f"  {summary.num_host_bound} run(s) marked 'host': the host's issue time "
            "(compute.host_issue_us_per_op, else calibration.layer_overhead_us, per op; the GPU "
            "waiting where the host falls behind) adds at least 5% to the predicted device time"
        )
        with_host = summary.host_bound_with_host_median_abs_error
        alone = summary.host_bound_device_median_abs_error
        if with_host is not None and alone is not None:
            lines.append(
                f"  those runs priced with the host's issue time (one op after another, the GPU "
                f"waiting where the host is behind): median |error| {100 * with_host:.1f}% "
                f"(device alone {100 * alone:.1f}%)"
            )
        if summary.gpu_bound_median_abs_error is not None and summary.gpu_bound_max_abs_error is not None:
            lines.append(
                f"  the {summary.num_runs - summary.num_host_bound} GPU-bound runs: median |error| "
                f"{100 * summary.gpu_bound_median_abs_error:.1f}%, max "
                f"{100 * summary.gpu_bound_max_abs_error:.1f}% (target "
                f"{'met' if summary.gpu_bound_meets_target() else 'missed'})"
            )
    if kinds:
        lines.append(format_kinds(kinds))
    if gpu_bound_kinds:
        gpu_bound = summary.num_runs - summary.num_host_bound
        lines.append(format_kinds(gpu_bound_kinds, f"by kind, the {gpu_bound} GPU-bound runs alone"))
    verdict = "meets" if summary.meets_target() else "misses"
    lines.append(f"target (every run within 10%, median within 5%): {verdict}")
    return "\n".join(lines)


def format_kinds(kinds: list[KindSummary], title: str = "by kind") -> str:
    """Each kind's share of the predicted time and the median layer error where it weighs
    more / less than its median share (the timings are whole layers: the split is of the
    prediction)."""
    lines = [
        f"{title} (split of the predicted time; layer errors where the kind weighs more / less):",
        f"  {'kind':<13} {'share':>6} {'median share':>12} {'err heavy':>10} {'err light':>10}",
    ]
    for k in kinds:
        lines.append(
            f"  {k.kind:<13} {100 * k.share_of_predicted:>5.1f}% {100 * k.median_share:>11.1f}% "
            f"{_percent(k.median_error_heavy, 8)} {_percent(k.median_error_light, 8)}"
        )
    return "\n".join(lines)


def to_json(checks: list[LayerCheck], run: LayerRun, profile: str) -> dict[str, object]:
    """check-profile --json: the summary, the by-kind summary and one row per run."""
    summary = summarize(checks)
    return {
        "profile": profile,
        "device": run.device.name,
        "summary": {
            **asdict(summary),
            "meets_target": summary.meets_target(),
            "gpu_bound_meets_target": summary.gpu_bound_meets_target(),
        },
        "by_kind": _kinds_json(kind_summary(checks)),
        # the same over the GPU-bound runs where some are host-bound; null otherwise
        "by_kind_gpu_bound": _kinds_json(gpu_bound_kind_summary(checks)),
        "runs": [_json_row(c) for c in checks],
    }


def _kinds_json(kinds: list[KindSummary] | None) -> list[dict[str, object]] | None:
    return None if kinds is None else [asdict(k) for k in kinds]


def _json_row(check: LayerCheck) -> dict[str, object]:
    t = check.timing
    return {
        **asdict(t),
        "predicted_forward_s": check.predicted_forward_s,
        "predicted_total_s": check.predicted_total_s,
        "forward_error": check.forward_error,
        "total_error": check.error,
        "host_floor_s": check.host_floor_s,
        "with_host_s": check.with_host_s,
        "host_bound": check.host_bound,
        "predicted_by_kind_s": dict(check.predicted_by_kind_s),
    }


def write_reports(
    checks: list[LayerCheck], run: LayerRun, profile: str, profile_summary: str, out_dir: Path
) -> tuple[Path, Path]:
    """Write `<profile>-<device>.csv` and `.md` under out_dir (replacing older ones)."""
    stem = f"{profile}-{run.device.device_type}"
    csv_path, md_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=COLUMNS)
    writer.writeheader()
    for check in checks:
        writer.writerow(_row(check, run, profile))
    write_atomically(csv_path, lambda path: path.write_text(table.getvalue(), newline=""))
    write_text_atomically(md_path, _markdown(checks, run, profile, profile_summary))
    return csv_path, md_path


def _markdown(checks: list[LayerCheck], run: LayerRun, profile: str, profile_summary: str) -> str:
    dev = run.device
    summary = summarize(checks)
    lines = [
        f"# check-profile: {profile} on {dev.name}",
        "",
        f"- device: {dev.name} ({dev.memory_gb:.1f} GB), driver {dev.driver_version}, "
        f"CUDA {dev.cuda_version}, torch {dev.torch_version}, {dev.num_threads} intra-op thread(s)",
        f"- date: {dev.date}; command: `{run.command}`",
        f"- profile: {profile}: {profile_summary}",
        (
            f"- grid: {run.grid} held-out shapes (no hidden size or s·b of them was calibrated), "
            if run.grid in ("quick", "cpu", "cuda")
            else f"- grid: {run.grid} (named layers, each with its own model fields and dropouts), "
        )
        + f"{run.dtype}, dropout {run.dropout_prob}",
        "- measured: one process plays rank 0 of t (ShardStandInComm), median of repeated "
        "forward + backward (device events on CUDA); predicted: the simulator's op graph "
        "priced by the profile, collectives replaced by the stand-in's local copies",
        "",
        "| layer | h | a | s | b | t | SP | recompute | fwd ms | predicted | error | fwd+bwd ms "
        "| predicted | error | GEMM | attention | memory-bound | stand-in copy |",
        "|:---|---:|---:|---:|---:|---:|:---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        t = c.timing
        forward = "-" if t.forward_s is None else f"{_ms(t.forward_s):.3f}"
        forward_error = "-" if c.forward_error is None else f"{100 * c.forward_error:+.1f}%"
        shares = " | ".join(f"{100 * c.kind_share(kind):.0f}%" for kind in KINDS)
        lines.append(
            f"| {t.name or 'paper'} {t.layer_mode} | {t.hidden_size} | {t.num_attention_heads} "
            f"| {t.seq_length} "
            f"| {t.micro_batch_size} | {t.tp} | {'on' if t.sequence_parallel else 'off'} | {t.recompute} "
            f"| {forward} | {_ms(c.predicted_forward_s):.3f} | {forward_error} | {_ms(t.total_s):.3f} "
            f"| {_ms(c.predicted_total_s):.3f} | {100 * c.error:+.1f}%{' (host)' if c.host_bound else ''} "
            f"| {shares} |"
        )
    lines += [
        "",
        "```",
        format_summary(summary, kind_summary(checks), gpu_bound_kind_summary(checks)),
        "```",
        "",
    ]
    return "\n".join(lines)
