"""The `simcluster validate` table and its summary lines."""

from __future__ import annotations

from collections.abc import Sequence

from simcluster.report.tables import format_table
from simcluster.validation import Comparison


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


def format_validation(rows: Sequence[Comparison]) -> str:
    table = format_table(
        ["table", "row", "quantity", "predicted", "measured", "error"],
        [
            [r.table, r.row, r.quantity, f"{r.predicted:.3f}", f"{r.measured:.3f}", _error_text(r)]
            for r in rows
        ],
    )
    return table + "\n\n" + "\n".join(summary_lines(rows))
