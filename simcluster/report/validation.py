"""The `simcluster validate` table and its summary lines."""

from __future__ import annotations

from collections.abc import Sequence

from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.report.tables import format_table
from simcluster.validation import Comparison, fitted_to_table4, load_paper_tables, scenarios_dir


def _error_text(row: Comparison) -> str:
    return f"{row.error:+.1f} pt" if row.unit == "%" else f"{100 * row.error:+.1f} %"


def summary_lines(rows: Sequence[Comparison]) -> list[str]:
    lines = []
    for table, quantity in (("Table 4", None), ("Table 5", "iteration s")):
        errors = [
            abs(r.error)
            for r in rows
            if r.table == table and r.unit != "%" and (quantity is None or r.quantity == quantity)
        ]
        if errors:
            lines.append(
                f"{table} {'times' if quantity is None else 'iteration times'}: mean |error| "
                f"{100 * sum(errors) / len(errors):.2f} %, worst {100 * max(errors):.2f} %"
            )
    points = [abs(r.error) for r in rows if r.unit == "%"]
    if points:
        lines.append(
            f"Table 5 MFU/HFU: mean |error| {sum(points) / len(points):.2f} pt, worst {max(points):.2f} pt"
        )
    return lines


def _profile_used(hw: HardwareProfile | None) -> HardwareProfile:
    if hw is not None:
        return hw
    first = load_paper_tables()["table5"][0]["scenario"]
    return load_hardware(load_scenario(scenarios_dir() / f"{first}.yaml").hardware)


def format_validation(rows: Sequence[Comparison], hw: HardwareProfile | None = None) -> str:
    profile = _profile_used(hw)
    role = (
        "CALIBRATION: constants of this profile were fitted to Table 4"
        if fitted_to_table4(profile)
        else "validation: nothing in this profile was fitted to Table 4"
    )
    header = [
        f"profile: {profile.name} ({profile.provenance.kind})",
        f"Table 4 rows are {role}; Table 5 is validation (never fitted to).",
        f"source: {' '.join(load_paper_tables()['source'].split())}",
        "",
    ]
    table = format_table(
        ["table", "row", "quantity", "predicted", "measured", "error"],
        [
            [r.table, r.row, r.quantity, f"{r.predicted:.3f}", f"{r.measured:.3f}", _error_text(r)]
            for r in rows
        ],
    )
    return "\n".join(header) + table + "\n\n" + "\n".join(summary_lines(rows))
