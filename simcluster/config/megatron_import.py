"""A Megatron-LM launch command line -> a scenario (`simcluster import-megatron`).

Megatron's argparse names map onto the scenario's keys, which use Megatron's vocabulary;
`megatron_flags` sorts every flag into used / ignored / not modelled / unknown. A flag that
sets a key the simulator does not price yet (`scenario.NOT_MODELLED_YET`) is "not modelled":
the key keeps its default in the scenario (which then loads and runs), and `requested` keeps
the mapping as the command line asked for it. Data parallelism is not a Megatron flag:
Megatron-core derives dp = world size / (tp · cp · pp). The world size comes from
`--world-size`, an explicit `num_gpus`, or torchrun's `--nnodes` × `--nproc_per_node`;
without any, dp = 1 with a note.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from simcluster.config.choices import Dtype
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import HardwareProfile
from simcluster.config.megatron_cmdline import FlagReader, collect_flags, shown, split_command_line
from simcluster.config.megatron_fields import read_environment, read_model, read_parallel, read_training
from simcluster.config.megatron_flags import (
    DEFAULT_HARDWARE,
    KEY_FLAGS,
    KEY_REASONS,
    NOT_MODELLED,
    REQUIRED,
    SOURCE,
    bucket,
)
from simcluster.config.megatron_moe import read_moe_and_attention, read_moe_parallel, read_moe_training
from simcluster.config.scenario import (
    NOT_MODELLED_YET_MESSAGE,
    Scenario,
    hardware_problems,
    parse_scenario,
    profiles_with,
    unpriced_keys,
)


@dataclass(frozen=True, slots=True)
class MegatronImport:
    """The scenario mapping and what happened to every flag. `requested` is the mapping the
    command line asks for, keys not priced yet included. `scenario` is `requested` with those
    keys at their defaults, validated; where the layout needs them (an uneven pipeline split),
    it is `requested` itself, which `simcluster run` refuses by name (a note says so)."""

    scenario: dict[str, Any]
    notes: tuple[str, ...]
    ignored: tuple[str, ...]
    not_modelled: tuple[str, ...]
    unknown: tuple[str, ...]
    requested: dict[str, Any] = field(default_factory=dict)
    kept: tuple[str, ...] = ()  # not-modelled flags whose keys the scenario keeps (run refuses it)

    def validated(self) -> Scenario:
        return parse_scenario(self.scenario, SOURCE)

    def comment_lines(self) -> list[str]:
        """What a reader must know about the import, one line each (also printed to stderr)."""
        lines = [f"note: {note}" for note in self.notes]
        if self.ignored:
            lines.append(f"ignored (no effect on the simulation): {' '.join(self.ignored)}")
        for flag in self.not_modelled:
            if flag.split()[0].removeprefix("--").rstrip(":") in self.kept:
                lines.append(
                    f"not modelled (kept as given; `simcluster run` refuses it until priced): {flag}"
                )
            else:
                lines.append(f"not modelled (simulated without it): {flag}")
        if self.unknown:
            lines.append(f"unknown flags (not recognised, not used): {' '.join(self.unknown)}")
        return lines

    def to_yaml(self) -> str:
        header = ["Scenario imported from a Megatron-LM command line by `simcluster import-megatron`."]
        comments = "".join(f"# {line}\n" for line in header + self.comment_lines())
        return comments + yaml.safe_dump(self.scenario, sort_keys=False)


DEFAULTED_HARDWARE_NOTE = (
    f"hardware: {DEFAULT_HARDWARE}, import-megatron's default (a launch line names no GPU)"
)


def hardware_refusals(imported: MegatronImport, profile: HardwareProfile) -> list[str]:
    """What the imported run needs that `profile` cannot price (`scenario.hardware_problems`:
    flash attention or FP8 on a GPU without them), so that `import-megatron` refuses a
    scenario `run` would refuse; where the profile was the default rather than the user's
    choice, the last line says so and how to choose."""
    scenario = parse_scenario(imported.scenario, SOURCE, refuse_unpriced=False)
    problems = hardware_problems(scenario, profile)
    if problems and any(note.startswith(DEFAULTED_HARDWARE_NOTE) for note in imported.notes):
        able = profiles_with(lambda other: not hardware_problems(scenario, other))
        problems.append(
            f"no --hardware was given, so the default {DEFAULT_HARDWARE} was used and the line needs a "
            f"newer GPU: pass --hardware with a profile that can price it ({', '.join(able) or 'none found'})"
        )
    return problems


def _sort_flags(flags: dict[str, list[str]], demoted: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """The flags not read into the scenario, shown as written, by bucket."""
    buckets: dict[str, list[str]] = {"ignored": [], "not_modelled": [], "unknown": []}
    for flag, values in flags.items():
        kind = "not_modelled" if flag in demoted else bucket(flag)
        if kind == "not_modelled":
            reason = demoted.get(flag) or NOT_MODELLED.get(flag, "not modelled")
            buckets[kind].append(f"{shown(flag, values)}: {reason}")
        elif kind != "used":
            buckets[kind].append(shown(flag, values))
    return {kind: tuple(flags_shown) for kind, flags_shown in buckets.items()}


def _checked(requested: dict[str, Any], notes: list[str]) -> Scenario:
    """The requested mapping under every rule but the refusal of keys not priced yet."""
    try:
        return parse_scenario(requested, SOURCE, refuse_unpriced=False)
    except ConfigError as error:  # show how the offending values were derived
        raise ConfigError(SOURCE, error.problems + [f"note: {note}" for note in notes]) from None


# Keys that only mean something beside another's value: reset with it (FP8 / FP4 training
# simulated in bf16 drops its recipe and its low-precision parameter gather).
_COMPANIONS = {
    "training.dtype": (
        "training.fp8_recipe", "training.fp8_param_gather",
        "training.fp4_recipe", "training.fp4_param_gather",
    ),
    # a refused flex dispatcher takes its backend with it (alltoall has none)
    "training.moe_token_dispatcher": ("training.moe_flex_dispatcher_backend",),
}  # fmt: skip


def _reset(mapping: dict[str, Any], key: str) -> None:
    """`key` back at its default in `mapping`."""
    section, name = key.split(".")
    if key == "training.dtype":
        mapping[section][name] = Dtype.BF16.value  # FP8 keeps bf16 outside its GEMMs
    else:
        mapping[section].pop(name, None)


def _without_unpriced(
    requested: dict[str, Any], scenario: Scenario, flags: dict[str, list[str]], demoted: dict[str, str]
) -> dict[str, Any]:
    """The mapping with each key the simulator does not price yet back at its default; the
    flags that set it become "not modelled"."""
    runnable = copy.deepcopy(requested)
    for key in unpriced_keys(scenario):
        _reset(runnable, key)
        for flag in KEY_FLAGS.get(key, ()):  # a key no flag sets has none to list
            if flag in flags:
                demoted[flag] = f"{KEY_REASONS.get(key, key)}; {key} is {NOT_MODELLED_YET_MESSAGE}"
    return runnable


def _without_refused_for_moe(
    requested: dict[str, Any], flags: dict[str, list[str]], demoted: dict[str, str], notes: list[str]
) -> dict[str, Any]:
    """The mapping with each key the scenario's rules refuse as not modelled yet for this
    model (`scenario.moe_problems`: "training.moe_token_dispatcher: value allgather: not
    modelled … for a MoE model") back at its default, its flags "not modelled", as for the
    keys of NOT_MODELLED_YET. Read from the scenario's own refusals, so a value the
    simulator learns to price is kept without a change here; a refused value that is
    already the default stays, and the scenario's error says why."""
    try:
        parse_scenario(requested, SOURCE, refuse_unpriced=False)
        return requested
    except ConfigError as error:
        problems = [problem for problem in error.problems if NOT_MODELLED_YET_MESSAGE in problem]
    runnable = copy.deepcopy(requested)
    for key in KEY_FLAGS:
        section, name = key.split(".")
        refusal = next((p for p in problems if p.startswith(f"{key}: value ")), None)
        if refusal is None or name not in requested[section]:  # at its default: nothing to drop
            continue
        reason = f"{KEY_REASONS.get(key, key)}; {refusal}"
        keys = (key, *_COMPANIONS.get(key, ()))
        for reset in keys:
            _reset(runnable, reset)
        given = [flag for reset in keys for flag in KEY_FLAGS[reset] if flag in flags]
        demoted.update(dict.fromkeys(given, reason))
        if not given:  # Megatron's default, e.g. the allgather dispatcher
            notes.append(f"{reason}; no flag set it (Megatron's default): the scenario keeps its default")
    return runnable


def parse_megatron_args(
    command: str | Sequence[str],
    hardware: str | None = DEFAULT_HARDWARE,
    name: str = "megatron-import",
    num_gpus: int | None = None,
) -> MegatronImport:
    """Turn a Megatron-LM launch command line into a validated scenario mapping.

    Raises ConfigError naming every problem (a missing required flag, a bad value, a layout
    the scenario rules reject). `num_gpus` overrides any world size on the command line.
    `hardware` None: a launch line names no GPU, so `DEFAULT_HARDWARE` is used and a note
    says so (`import-megatron` without `--hardware`).
    """
    words = split_command_line(command)
    flags, repeated, launcher = collect_flags(words)
    notes = [f"--{flag} given more than once; the last value is used" for flag in repeated]
    if hardware is None:
        hardware = DEFAULT_HARDWARE
        notes.append(f"{DEFAULTED_HARDWARE_NOTE}; pass --hardware for another GPU")
    notes += [
        f"unexpanded shell variable {w}: expand it before importing" for w in words if w.startswith("$")
    ]
    missing = [f"--{flag}" for flag in REQUIRED if flag not in flags]
    if "--seq-length" in missing and "encoder-seq-length" in flags:
        missing.remove("--seq-length")
    if missing:
        raise ConfigError(SOURCE, [f"required flag missing: {flag}" for flag in missing])
    read = FlagReader(flags)
    demoted: dict[str, str] = {}
    tp = read.integer("tensor-model-parallel-size") or 1
    model = read_model(read, tp, notes)
    read_moe_and_attention(read, model, notes, demoted)
    parallel = read_parallel(read, model.get("num_layers") or 1, num_gpus, notes)
    read_moe_parallel(read, parallel)
    training = read_training(read, parallel["dp"], notes, demoted)
    read_moe_training(read, training, "moe" in model, notes)
    read_environment(launcher, training, notes)
    if read.problems:
        raise ConfigError(SOURCE, read.problems)
    requested = {
        "name": name,
        "hardware": hardware,
        "model": model,
        "parallel": parallel,
        "training": training,
    }
    priced = _without_refused_for_moe(requested, flags, demoted, notes)
    full = _checked(priced, notes)
    scenario = _without_unpriced(priced, full, flags, demoted)
    kept: tuple[str, ...] = ()
    if scenario != priced:
        try:
            parse_scenario(scenario, SOURCE)
        except ConfigError as error:  # e.g. 126 layers on pp 16 x vpp 8 need the uneven split
            notes.append(
                f"the run cannot be simulated without the keys not priced yet ({'; '.join(error.problems)}): "
                "the scenario keeps them as given, and `simcluster run` refuses it until they are priced"
            )
            scenario = copy.deepcopy(priced)
            kept = tuple(
                flag for key in unpriced_keys(full) for flag in KEY_FLAGS.get(key, ()) if flag in flags
            )
        else:
            if full.parallel.cp > 1 and "cp" not in scenario["parallel"]:
                notes.append(
                    f"cp {full.parallel.cp} is not simulated yet: {full.num_gpus // full.parallel.cp} "
                    f"of the run's {full.num_gpus} GPUs (tp * pp * dp) are"
                )
    return MegatronImport(
        scenario=scenario, notes=tuple(notes), requested=requested, kept=kept, **_sort_flags(flags, demoted)
    )
