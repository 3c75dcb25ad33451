"""What `simcluster plan` searches: every layout of a model on N GPUs that Megatron accepts.

The base scenario fixes the model, the global batch, dtype, sequence length and hardware;
the plan varies the axes in `PLAN_AXES` (each a sweep axis of `simcluster.sweep.axes`, so
its values come from the same `auto` rule a sweep uses: pp / vpp are what the pipeline
split rules accept with the base's split flags, `split_values`; cp, not a sweep axis, is
computed here), sets dp = N / (tp · cp · pp) and the
1F1B schedule (interleaved when vpp > 1; Megatron has no GPipe), and keeps a combination
only if the scenario loader's own cross-field rules (`cross_field_problems`) accept it:
one source of truth for what Megatron allows. Adding an axis (ep, …) is adding its
name to `PLAN_AXES` once it is a sweep axis. cp is searched only with flash attention
(Megatron-core's ring runs inside TE's attention): without it cp is 1.

Two restrictions of the search, not of Megatron, stated here and in the README:
- tp and cp each stay within a node (≤ gpus_per_node): tensor parallelism across nodes puts its
  per-layer collectives on the NICs, which no published run does.
- the distributed optimizer and overlap_grad_reduce are only tried with dp > 1: without
  data parallelism they change nothing, and would only repeat a layout in the top K.
The base's switches that Megatron allows only on top of a searched axis follow that axis
(`_dependent_switches`): overlap_param_gather (needs the distributed optimizer and
overlap_grad_reduce), fp8_param_gather (the distributed optimizer) and tp_comm_overlap
(sequence parallelism at tp > 1) stay as the base sets them where the layout allows them and are off
where it does not. Otherwise a base asking for them, as Megatron's published large runs do,
would drop every layout without those axes (dp = 1 among them) from the search.
Values of the numeric axes are capped as in sweeps: vpp ≤ 8 and micro_batch_size ≤ 16.

A MoE model (`model.moe`) also searches its expert layout (docs/moe.md, "plan and sweep
over ep"): ep over the divisors of num_experts (the sweep axis's `auto`), etp over
Megatron's two common choices, 1 and tp (its default), written into each layout as a
number. Megatron-core folds the expert groups into tp · cp · dp, so the loader keeps a
layout only if ep · etp divides it. A dense model searches ep 1 and etp null (tp) only:
its layouts, their order and the answer are those of a search without the expert axes.
`choices` pins any axis to a list of values (the CLI's `--ep` / `--etp`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from simcluster.config.choices import AttentionBackend, ScheduleKind
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario, cross_field_problems
from simcluster.sweep.axes import AXES, AutoContext, AxisValue, divisors, split_values

PLAN_AXES: tuple[str, ...] = (
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "vpp",
    "micro_batch_size",
    "sequence_parallel",
    "recompute",
    "use_distributed_optimizer",
    "overlap_grad_reduce",
)
"""The searched axes, in the order of a candidate's layout (and the output's columns)."""

DP_ONLY_AXES = ("use_distributed_optimizer", "overlap_grad_reduce")

EXPERT_AXES = ("ep", "etp")
"""Searched only for a MoE model (`plan_axes`)."""

ETP_IS_TP = "tp"
"""The etp value that stands for "the layout's tp" (Megatron's default expert tensor
parallelism), resolved per layout; a dense model's etp stays null."""

PLAN_ONLY_SECTIONS = {"cp": "parallel"}
"""Plan axes that are not sweep axes, with their scenario section; their values are
computed here (`_cp_values`)."""


def plan_axes(base: Scenario) -> tuple[str, ...]:
    """The axes a plan of `base` searches and shows: `PLAN_AXES`, without ep and etp for a
    dense model."""
    if base.model.moe is not None:
        return PLAN_AXES
    return tuple(name for name in PLAN_AXES if name not in EXPERT_AXES)


def axis_section(name: str) -> str:
    """The scenario section ("parallel", "training") a plan axis (or dp) sets."""
    if name == "dp":
        return "parallel"
    return PLAN_ONLY_SECTIONS.get(name) or AXES[name].section


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


