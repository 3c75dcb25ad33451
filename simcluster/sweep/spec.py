"""Sweep spec files (a public contract):

```yaml
base: ../scenarios/paper/gpt3-175b.yaml   # a scenario file, relative to the spec, or a
                                           # shipped scenario's name (gpt3-175b-sp-selective),
                                           # or a list of them (one model each)
num_gpus: 1024                             # dp = num_gpus / (tp * cp * pp), cp the base's
axes:                                      # each a list, or auto = every valid value
  tp: [1, 2, 4, 8]
  pp: auto
  recompute: [none, selective, full]
  hardware: [a100-sxm4-80gb, h100-sxm5-80gb]   # profile names or .yaml paths
  seq_length: [2048, 4096]
```

Axes not named keep each base scenario's value. With several bases, `auto` lists every
value any of them allows (the loader then drops what a model does not allow) and the
`model` column (each base's `name`, so names must differ) tells their rows apart. Errors
name the spec file, the field, the value and what is allowed, like the scenario loader's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from simcluster.config.errors import ConfigError, describe_validation_error
from simcluster.config.files import read_yaml
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.profiles import find_profile
from simcluster.config.scenario import Scenario, load_scenario
from simcluster.config.shipped import did_you_mean, shipped_scenario, shipped_scenario_names
from simcluster.config.strict import StrictModel
from simcluster.sweep.axes import AXES, AutoContext, Axis, AxisValue

AUTO = "auto"
MAX_COMBINATIONS = 1_000_000  # each is validated (and most simulated): ~1.5 h at 200/s per worker


class _SpecFile(StrictModel):
    """The file's shape; axis values are checked against `AXES` afterwards."""

    base: str | list[str] = Field(description="a scenario file, or a list of them (one model each)")
    num_gpus: int | None = Field(default=None, gt=0, description="default: the base scenarios' tp·pp·dp")
    axes: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A loaded spec: the base scenarios (`base` is the first, `hardware` its profile), the
    GPU count, each axis's values (only the named axes, in `AXES` order; `auto` already
    expanded), and every hardware profile a configuration names, keyed by its reference
    (`Scenario.hardware`: the base's, or the `hardware` axis's values)."""

    source: Path
    base: Scenario
    hardware: HardwareProfile
    num_gpus: int
    axes: dict[str, tuple[AxisValue, ...]]
    bases: tuple[Scenario, ...] = ()
    profiles: dict[str, HardwareProfile] = field(default_factory=dict)
    input_files: tuple[Path, ...] = ()  # the spec, base and profile files: never an output

    def __post_init__(self) -> None:
        if not self.bases:
            object.__setattr__(self, "bases", (self.base,))
        if not self.profiles:
            object.__setattr__(self, "profiles", {self.base.hardware: self.hardware})

    @property
    def num_combinations(self) -> int:
        count = 1
        for values in self.axes.values():
            count *= len(values)
        return count


def _axis_values(name: str, raw: list[Any], problems: list[str]) -> tuple[AxisValue, ...]:
    axis, values = AXES[name], []
    if not raw:
        auto = " or `auto`" if axis.auto else ""
        problems.append(f"axes.{name}: empty list; give at least one value{auto}")
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


def _auto_values(axis: Axis, contexts: list[AutoContext]) -> tuple[AxisValue, ...]:
    """Every value `auto` gives for any base (numbers sorted, choices in declaration order)."""
    assert axis.auto is not None
    found = tuple(dict.fromkeys(value for context in contexts for value in axis.auto(context)))
    return tuple(sorted(found)) if axis.kind is int else found


def _no_auto_reason(name: str) -> str:
    if name == "etp":
        return "expert tensor parallelism needs a base with model.moe"
    return "the base scenarios allow none"


def _resolve_axes(
    raw: dict[str, Any], bases: tuple[Scenario, ...], num_gpus: int, problems: list[str]
) -> dict[str, tuple[AxisValue, ...]]:
    unknown = [name for name in raw if name not in AXES]
    for name in unknown:
        hint = " (dp follows from num_gpus / (tp * cp * pp))" if name == "dp" else ""
        problems.append(f"axes.{name}: unknown axis{hint}; allowed: {', '.join(AXES)}")
    for name, values in raw.items():
        if name in AXES and values != AUTO and not isinstance(values, list):
            problems.append(f"axes.{name}: value {values!r}: must be a list of values or `auto`")
    listed = {
        name: _axis_values(name, values, problems)
        for name, values in raw.items()
        if name in AXES and isinstance(values, list)
    }
    listed_batches = tuple(int(b) for b in listed.get("global_batch_size", ()))
    contexts = [
        AutoContext(base, num_gpus, listed_batches or (base.training.global_batch_size,)) for base in bases
    ]
    resolved: dict[str, tuple[AxisValue, ...]] = {}
    for name, axis in AXES.items():
        if name in listed:
            resolved[name] = listed[name]
        elif raw.get(name) == AUTO:
            if axis.auto is None:
                problems.append(f"axes.{name}: value 'auto': not available for this axis; list the values")
            elif not (values := _auto_values(axis, contexts)):
                problems.append(
                    f"axes.{name}: value 'auto': no value for these bases ({_no_auto_reason(name)})"
                )
            else:
                resolved[name] = values
    return resolved


def parse_sweep_spec(data: Any, source: str | Path) -> SweepSpec:
    """Validate a spec mapping read from `source` (its folder anchors `base`)."""
    source = Path(source)
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): a sweep spec must be a mapping of keys"])
    try:
        raw = _SpecFile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error, _SpecFile)) from None
    paths = _base_paths(raw.base, source)
    bases = tuple(load_scenario(path) for path in paths)
    problems = _name_clashes(bases, raw.base)
    num_gpus = raw.num_gpus or _common_num_gpus(bases, paths, problems)
    axes = _resolve_axes(dict(raw.axes), bases, num_gpus, problems)
    profiles = _profiles(bases, paths, axes.get("hardware"), source, problems)
    profile_files = _profile_files(bases, paths, axes.get("hardware"), source)
    if problems:
        raise ConfigError(source, problems)
    spec = SweepSpec(
        source=source,
        base=bases[0],
        hardware=profiles[str(axes["hardware"][0]) if "hardware" in axes else bases[0].hardware],
        num_gpus=num_gpus,
        axes=axes,
        bases=bases,
        profiles=profiles,
        input_files=(source, *paths, *profile_files),
    )
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


def _base_paths(raw: str | list[str], source: Path) -> list[Path]:
    """The base scenario files, relative to the spec's folder, else shipped scenarios by
    name (`simcluster.config.shipped`); ConfigError if one is missing."""
    names = [raw] if isinstance(raw, str) else raw
    problems = [] if names else ["base: empty list; give a scenario file, or a list of them"]
    paths = []
    for index, name in enumerate(names):
        where = "base" if isinstance(raw, str) else f"base[{index}]"
        path = source.parent / name
        if not path.is_file() and (shipped := shipped_scenario(name)) is not None and shipped.is_file():
            path = shipped
        if not path.is_file():
            hint = did_you_mean(name, shipped_scenario_names())
            problems.append(
                f"{where}: value {name!r}: no scenario file at {source.parent / name}, "
                f"nor a shipped scenario{hint}"
            )
        elif names.index(name) != index:
            problems.append(f"{where}: value {name!r}: listed twice")
        paths.append(path)
    if problems:
        raise ConfigError(source, problems)
    return paths


def _profile_files(
    bases: tuple[Scenario, ...], paths: list[Path], axis: tuple[AxisValue, ...] | None, source: Path
) -> list[Path]:
    """The profile files `_profiles` reads (those it can find), for the output check."""
    wanted = (
        [(str(value), source) for value in axis]
        if axis is not None
        else [(base.hardware, path) for base, path in zip(bases, paths)]
    )
    found = []
    for reference, relative_to in wanted:
        try:
            found.append(find_profile(reference, relative_to))
        except ConfigError:
            continue  # `_profiles` reports it
    return found


def _name_clashes(bases: tuple[Scenario, ...], raw: str | list[str]) -> list[str]:
    """Rows tell models apart by the base's `name`: two bases may not share one."""
    names = [base.name for base in bases]
    return [
        f"base[{index}]: value {raw[index]!r}: its scenario name {name!r} is also "
        f"base[{names.index(name)}]'s; the model column tells rows apart by name: "
        "give each base a distinct `name`"
        for index, name in enumerate(names)
        if names.index(name) != index and isinstance(raw, list)
    ]


