"""Scenarios side by side (`simcluster compare`): their layouts, headline metrics, time per
category and memory per stage, each row marked where the scenarios differ and with each
value's change relative to the first scenario.

A row differs when any value is not the first's (numbers compared with a relative
tolerance of 1e-9, so float noise in equal runs is not a difference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simcluster import units
from simcluster.config.scenario import Scenario
from simcluster.engine.plan import TimeCategory
from simcluster.report.tables import format_table
from simcluster.results import SimulationResult

Value = float | int | str | bool | None
RELATIVE_TOLERANCE = 1e-9

_LAYOUT = (
    ("model", ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "seq_length",
               "vocab_size", "ffn_hidden_size", "activation", "normalization", "position_embedding")),
    ("parallel", ("tp", "cp", "pp", "dp", "vpp", "sequence_parallel")),
    ("training", ("micro_batch_size", "global_batch_size", "recompute", "schedule", "dtype", "fp8_recipe",
                  "fp4_recipe", "attention_backend", "attention_kernel", "use_distributed_optimizer",
                  "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "grad_reduce_in_bf16",
                  "fp8_param_gather", "fp4_param_gather")),
)  # fmt: skip
_SUMMARY = ("iteration_time_s", "mfu", "hfu", "tflops_per_gpu", "bubble_fraction")
_STAGE_PARTS = ("weight_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "transient_bytes")


def _same(a: Value, b: Value) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=0.0)
    return a == b


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    section: str  # layout, summary, time, memory
    quantity: str  # a scenario key, a result key, `<category>_s`, `stage <i> peak_memory_bytes`, …
    values: tuple[Value, ...]  # one per scenario; None where a scenario has no such row

    @property
    def differs(self) -> bool:
        return any(not _same(value, self.values[0]) for value in self.values[1:])

    @property
    def relative_delta(self) -> tuple[float | None, ...]:
        """(value − first) / first for numbers (None for the first, text, or a zero first)."""
        first = self.values[0]
        deltas: list[float | None] = [None]
        for value in self.values[1:]:
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (first, value))
            if not numeric or first == 0:
                deltas.append(None)
            else:
                deltas.append((float(value) - float(first)) / float(first))  # type: ignore[arg-type]
        return tuple(deltas)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "quantity": self.quantity,
            "values": list(self.values),
            "relative_delta": list(self.relative_delta),
            "differs": self.differs,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    names: tuple[str, ...]
    rows: tuple[ComparisonRow, ...]
    results: tuple[SimulationResult, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "scenarios": list(self.names),
            "rows": [row.to_json_dict() for row in self.rows],
            "differing": [row.quantity for row in self.rows if row.differs],
            "results": [result.to_json_dict() for result in self.results],
        }


def _layout_value(scenario: Scenario, section: str, key: str) -> Value:
    value = getattr(getattr(scenario, section), key)
    return value.value if hasattr(value, "value") else value


def _rows(scenarios: Sequence[Scenario], results: Sequence[SimulationResult]) -> list[ComparisonRow]:
    rows = [ComparisonRow("layout", "hardware", tuple(r.hardware for r in results))]
    rows.append(ComparisonRow("layout", "num_gpus", tuple(r.num_gpus for r in results)))
    for section, keys in _LAYOUT:
        for key in keys:
            values = tuple(_layout_value(s, section, key) for s in scenarios)
            rows.append(ComparisonRow("layout", key, values))
    for key in _SUMMARY:
        rows.append(ComparisonRow("summary", key, tuple(getattr(r, key) for r in results)))
    for category in TimeCategory:
        values = tuple(r.time_breakdown_s[category.value] for r in results)
        rows.append(ComparisonRow("time", f"{category.value}_s", values))
    num_stages = max(len(r.stages) for r in results)
    for stage in range(num_stages):
        values = tuple(r.stages[stage].peak_memory_bytes if stage < len(r.stages) else None for r in results)
        rows.append(ComparisonRow("memory", f"stage {stage} peak_memory_bytes", values))
    fullest = [max(r.stages, key=lambda s: s.peak_memory_bytes) for r in results]
    for part in _STAGE_PARTS:
        values = tuple(getattr(stage, part) for stage in fullest)
        rows.append(ComparisonRow("memory", f"fullest stage {part}", values))
    return rows


def _unique_names(scenarios: Sequence[Scenario]) -> tuple[str, ...]:
    names = [s.name for s in scenarios]
    return tuple(f"{name} ({i + 1})" if names.count(name) > 1 else name for i, name in enumerate(names))


def compare_results(scenarios: Sequence[Scenario], results: Sequence[SimulationResult]) -> Comparison:
    """Rows of every quantity for scenarios[i] simulated as results[i]."""
    if len(scenarios) != len(results) or len(scenarios) < 2:
        raise ValueError("compare needs two or more scenarios, each with its result")
    return Comparison(_unique_names(scenarios), tuple(_rows(scenarios, results)), tuple(results))


def _shown(quantity: str, value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if quantity.endswith("_bytes"):
        return f"{units.bytes_to_gb(value):.2f}"
    if quantity in ("mfu", "hfu", "bubble_fraction"):
        return f"{100 * value:.2f}"
    if quantity.endswith("_s"):
        return f"{value:.4f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _label(quantity: str) -> str:
    if quantity.endswith("_bytes"):
        return f"{quantity.removesuffix('_bytes').replace('_memory', '')} GB"
    if quantity in ("mfu", "hfu", "bubble_fraction"):
        return f"{quantity} %"
    if quantity.endswith("_s"):
        return f"{quantity.removesuffix('_s')} s"
    return quantity


def format_comparison(comparison: Comparison) -> str:
    """One table: a row per quantity, a column per scenario, each scenario's change relative
    to the first, and a `*` where the scenarios differ."""
    others = comparison.names[1:]
    headers = ["quantity", *comparison.names, *(f"Δ {name}" for name in others), "differs"]
    rows = []
    for row in comparison.rows:
        deltas = [f"{100 * d:+.1f}%" if d is not None and row.differs else "" for d in row.relative_delta[1:]]
        rows.append(
            [f"{row.section}: {_label(row.quantity)}"]
            + [_shown(row.quantity, value) for value in row.values]
            + deltas
            + ["*" if row.differs else ""]
        )
    differing = sum(row.differs for row in comparison.rows)
    footer = (
        f"* differs ({differing} of {len(comparison.rows)} rows); Δ: change relative to {comparison.names[0]}"
    )
    return format_table(headers, rows) + "\n" + footer
