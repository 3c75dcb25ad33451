"""Sweep spec files (a public contract):

```yaml
base: ../scenarios/paper/gpt3-175b.yaml   # a scenario file, relative to the spec
num_gpus: 1024                             # dp = num_gpus / (tp * pp)
axes:                                      # each a list, or auto = every valid value
  tp: [1, 2, 4, 8]
  pp: auto
  recompute: [none, selective, full]
```

Axes not named keep the base scenario's value. Errors name the spec file, the field, the
value and what is allowed, like the scenario loader's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from simcluster.config.errors import ConfigError, describe_validation_error
from simcluster.config.files import read_yaml
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import Scenario, load_scenario
from simcluster.config.strict import StrictModel
from simcluster.sweep.axes import AXES, AutoContext, AxisValue

AUTO = "auto"
MAX_COMBINATIONS = 1_000_000  # each is validated (and most simulated): ~1.5 h at 200/s per worker


class _SpecFile(StrictModel):
    """The file's shape; axis values are checked against `AXES` afterwards."""

    base: str
    num_gpus: int | None = Field(default=None, gt=0, description="default: the base scenario's tp·pp·dp")
    axes: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A loaded spec: the base scenario and hardware, the GPU count, each axis's values
    (only the named axes, in `AXES` order; `auto` already expanded)."""

    source: Path
    base: Scenario
    hardware: HardwareProfile
    num_gpus: int
    axes: dict[str, tuple[AxisValue, ...]]

    @property
    def num_combinations(self) -> int:
        count = 1
        for values in self.axes.values():
            count *= len(values)
        return count


def _axis_values(name: str, raw: list[Any], problems: list[str]) -> tuple[AxisValue, ...]:
    axis, values = AXES[name], []
    if not raw:
        problems.append(f"axes.{name}: empty list; give at least one value or `auto`")
    for item in raw:
        try:
            value = axis.parse(item)
        except ValueError as error:
            problems.append(f"axes.{name}: {error}")
            continue
        if value in values:
            problems.append(f"axes.{name}: value {item!r}: listed twice")
        values.append(value)
    return tuple(values)


def _resolve_axes(
    raw: dict[str, Any], base: Scenario, num_gpus: int, problems: list[str]
) -> dict[str, tuple[AxisValue, ...]]:
    unknown = [name for name in raw if name not in AXES]
    for name in unknown:
        hint = " (dp follows from num_gpus / (tp * pp))" if name == "dp" else ""
        problems.append(f"axes.{name}: unknown axis{hint}; allowed: {', '.join(AXES)}")
    for name, values in raw.items():
        if name in AXES and values != AUTO and not isinstance(values, list):
            problems.append(f"axes.{name}: value {values!r}: must be a list of values or `auto`")
    listed = {
        name: _axis_values(name, values, problems)
        for name, values in raw.items()
        if name in AXES and isinstance(values, list)
    }
    batches = tuple(int(b) for b in listed.get("global_batch_size", ())) or (base.training.global_batch_size,)
    context = AutoContext(base=base, num_gpus=num_gpus, global_batch_sizes=batches)
    resolved: dict[str, tuple[AxisValue, ...]] = {}
    for name, axis in AXES.items():
        if name in listed:
            resolved[name] = listed[name]
        elif raw.get(name) == AUTO:
            if axis.auto is None:
                problems.append(f"axes.{name}: value 'auto': not available for this axis; list the values")
            else:
                resolved[name] = axis.auto(context)
    return resolved


def parse_sweep_spec(data: Any, source: str | Path) -> SweepSpec:
    """Validate a spec mapping read from `source` (its folder anchors `base`)."""
    source = Path(source)
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): a sweep spec must be a mapping of keys"])
    try:
        raw = _SpecFile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error)) from None
    base_path = source.parent / raw.base
    if not base_path.is_file():
        raise ConfigError(source, [f"base: value {raw.base!r}: no scenario file at {base_path}"])
    base = load_scenario(base_path)
    hardware = load_hardware(base.hardware, relative_to=base_path)
    num_gpus = raw.num_gpus or base.num_gpus
    problems: list[str] = []
    axes = _resolve_axes(dict(raw.axes), base, num_gpus, problems)
    if problems:
        raise ConfigError(source, problems)
    spec = SweepSpec(source=source, base=base, hardware=hardware, num_gpus=num_gpus, axes=axes)
    if spec.num_combinations > MAX_COMBINATIONS:
        sizes = " * ".join(f"{name} {len(values)}" for name, values in axes.items())
        raise ConfigError(
            source,
            [
                f"axes: {sizes} = {spec.num_combinations:,} combinations, over the {MAX_COMBINATIONS:,} "
                "one sweep runs; list fewer values, or split the sweep by one axis"
            ],
        )
    return spec


def load_sweep_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    return parse_sweep_spec(read_yaml(path), path)