def search_space(
    base: Scenario,
    hardware: HardwareProfile,
    num_gpus: int,
    choices: Mapping[str, Sequence[AxisValue]] | None = None,
) -> SearchSpace:
    """The values of every axis in `PLAN_AXES`; `choices` replaces an axis's values by the
    listed ones (PlanError for an axis that is not searched or a value it cannot take)."""
    context = AutoContext(base=base, num_gpus=num_gpus, global_batch_sizes=(base.training.global_batch_size,))
    values: dict[str, tuple[AxisValue, ...]] = {}
    for name in PLAN_AXES:
        if name in PLAN_ONLY_SECTIONS or name == "etp":
            continue
        auto = AXES[name].auto
        assert auto is not None, f"plan axis {name} has no auto values"
        values[name] = auto(context)
    per_node = hardware.network.gpus_per_node
    values["tp"] = tuple(t for t in values["tp"] if int(t) <= per_node)
    values["cp"] = _cp_values(base, num_gpus, per_node)
    values["etp"] = (ETP_IS_TP, 1) if base.model.moe is not None else (ETP_IS_TP,)
    values.update(_chosen(base, choices or {}))
    values = {name: values[name] for name in PLAN_AXES}
    return SearchSpace(base=base, hardware=hardware, num_gpus=num_gpus, values=values)


def _chosen(base: Scenario, choices: Mapping[str, Sequence[AxisValue]]) -> dict[str, tuple[AxisValue, ...]]:
    """`choices` checked: a searched axis, values that axis takes, none twice; ep and etp
    only for a MoE model, ep dividing num_experts (Megatron-core's rule, `check_moe_parallel`)."""
    chosen: dict[str, tuple[AxisValue, ...]] = {}
    for name, raw in choices.items():
        option = f"--{name.replace('_', '-')}"
        if name not in plan_axes(base):
            allowed = ", ".join(plan_axes(base))
            why = " (expert parallelism needs model.moe)" if name in EXPERT_AXES else ""
            raise PlanError(f"{option}: not searched for this model{why}; axes: {allowed}")
        if not raw:
            raise PlanError(f"{option}: give at least one value")
        parsed = []
        for value in raw:
            try:
                parsed.append(AXES[name].parse(value) if name in AXES else int(value))
            except (TypeError, ValueError) as error:
                raise PlanError(f"{option}: {error}") from None
        if len(set(parsed)) < len(parsed):
            raise PlanError(f"{option}: values {', '.join(map(str, parsed))}: a value is listed twice")
        moe = base.model.moe
        if name == "ep" and moe is not None and (bad := [v for v in parsed if moe.num_experts % int(v)]):
            allowed = ", ".join(map(str, divisors(moe.num_experts)))
            raise PlanError(
                f"{option}: value {bad[0]}: must divide model.moe.num_experts ({moe.num_experts}): "
                f"each expert-parallel rank holds whole experts; allowed: {allowed}"
            )
        chosen[name] = tuple(parsed)
    return chosen


