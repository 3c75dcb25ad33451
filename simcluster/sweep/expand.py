"""Expansion: `itertools.product` over the spec's axes for each base scenario (model), then
the scenario loader's own rules as the filter. A combination the loader would reject (`parse_scenario` raises
`ConfigError`) is counted as invalid with its reasons, never simulated."""

from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import dataclass
from itertools import product
from typing import Any

from simcluster.config.errors import ConfigError
from simcluster.config.scenario import Scenario, parse_scenario
from simcluster.sweep.axes import AXES, EXPERT_AXIS_DEFAULTS, LAYOUT_COLUMNS, MODEL_COLUMN, AxisValue
from simcluster.sweep.spec import SweepSpec


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """One valid configuration: its id, its full layout (every axis and dp), its scenario."""

    config_id: str
    layout: dict[str, AxisValue]
    scenario: Scenario


def problem_field(problem: str) -> str:
    """The field a loader problem names: its leading dotted name ("parallel.ep" of both
    "parallel.ep: value 2: ..." and the MoE rules' "parallel.ep=4 with etp=2 is not allowed")."""
    found = re.match(r"[\w.]+", problem)
    return found.group(0) if found else problem.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class Expansion:
    """The valid configurations in expansion order, and the rejected ones with reasons."""

    configs: tuple[SweepConfig, ...]
    invalid: tuple[tuple[str, tuple[str, ...]], ...]  # (config id, the loader's problems)

    @property
    def num_combinations(self) -> int:
        return len(self.configs) + len(self.invalid)

    def invalid_by_field(self) -> dict[str, int]:
        """How many combinations each field's rule rejected (a combination may count twice)."""
        fields = Counter(problem_field(problem) for _, problems in self.invalid for problem in problems)
        return dict(fields.most_common())

    def common_problems(self, count: int = 3) -> list[str]:
        """The `count` fields that rejected the most combinations, each as its first problem
        and how many combinations it rejected: why a sweep has nothing to run."""
        first: dict[str, str] = {}
        for _, problems in self.invalid:
            for problem in problems:
                first.setdefault(problem_field(problem), problem)
        top = list(self.invalid_by_field().items())[:count]
        return [f"{first[field]} ({n} of {self.num_combinations} combinations)" for field, n in top]


def config_id(layout: dict[str, AxisValue | None]) -> str:
    """Canonical id: every layout field in `LAYOUT_COLUMNS` order, `name=value` joined by ','
    (booleans as true/false), the expert axes only away from their defaults (ep 1, etp null:
    a dense model's ids are those written before ep / etp were axes). The resume key: equal
    layouts give equal ids, whatever the spec."""

    def text(value: AxisValue | None) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return "-" if value is None else str(value)

    return ",".join(
        f"{name}={text(layout[name])}"
        for name in LAYOUT_COLUMNS
        if name not in EXPERT_AXIS_DEFAULTS or layout[name] != EXPERT_AXIS_DEFAULTS[name]
    )


def _layout(spec: SweepSpec, base: Scenario, chosen: dict[str, AxisValue]) -> dict[str, AxisValue | None]:
    layout: dict[str, AxisValue | None] = {
        name: chosen.get(name, axis.base_value(base)) for name, axis in AXES.items()
    }
    layout[MODEL_COLUMN] = base.name
    tp, pp = layout["tp"], layout["pp"]
    assert isinstance(tp, int) and isinstance(pp, int)
    model_parallel = tp * base.parallel.cp * pp  # cp is not an axis: the base's context parallelism
    layout["dp"] = spec.num_gpus // model_parallel if spec.num_gpus % model_parallel == 0 else None
    return {name: layout[name] for name in LAYOUT_COLUMNS}


def _indivisible(num_gpus: int, base: Scenario, layout: dict[str, AxisValue | None]) -> str:
    tp, pp, cp = int(layout["tp"]), int(layout["pp"]), base.parallel.cp  # type: ignore[arg-type]
    if cp == 1:
        return f"num_gpus: value {num_gpus}: not divisible by tp * pp ({tp * pp})"
    return f"num_gpus: value {num_gpus}: not divisible by tp * cp * pp ({tp} * {cp} * {pp} = {tp * cp * pp})"


def _scenario_data(base_data: dict[str, Any], layout: dict[str, AxisValue | None]) -> dict[str, Any]:
    data = copy.deepcopy(base_data)
    data["parallel"]["dp"] = layout["dp"]
    for name, axis in AXES.items():
        (data if axis.section == "scenario" else data[axis.section])[name] = layout[name]
    return data


def layout_config(spec: SweepSpec, layout: dict[str, AxisValue]) -> SweepConfig:
    """The configuration of a table row's layout (its `LAYOUT_COLUMNS` values, plain Python):
    its base by the model column, with the layout applied and loaded again, as `expand`
    builds it. A row resumed from an earlier run of the same inputs need not be in this
    spec's expansion (its axes may have changed). ConfigError when no base has that name
    or the loader rejects the layout."""
    full: dict[str, AxisValue | None] = {name: layout[name] for name in LAYOUT_COLUMNS}
    base = next((b for b in spec.bases if b.name == full[MODEL_COLUMN]), None)
    if base is None:
        names = ", ".join(b.name for b in spec.bases)
        raise ConfigError(
            spec.source, [f"model: value {full[MODEL_COLUMN]!r}: not a base of this spec ({names})"]
        )
    scenario = parse_scenario(_scenario_data(base.model_dump(mode="json"), full), spec.source, base.name)
    return SweepConfig(config_id(full), full, scenario)  # type: ignore[arg-type]


def expand(spec: SweepSpec) -> Expansion:
    """Every combination of the spec's axes for each base, split into valid configurations
    and rejects."""
    configs: list[SweepConfig] = []
    invalid: list[tuple[str, tuple[str, ...]]] = []
    names = tuple(spec.axes)
    for base in spec.bases:
        _expand_base(spec, base, names, configs, invalid)
    return Expansion(configs=tuple(configs), invalid=tuple(invalid))


def _expand_base(
    spec: SweepSpec,
    base: Scenario,
    names: tuple[str, ...],
    configs: list[SweepConfig],
    invalid: list[tuple[str, tuple[str, ...]]],
) -> None:
    base_data = base.model_dump(mode="json")
    for combination in product(*spec.axes.values()):
        layout = _layout(spec, base, dict(zip(names, combination)))
        key = config_id(layout)
        if layout["dp"] is None:
            invalid.append((key, (_indivisible(spec.num_gpus, base, layout),)))
            continue
        try:
            scenario = parse_scenario(_scenario_data(base_data, layout), spec.source, base.name)
        except ConfigError as error:
            invalid.append((key, tuple(error.problems)))
            continue
        configs.append(SweepConfig(key, layout, scenario))  # type: ignore[arg-type]
