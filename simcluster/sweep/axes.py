"""The sweepable axes: which scenario field each one sets, what values it takes, and what
`auto` expands to.

`dp` is not an axis: a sweep fixes the GPU count and `dp = num_gpus / (tp · cp · pp)`
with the base's cp (Megatron: world size = t · c · p · d). `auto` lists candidate values
from the model shape (pp / vpp from the pipeline split rules with the base's split flags);
the loader's cross-field rules (`cross_field_problems`) then drop the combinations that do
not fit together, so a sweep stays `product()` plus a filter.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from simcluster.config.choices import Dtype, Recompute, ScheduleKind
from simcluster.config.errors import shorten
from simcluster.config.pipeline_split import SplitRequest, split_problems
from simcluster.config.scenario import Scenario, divisors
from simcluster.config.strict import MAX_INT

MAX_AUTO_VPP = 8  # interleaving beyond 8 chunks per stage is not used in practice (Narayanan 2021)
MAX_AUTO_MICRO_BATCH_SIZE = 16

AxisValue = int | bool | str


@dataclass(frozen=True, slots=True)
class AutoContext:
    """What `auto` may look at: the base scenario, the GPU count, the global batch sizes."""

    base: Scenario
    num_gpus: int
    global_batch_sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Axis:
    """One sweepable scenario field. `kind` is int (positive), bool, or an Enum of choices."""

    name: str
    section: Literal["parallel", "training", "model", "scenario"]  # scenario: a top-level key
    kind: type
    auto: Callable[[AutoContext], tuple[AxisValue, ...]] | None

    def base_value(self, base: Scenario) -> AxisValue:
        owner = base if self.section == "scenario" else getattr(base, self.section)
        value = getattr(owner, self.name)
        return value.value if isinstance(value, enum.Enum) else value

    def allowed(self) -> str:
        if self.kind is bool:
            return "true, false"
        if self.kind is str:
            return "a hardware profile name (e.g. h100-sxm5-80gb) or a path ending in .yaml"
        if issubclass(self.kind, enum.Enum):
            return ", ".join(member.value for member in self.kind)
        return f"positive integers up to {MAX_INT:,}"

    def parse(self, value: Any) -> AxisValue:
        """The canonical value (enum members as their file spelling); ValueError if not allowed."""
        if self.kind is bool:
            if isinstance(value, bool):
                return value
        elif self.kind is str:
            if isinstance(value, str) and value.strip():
                return value
        elif issubclass(self.kind, enum.Enum):
            if isinstance(value, str) and value in {member.value for member in self.kind}:
                return str(value)
        elif isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_INT:
            return value
        raise ValueError(f"value {shorten(value)}: allowed: {self.allowed()}")


def _tp(ctx: AutoContext) -> tuple[int, ...]:
    heads = ctx.base.model.num_attention_heads
    return tuple(d for d in divisors(heads) if ctx.num_gpus % d == 0)


def split_values(base: Scenario, num_gpus: int | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The pp and vpp values the pipeline split accepts with `base`'s split flags
    (`split_problems`, the scenario loader's own rules): pp ≤ num_layers divides the GPU count
    (any pp ≤ num_layers when `num_gpus` is None) and some vpp ≤ 8 splits the layers with it;
    vpp ≤ 8 splits them with some such pp (pp 1 included). Without split flags these are the
    divisors of num_layers; with
    account_for_embedding / account_for_loss_in_pipeline_split, Llama 3 405B's 126 layers
    (128 counted) take pp 16 × vpp 8 (Megatron-core get_num_layers_to_build). A
    `parallel.pipeline_layout` is kept, never dropped: only the (pp, vpp) it fits are accepted
    (pp · vpp its stage count, Megatron's MTP rule), so a layout of 32 stages searches pp 8 ×
    vpp 4, pp 16 × vpp 2, ... and nothing else."""
    par, layers = base.parallel, base.model.num_layers

    def accepts(pp: int, vpp: int) -> bool:
        request = SplitRequest(
            num_layers=layers,
            pp=pp,
            vpp=vpp,
            account_for_embedding=par.account_for_embedding_in_pipeline_split,
            account_for_loss=par.account_for_loss_in_pipeline_split,
            first_pipeline_num_layers=par.first_pipeline_num_layers,
            last_pipeline_num_layers=par.last_pipeline_num_layers,
            pipeline_layout=par.pipeline_layout,
            mtp_num_layers=base.model.mtp_num_layers,
        )
        return not split_problems(request)

    vpp_range = range(1, min(layers, MAX_AUTO_VPP) + 1)
    pp_range = range(1, layers + 1) if num_gpus is None else divisors(num_gpus, min(num_gpus, layers))
    pps = tuple(p for p in pp_range if any(accepts(p, v) for v in vpp_range))
    vpps = tuple(v for v in vpp_range if any(accepts(p, v) for p in pps))
    return pps, vpps


