"""Scenario files: a model, a parallel layout, a training setup and a hardware profile.

The YAML keys are a public contract (Megatron's names). Unknown keys are errors; every
cross-field rule is checked at load and reported with the file, the field, the value and
what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from simcluster.config.choices import Dtype, Recompute, ScheduleKind
from simcluster.config.errors import ConfigError, describe_validation_error
from simcluster.config.files import read_yaml
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.layer_shape import Indivisible, ffn_hidden_size_or_default, indivisible_sizes
from simcluster.config.strict import StrictModel

MAX_SIMULATED_TASKS = 1_000_000
"""Most pipeline tasks (2 · pp · vpp · m: a forward and a backward per microbatch and
chunk on every stage) one simulation may build. Each task costs the engine about 0.6 kB
and 7-50 µs, so this bounds a run near 1 GB and a minute on a shared 2-core machine; the
largest paper scenario (1T: 64 stages × 512 microbatches) has 65,536."""


class ModelSpec(StrictModel):
    """Transformer shape (Korthikanti Table 1: L, h, a, s, v)."""

    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    ffn_hidden_size: int | None = Field(default=None, gt=0, description="default 4 * hidden_size")

    @property
    def ffn_size(self) -> int:
        return ffn_hidden_size_or_default(self.hidden_size, self.ffn_hidden_size)


class ParallelSpec(StrictModel):
    """Tensor (t), pipeline (p), data (d) and virtual-pipeline (m in the paper) degrees."""

    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    dp: int = Field(default=1, gt=0)
    vpp: int = Field(default=1, gt=0)
    sequence_parallel: bool = False


class TrainingSpec(StrictModel):
    micro_batch_size: int = Field(gt=0)
    global_batch_size: int = Field(gt=0)
    recompute: Recompute = Recompute.NONE
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B
    dtype: Dtype = Dtype.BF16
    overlap_grad_reduce: bool = Field(
        default=False, description="overlap the DP gradient all-reduce with the last backwards"
    )
    use_distributed_optimizer: bool = Field(
        default=False, description="shard optimizer state over DP (Megatron's distributed optimizer)"
    )


class Scenario(StrictModel):
    name: str
    hardware: str
    model: ModelSpec
    parallel: ParallelSpec
    training: TrainingSpec

    @property
    def num_gpus(self) -> int:
        return self.parallel.tp * self.parallel.pp * self.parallel.dp

    @property
    def num_microbatches(self) -> int:
        """m = B / (b · d) (Megatron)."""
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)

    @property
    def layers_per_chunk(self) -> int:
        return self.model.num_layers // (self.parallel.pp * self.parallel.vpp)


def divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    """The divisors of n (at most `limit`) in order, by trial division up to √n (n is at
    most 2³¹ - 1 here, so this is at most ~46,000 steps, never a loop over n)."""
    if limit is not None and limit * limit < n:
        return tuple(d for d in range(1, limit + 1) if n % d == 0)
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    bound = n if limit is None else limit
    return tuple(x for x in small + large[::-1] if x <= bound)


def _divisors(n: int) -> str:
    values: list[object] = list(divisors(n))
    shown = values if len(values) <= 12 else values[:12] + ["…"]
    return ", ".join(str(v) for v in shown)


def _shape_problem(bad: Indivisible) -> str:
    """A layer-shape rule broken, phrased on the scenario field a user would change."""
    if bad.field == "hidden_size":
        return (
            f"model.hidden_size: value {bad.value}: must be divisible by num_attention_heads "
            f"({bad.divisor_value})"
        )
    if bad.field == "num_attention_heads":
        return (
            f"parallel.tp: value {bad.divisor_value}: must divide num_attention_heads "
            f"({bad.value}); allowed: {_divisors(bad.value)}"
        )
    if bad.field == "ffn_hidden_size":
        return f"parallel.tp: value {bad.divisor_value}: must divide ffn_hidden_size ({bad.value})"
    return (
        f"model.{bad.field}: value {bad.value}: must be divisible by {bad.divisor} ({bad.divisor_value}) "
        "with sequence_parallel"
    )


def _too_many_tasks(scenario: Scenario, tasks: int) -> str:
    par, tr = scenario.parallel, scenario.training
    per_step = tr.micro_batch_size * par.dp
    most = MAX_SIMULATED_TASKS // (2 * par.pp * par.vpp)
    if par.vpp > 1:  # interleaving needs m a multiple of pp
        most -= most % par.pp
    largest = most * per_step
    return (
        f"training.global_batch_size: value {tr.global_batch_size}: gives {scenario.num_microbatches:,} "
        f"microbatches, {tasks:,} pipeline tasks (2 * pp * vpp * m), over the {MAX_SIMULATED_TASKS:,} "
        f"one run simulates; simulate a smaller global_batch_size (at most {largest:,} here) and scale: "
        "past the pipeline fill the iteration time grows linearly in m, so two runs at m1 < m2 give "
        "t(m) = t(m2) + (m - m2) * (t(m2) - t(m1)) / (m2 - m1)"
    )


def cross_field_problems(scenario: Scenario) -> list[str]:
    """The rules pydantic's per-field checks cannot see (also used to filter sweeps)."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    problems: list[str] = []
    shape = indivisible_sizes(
        m.hidden_size, m.num_attention_heads, m.ffn_size, m.seq_length, par.tp, par.sequence_parallel
    )
    # The sequence rule is reported last, after the rules of the layout around the layer.
    problems += [_shape_problem(bad) for bad in shape if bad.field != "seq_length"]
    if m.num_layers % (par.pp * par.vpp):
        problems.append(
            f"model.num_layers: value {m.num_layers}: must be divisible by pp * vpp "
            f"({par.pp} * {par.vpp} = {par.pp * par.vpp})"
        )
    per_step = tr.micro_batch_size * par.dp
    if tr.global_batch_size % per_step:
        problems.append(
            f"training.global_batch_size: value {tr.global_batch_size}: must be a multiple of "
            f"micro_batch_size * dp ({tr.micro_batch_size} * {par.dp} = {per_step})"
        )
    elif (tasks := 2 * par.pp * par.vpp * scenario.num_microbatches) > MAX_SIMULATED_TASKS:
        problems.append(_too_many_tasks(scenario, tasks))
    elif par.vpp > 1 and tr.schedule is ScheduleKind.ONE_F_ONE_B and scenario.num_microbatches % par.pp:
        problems.append(
            f"parallel.vpp: value {par.vpp}: interleaved 1F1B needs the number of microbatches "
            f"({scenario.num_microbatches}) to be a multiple of pp ({par.pp})"
        )
    if par.vpp > 1 and par.pp == 1:
        problems.append(f"parallel.vpp: value {par.vpp}: interleaving needs pp > 1")
    if par.sequence_parallel and par.tp == 1:
        problems.append("parallel.sequence_parallel: value True: needs tp > 1")
    problems += [_shape_problem(bad) for bad in shape if bad.field == "seq_length"]
    return problems


def parse_scenario(data: Any, source: str | Path, default_name: str = "scenario") -> Scenario:
    """Validate a scenario mapping; raise ConfigError naming every problem at once."""
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): a scenario must be a mapping of keys"])
    data = {"name": default_name, **data}
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error)) from None
    problems = cross_field_problems(scenario)
    if problems:
        raise ConfigError(source, problems)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    return parse_scenario(read_yaml(path), path, default_name=path.stem)


def load_scenario_and_hardware(path: str | Path) -> tuple[Scenario, HardwareProfile]:
    path = Path(path)
    scenario = load_scenario(path)
    return scenario, load_hardware(scenario.hardware, relative_to=path)