def _cp_values(base: Scenario, num_gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """The cp sizes of `_cp_sizes` that divide the GPU count (1 if none does)."""
    return tuple(c for c in _cp_sizes(base, gpus_per_node) if num_gpus % c == 0) or (1,)


def _cp_sizes(base: Scenario, gpus_per_node: int) -> tuple[int, ...]:
    """cp sizes Megatron-core accepts for this model: 1 unless attention is flash (its ring
    runs inside TE's fused attention); with flash, the divisors of seq_length / 2 (the
    sequence splits into 2·cp chunks), at most gpus_per_node (bounded like tp)."""
    if base.training.attention_backend is not AttentionBackend.FLASH:
        return (1,)
    half = base.model.seq_length // 2
    return divisors(half, min(half, gpus_per_node)) or (1,)


def _dependent_switches(base_training: dict[str, Any], layout: dict[str, AxisValue]) -> dict[str, bool]:
    """The base's switches that ride on a searched axis, on only where the layout has that
    axis on (megatron/training/arguments.py refuses --overlap-param-gather without
    --use-distributed-optimizer and --overlap-grad-reduce, --fp8-param-gather without the
    distributed optimizer, and --tp-comm-overlap without --sequence-parallel at tp > 1)."""
    dist_opt = bool(layout["use_distributed_optimizer"])
    found = {
        "overlap_param_gather": dist_opt and bool(layout["overlap_grad_reduce"]),
        "fp8_param_gather": dist_opt,
        "fp4_param_gather": dist_opt,
        "tp_comm_overlap": bool(layout["sequence_parallel"]) or int(layout["tp"]) == 1,  # tp 1: inert
    }
    return {name: bool(base_training.get(name)) and allowed for name, allowed in found.items()}


def _expert_tp(layout: dict[str, AxisValue], etp_values: tuple[AxisValue, ...], moe: bool) -> int | None:
    """The layout's etp as the scenario gets it: null for a dense model, the layout's tp for
    `ETP_IS_TP`; 0 when this number is `ETP_IS_TP`'s too (tp == 1 searches etp 1 once)."""
    if not moe:
        return None
    tp, etp = int(layout["tp"]), layout["etp"]
    if etp == ETP_IS_TP:
        return tp
    if int(etp) == tp and ETP_IS_TP in etp_values:
        return 0  # the same layout as etp = tp, enumerated there
    return int(etp)


_PARALLEL_AXES = tuple(name for name in PLAN_AXES if axis_section(name) == "parallel")
_TRAINING_AXES = tuple(name for name in PLAN_AXES if axis_section(name) == "training")


def _scenario(
    base: Scenario, base_training: dict[str, Any], layout: dict[str, AxisValue], dp: int
) -> Scenario:
    """`base` with the layout's values, dp, the 1F1B schedule and the switches that depend
    on them (`_dependent_switches`). Copied, not validated again: every value is one its
    field's type accepts (an axis's own, enum names as members), the per-field checks hold
    for them, and `candidates` applies the loader's cross-field rules; a test checks the copy
    equals the loaded scenario (about 40x cheaper than validating, a plan's main cost)."""
    training = {name: _typed(name, layout[name]) for name in _TRAINING_AXES}
    dependent = _dependent_switches(base_training, layout)
    parallel = {name: layout[name] for name in _PARALLEL_AXES}
    update = {
        "parallel": base.parallel.model_copy(update={**parallel, "dp": dp}),
        "training": base.training.model_copy(
            update={**training, **dependent, "schedule": ScheduleKind.ONE_F_ONE_B}
        ),
    }
    return base.model_copy(update=update)


def _typed(name: str, value: AxisValue) -> Any:
    """An axis value as its field holds it: enum choices as members."""
    kind = AXES[name].kind
    return kind(value) if isinstance(kind, type) and issubclass(kind, enum.Enum) else value


def candidates(space: SearchSpace) -> Iterator[Scenario]:
    """Every layout in the space that uses exactly `num_gpus` GPUs and that the scenario
    loader accepts, in `product()` order of `PLAN_AXES`."""
    names = list(space.values)
    base = space.base
    base_training = base.training.model_dump()
    moe = base.model.moe is not None
    for combination in product(*space.values.values()):
        layout = dict(zip(names, combination))
        model_parallel = int(layout["tp"]) * int(layout["cp"]) * int(layout["pp"])
        if space.num_gpus % model_parallel:
            continue
        dp = space.num_gpus // model_parallel
        if dp == 1 and any(layout[name] for name in DP_ONLY_AXES):
            continue
        etp = _expert_tp(layout, space.values["etp"], moe)
        if etp == 0:
            continue
        layout["etp"] = etp  # type: ignore[assignment]  # null for a dense model
        if surely_refused(layout, dp, base.training.global_batch_size, moe):
            continue
        scenario = _scenario(base, base_training, layout, dp)
        if not cross_field_problems(scenario):
            yield scenario


def surely_refused(layout: dict[str, AxisValue], dp: int, global_batch_size: int, moe: bool) -> bool:
    """A few of the loader's rules, checked on the raw values before a scenario is built
    (most of a MoE space fails them; building and checking a scenario is the enumeration's
    cost). Each one is a rule `cross_field_problems` applies, so the layouts are the same
    (a test checks that every layout refused here is refused by the loader): sequence
    parallelism needs tp > 1; Megatron-core's MoE layer with tp > 1 needs it
    (`check_moe_parallel`); ep·etp divides tp·cp·dp (`ExpertLayout`); and the global batch
    is a whole number of micro-batches per replica."""
    tp, sequence_parallel = int(layout["tp"]), bool(layout["sequence_parallel"])
    if sequence_parallel and tp == 1:
        return True
    if global_batch_size % (int(layout["micro_batch_size"]) * dp):
        return True
    if not moe:
        return False
    if tp > 1 and not sequence_parallel:
        return True
    return (tp * int(layout["cp"]) * dp) % (int(layout["ep"]) * int(layout["etp"])) != 0


def usable_gpu_counts(space: SearchSpace, near: int, span: int = 64) -> tuple[int | None, int | None]:
    """The closest GPU counts below and above `near` that some (tp, cp, pp, dp) of this
    model and batch can use (micro_batch_size 1; None if none within `span`): the axes'
    values without the GPU count's own divisibility."""
    base, per_node = space.base, space.hardware.network.gpus_per_node
    sizes = {
        t * c * p * d
        for t in _tp_sizes(space)
        for c in _cp_sizes(base, per_node)
        for p in split_values(base, None)[0]
        for d in divisors(base.training.global_batch_size)
    }
    below = max((n for n in sizes if near - span <= n < near), default=None)
    above = min((n for n in sizes if near < n <= near + span), default=None)
    return below, above


def _tp_sizes(space: SearchSpace) -> list[int]:
    m = space.base.model
    return [
        t
        for t in divisors(m.num_attention_heads, space.hardware.network.gpus_per_node)
        if m.ffn_size % t == 0
    ]


def _cp_rule(space: SearchSpace) -> str:
    """How cp was searched, or why it was not."""
    base = space.base
    if base.training.attention_backend is not AttentionBackend.FLASH:
        return (
            "cp 1 (context parallelism is searched only with training.attention_backend flash, whose "
            "fused kernel runs Megatron-core's ring; this scenario's is "
            f"{base.training.attention_backend.value})"
        )
    sizes = ", ".join(map(str, _cp_sizes(base, space.hardware.network.gpus_per_node)))
    return (
        f"cp one of {sizes} (context parallelism, with flash attention: divisors of seq_length / 2 "
        f"({base.model.seq_length // 2}) up to gpus_per_node)"
    )


def _pp_rule(space: SearchSpace) -> str:
    """Which pp the pipeline split accepts, in the words of the base's split flags."""
    par, layers = space.base.parallel, space.base.model.num_layers
    if par.pipeline_layout is not None:
        pps = ", ".join(map(str, split_values(space.base, None)[0]))
        return (
            f"pp one of {pps} (pp * vpp must be the stage count of parallel.pipeline_layout "
            f"{par.pipeline_layout!r}, which every layout keeps)"
        )
    flags = [
        name
        for name, on in (
            ("account_for_embedding_in_pipeline_split", par.account_for_embedding_in_pipeline_split),
            ("account_for_loss_in_pipeline_split", par.account_for_loss_in_pipeline_split),
            ("first_pipeline_num_layers", par.first_pipeline_num_layers is not None),
            ("last_pipeline_num_layers", par.last_pipeline_num_layers is not None),
        )
        if on
    ]
    if not flags:
        return f"pp dividing num_layers ({layers})"
    pps = ", ".join(map(str, split_values(space.base, None)[0]))
    return f"pp one of {pps} (the pipeline split of num_layers ({layers}) with {', '.join(flags)})"


def explain_no_layout(space: SearchSpace) -> str:
    """Why no layout uses `num_gpus` GPUs: the rules (cp's included), and the nearest counts
    that work."""
    m, training = space.base.model, space.base.training
    below, above = usable_gpu_counts(space, space.num_gpus)
    near = " or ".join(str(n) for n in (below, above) if n is not None)
    if m.moe is not None:
        eps = ", ".join(map(str, space.values["ep"]))
        etps = ", ".join(map(str, space.values["etp"]))
        experts = (
            f"; for this MoE model also ep * etp dividing tp * cp * dp (Megatron-core's expert "
            f"folding), with ep one of {eps} and etp one of {etps}"
        )
    else:
        experts = ""
    return (
        f"--gpus: value {space.num_gpus}: no layout of this model uses exactly {space.num_gpus} GPUs. "
        "The GPU count must be tp * cp * pp * dp with tp dividing num_attention_heads "
        f"({m.num_attention_heads}) and ffn_hidden_size ({m.ffn_size}) and at most gpus_per_node "
        f"({space.hardware.network.gpus_per_node}), {_cp_rule(space)}, {_pp_rule(space)}, and "
        f"dp dividing global_batch_size ({training.global_batch_size}) with at least one sample "
        f"per micro-batch{experts}; "
        f"{f'usable counts near it: {near}' if near else 'no usable count within 64 of it'}"
    )