def _pp(ctx: AutoContext) -> tuple[int, ...]:
    return split_values(ctx.base, ctx.num_gpus)[0]


def _vpp(ctx: AutoContext) -> tuple[int, ...]:
    return split_values(ctx.base, ctx.num_gpus)[1]


def _micro_batch_size(ctx: AutoContext) -> tuple[int, ...]:
    found = {
        d for batch in ctx.global_batch_sizes for d in divisors(batch, min(batch, MAX_AUTO_MICRO_BATCH_SIZE))
    }
    return tuple(sorted(found))


def _ep(ctx: AutoContext) -> tuple[int, ...]:
    """Expert parallelism: the divisors of num_experts that divide num_gpus (1 for a dense
    model). Whether ep · etp divides a layout's tp · cp · dp (Megatron-core's MoE parallel
    folding) is the loader's rule, applied to each combination."""
    moe = ctx.base.model.moe
    if moe is None:
        return (1,)
    return tuple(d for d in divisors(moe.num_experts) if ctx.num_gpus % d == 0)


def _etp(ctx: AutoContext) -> tuple[int, ...]:
    """Expert tensor parallelism: 1 and the tp values (Megatron's common choices are etp 1
    and etp = tp, its default); none for a dense model, which has no experts to split."""
    if ctx.base.model.moe is None:
        return ()
    return tuple(sorted({1, *_tp(ctx)}))


def _both(_: AutoContext) -> tuple[bool, ...]:
    return (False, True)


def _members(choices: type[enum.Enum]) -> Callable[[AutoContext], tuple[str, ...]]:
    return lambda _: tuple(member.value for member in choices)


AXES: dict[str, Axis] = {
    axis.name: axis
    for axis in (
        Axis("tp", "parallel", int, _tp),
        Axis("pp", "parallel", int, _pp),
        Axis("vpp", "parallel", int, _vpp),
        Axis("micro_batch_size", "training", int, _micro_batch_size),
        Axis("global_batch_size", "training", int, None),
        Axis("sequence_parallel", "parallel", bool, _both),
        Axis("recompute", "training", Recompute, _members(Recompute)),
        Axis("schedule", "training", ScheduleKind, _members(ScheduleKind)),
        Axis("dtype", "training", Dtype, _members(Dtype)),
        Axis("overlap_grad_reduce", "training", bool, _both),
        Axis("use_distributed_optimizer", "training", bool, _both),
        Axis("seq_length", "model", int, None),
        Axis("hardware", "scenario", str, None),
        Axis("ep", "parallel", int, _ep),
        Axis("etp", "parallel", int, _etp),
    )
}
"""Every sweepable axis, in the order of a configuration id and of the result columns.
`ep` and `etp` (a MoE model's expert layout, docs/moe.md) come last, and a configuration id
leaves them out at their defaults (ep 1, etp null = tp): the ids of every table written
before they were axes stay the same (`simcluster.sweep.expand.config_id`)."""

EXPERT_AXIS_DEFAULTS: dict[str, AxisValue | None] = {"ep": 1, "etp": None}
"""The expert axes' scenario defaults: a dense model's values, left out of a configuration id."""

MODEL_COLUMN = "model"
"""The base scenario's `name`: which of the spec's base files (models) a row comes from."""

LAYOUT_COLUMNS: tuple[str, ...] = (
    "tp", "pp", "dp", *(name for name in AXES if name not in ("tp", "pp")), MODEL_COLUMN
)  # fmt: skip
"""A configuration's full layout: the axes, the derived dp and the model, in table order."""


def choice_order(column: str) -> dict[str, int] | None:
    """Rank of each choice of an enum axis in declaration order (none < selective < full),
    so tables sort the way the paper lists them; None for numeric and boolean columns."""
    axis = AXES.get(column)
    if axis is None or not issubclass(axis.kind, enum.Enum):
        return None
    return {member.value: rank for rank, member in enumerate(axis.kind)}