def _common_num_gpus(bases: tuple[Scenario, ...], paths: list[Path], problems: list[str]) -> int:
    counts = {base.num_gpus for base in bases}
    if len(counts) > 1:
        found = ", ".join(f"{path.name} {base.num_gpus}" for path, base in zip(paths, bases))
        problems.append(f"num_gpus: missing, and the bases use different GPU counts ({found}); give num_gpus")
    return bases[0].num_gpus


def _profiles(
    bases: tuple[Scenario, ...],
    paths: list[Path],
    axis: tuple[AxisValue, ...] | None,
    source: Path,
    problems: list[str],
) -> dict[str, HardwareProfile]:
    """Every profile a configuration names, by reference: the `hardware` axis's values
    (relative to the spec), else each base's own (relative to that base)."""
    wanted = (
        [(str(value), source, f"axes.hardware: value {value!r}") for value in axis]
        if axis is not None
        else [(base.hardware, path, f"base {path.name}: hardware") for base, path in zip(bases, paths)]
    )
    profiles: dict[str, HardwareProfile] = {}
    for reference, relative_to, where in wanted:
        try:
            profile = load_hardware(reference, relative_to=relative_to)
        except ConfigError as error:
            problems.extend(f"{where}: {problem}" for problem in error.problems)
            continue
        if profiles.setdefault(reference, profile) != profile:
            problems.append(
                f"{where}: {reference!r} names another profile file than an earlier base's "
                "reference of the same spelling; spell the profile the same way for the same file"
            )
    return profiles


def load_sweep_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    return parse_sweep_spec(read_yaml(path), path)
