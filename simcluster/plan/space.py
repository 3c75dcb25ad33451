"""What `simcluster plan` searches: every layout of a model on N GPUs that Megatron accepts.

The base scenario fixes the model, the global batch, dtype, sequence length and hardware;
the plan varies the axes in `PLAN_AXES` (each a sweep axis of `simcluster.sweep.axes`, so
its values come from the same `auto` rule a sweep uses), sets dp = N / (tp · pp) and the
1F1B schedule (interleaved when vpp > 1; Megatron has no GPipe), and keeps a combination
only if the scenario loader's own cross-field rules (`cross_field_problems`) accept it:
one source of truth for what Megatron allows. Adding an axis (cp, ep, …) is adding its
name to `PLAN_AXES` once it is a sweep axis.

Two restrictions of the search, not of Megatron, stated here and in the README:
- tp stays within a node (tp ≤ gpus_per_node): tensor parallelism across nodes puts its
  per-layer collectives on the NICs, which no published run does.
- the distributed optimizer and overlap_grad_reduce are only tried with dp > 1: without
  data parallelism they change nothing, and would only repeat a layout in the top K.
Values of the numeric axes are capped as in sweeps: vpp ≤ 8 and micro_batch_size ≤ 16.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from typing import Any

from simcluster.config.choices import ScheduleKind
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario, cross_field_problems
from simcluster.sweep.axes import AXES, AutoContext, AxisValue, divisors

PLAN_AXES: tuple[str, ...] = (
    "tp",
    "pp",
    "vpp",
    "micro_batch_size",
    "sequence_parallel",
    "recompute",
    "use_distributed_optimizer",
    "overlap_grad_reduce",
)
"""The searched axes, in the order of a candidate's layout (and the output's columns)."""

DP_ONLY_AXES = ("use_distributed_optimizer", "overlap_grad_reduce")


class PlanError(ValueError):
    """Input `simcluster plan` cannot answer; the message names the option and value."""


@dataclass(frozen=True, slots=True)
class SearchSpace:
    base: Scenario
    hardware: HardwareProfile
    num_gpus: int
    values: dict[str, tuple[AxisValue, ...]]  # per axis in PLAN_AXES

    @property
    def num_combinations(self) -> int:
        count = 1
        for values in self.values.values():
            count *= len(values)
        return count


def search_space(base: Scenario, hardware: HardwareProfile, num_gpus: int) -> SearchSpace:
    context = AutoContext(base=base, num_gpus=num_gpus, global_batch_sizes=(base.training.global_batch_size,))
    values: dict[str, tuple[AxisValue, ...]] = {}
    for name in PLAN_AXES:
        auto = AXES[name].auto
        assert auto is not None, f"plan axis {name} has no auto values"
        values[name] = auto(context)
    values["tp"] = tuple(t for t in values["tp"] if int(t) <= hardware.network.gpus_per_node)
    return SearchSpace(base=base, hardware=hardware, num_gpus=num_gpus, values=values)


def _scenario(base: dict[str, Any], layout: dict[str, AxisValue], dp: int) -> Scenario:
    """`base` (a scenario's JSON form) with the layout's values, dp and the 1F1B schedule."""
    parallel = {name: layout[name] for name in PLAN_AXES if AXES[name].section == "parallel"}
    training = {name: layout[name] for name in PLAN_AXES if AXES[name].section == "training"}
    data = {
        **base,
        "parallel": {**base["parallel"], **parallel, "dp": dp},
        "training": {**base["training"], **training, "schedule": ScheduleKind.ONE_F_ONE_B.value},
    }
    return Scenario.model_validate(data)


def candidates(space: SearchSpace) -> Iterator[Scenario]:
    """Every layout in the space that uses exactly `num_gpus` GPUs and that the scenario
    loader accepts, in `product()` order of `PLAN_AXES`."""
    names = list(space.values)
    base = space.base.model_dump(mode="json")
    for combination in product(*space.values.values()):
        layout = dict(zip(names, combination))
        tp, pp = int(layout["tp"]), int(layout["pp"])
        if space.num_gpus % (tp * pp):
            continue
        dp = space.num_gpus // (tp * pp)
        if dp == 1 and any(layout[name] for name in DP_ONLY_AXES):
            continue
        scenario = _scenario(base, layout, dp)
        if not cross_field_problems(scenario):
            yield scenario


def usable_gpu_counts(space: SearchSpace, near: int, span: int = 64) -> tuple[int | None, int | None]:
    """The closest GPU counts below and above `near` that some (tp, pp, dp) of this model
    and batch can use (micro_batch_size 1; None if none within `span`)."""
    base = space.base
    tps = [t for t in divisors(base.model.num_attention_heads) if t <= space.hardware.network.gpus_per_node]
    tps = [t for t in tps if base.model.ffn_size % t == 0]
    pps, dps = divisors(base.model.num_layers), divisors(base.training.global_batch_size)
    sizes = {t * p * d for t in tps for p in pps for d in dps}
    below = max((n for n in sizes if near - span <= n < near), default=None)
    above = min((n for n in sizes if near < n <= near + span), default=None)
    return below, above


def explain_no_layout(space: SearchSpace) -> str:
    """Why no layout uses `num_gpus` GPUs: the rules, and the nearest counts that work."""
    m, training = space.base.model, space.base.training
    below, above = usable_gpu_counts(space, space.num_gpus)
    near = " or ".join(str(n) for n in (below, above) if n is not None)
    return (
        f"--gpus: value {space.num_gpus}: no layout of this model uses exactly {space.num_gpus} GPUs. "
        f"The GPU count must be tp * pp * dp with tp dividing num_attention_heads ({m.num_attention_heads}) "
        f"and ffn_hidden_size ({m.ffn_size}) and at most gpus_per_node "
        f"({space.hardware.network.gpus_per_node}), pp dividing num_layers ({m.num_layers}), and "
        f"dp dividing global_batch_size ({training.global_batch_size}) with at least one sample "
        f"per micro-batch; {f'usable counts near it: {near}' if near else 'no usable count within 64 of it'}"
    )
