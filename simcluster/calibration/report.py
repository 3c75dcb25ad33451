"""check-profile's table for people, and its CSV and markdown files.

Files: `<out_dir>/<profile>-<device>.csv` (one row per run, with the device, torch and
CUDA versions on every row) and `.md` (where, how, the table, the error summary).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from simcluster import units
from simcluster.calibration.check import CheckSummary, LayerCheck, shape_label, summarize
from simcluster.calibration.records import LayerRun
from simcluster.output_files import write_atomically, write_text_atomically

COLUMNS = [
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
    "profile",
    "device_name",
    "torch_version",
    "cuda_version",
    "date",
]


def _ms(seconds: float) -> float:
    return units.s_to_ms(seconds)


def _row(check: LayerCheck, run: LayerRun, profile: str) -> dict[str, object]:
    t = check.timing
    return {
        "hidden_size": t.hidden_size,
        "num_attention_heads": t.num_attention_heads,
        "seq_length": t.seq_length,
        "micro_batch_size": t.micro_batch_size,
        "tokens": t.seq_length * t.micro_batch_size,
        "tp": t.tp,
        "sequence_parallel": t.sequence_parallel,
        "recompute": t.recompute,
        "measured_forward_ms": f"{_ms(t.forward_s):.4f}",
        "predicted_forward_ms": f"{_ms(check.predicted_forward_s):.4f}",
        "forward_error": f"{check.forward_error:+.4f}",
        "measured_total_ms": f"{_ms(t.total_s):.4f}",
        "predicted_total_ms": f"{_ms(check.predicted_total_s):.4f}",
        "total_error": f"{check.error:+.4f}",
        "spread": f"{t.spread:.3f}",
        "repeats": t.repeats,
        "host_floor_ms": f"{_ms(check.host_floor_s):.4f}",
        "profile": profile,
        "device_name": run.device.name,
        "torch_version": run.device.torch_version,
        "cuda_version": run.device.cuda_version,
        "date": run.device.date,
    }


def format_table(checks: list[LayerCheck]) -> str:
    """A fixed-width table: shape, t, SP, recompute, measured / predicted ms, errors."""
    head = (
        f"{'shape':<28} {'t':>2} {'SP':>3} {'recompute':<9} {'fwd ms':>9} {'pred':>9} "
        f"{'err':>7} {'f+b ms':>9} {'pred':>9} {'err':>7}"
    )
    lines = [head, "-" * len(head)]
    for c in checks:
        t = c.timing
        lines.append(
            f"{shape_label(t.shape):<28} {t.tp:>2} {'on' if t.sequence_parallel else 'off':>3} "
            f"{t.recompute:<9} {_ms(t.forward_s):>9.3f} {_ms(c.predicted_forward_s):>9.3f} "
            f"{100 * c.forward_error:>+6.1f}% {_ms(t.total_s):>9.3f} "
            f"{_ms(c.predicted_total_s):>9.3f} {100 * c.error:>+6.1f}%{' host' if c.host_bound else ''}"
        )
    return "\n".join(lines)


def format_summary(summary: CheckSummary) -> str:
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
            f"  {summary.num_host_bound} run(s) marked 'host': issuing the ops takes the host longer "
            "than the predicted device time (eager overhead, calibration.layer_overhead_us); the "
            "model has no host term and under-predicts them"
        )
    verdict = "meets" if summary.meets_target() else "misses"
    lines.append(f"target (every run within 10%, median within 5%): {verdict}")
    return "\n".join(lines)


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
        f"- grid: {run.grid} held-out shapes (no hidden size or s·b of them was calibrated), "
        f"{run.dtype}, dropout {run.dropout_prob}",
        "- measured: one process plays rank 0 of t (ShardStandInComm), median of repeated "
        "forward + backward (device events on CUDA); predicted: the simulator's op graph "
        "priced by the profile, collectives replaced by the stand-in's local copies",
        "",
        "| h | a | s | b | t | SP | recompute | fwd ms | predicted | error | fwd+bwd ms "
        "| predicted | error |",
        "|---:|---:|---:|---:|---:|:---:|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        t = c.timing
        lines.append(
            f"| {t.hidden_size} | {t.num_attention_heads} | {t.seq_length} | {t.micro_batch_size} "
            f"| {t.tp} | {'on' if t.sequence_parallel else 'off'} | {t.recompute} "
            f"| {_ms(t.forward_s):.3f} | {_ms(c.predicted_forward_s):.3f} "
            f"| {100 * c.forward_error:+.1f}% | {_ms(t.total_s):.3f} "
            f"| {_ms(c.predicted_total_s):.3f} | {100 * c.error:+.1f}%{' (host)' if c.host_bound else ''} |"
        )
    lines += ["", "```", format_summary(summary), "```", ""]
    return "\n".join(lines)
