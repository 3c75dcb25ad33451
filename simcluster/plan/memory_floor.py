"""A lower bound on a layout's peak memory from its workload, without its schedule.

Each stage's peak (`memory_plan.stage_memory_estimate`) is its static bytes plus the
largest sum of stored activations its task order reaches (plus transient bytes, ≥ 0).
Megatron's 1F1B (interleaved or not) runs W warm-up forwards and then one more forward
before its first backward (`schedule.ordering.warmup_steady_cooldown`; W from
`one_f_one_b_warmup` / `interleaved_warmup`), so at that point min(W + 1, M) forwards of the
stage's M are stored at once, each at least the stage's smallest chunk (under the EP overlap
too: its W + 1 warm-up forwards are stored whole, the forward paired next only in part,
`memory_plan.paired_forward_head_bytes`):

    floor_r = static_r + min(W_r + 1, M) · min_c saved_bytes(c)   ≤ peak_r.

The plan skips the exact peak of a layout whose floor is over the limit: it cannot fit
(counted as a memory-pruned layout, as its exact peak would be). A hypothesis test checks
floor ≤ exact peak on random layouts. Schedules other than 1F1B (GPipe, never searched)
get the static bytes alone.
"""

from __future__ import annotations

from simcluster.config.choices import ScheduleKind
from simcluster.config.scenario import Scenario
from simcluster.schedule.interleaved import interleaved_warmup
from simcluster.schedule.one_f_one_b import one_f_one_b_warmup
from simcluster.workload.model import Workload

FLOAT_SLACK = 1e-9  # the floor's sums run in another order than the exact peak's


def stored_floor(scenario: Scenario, stage: int) -> int:
    """Microbatch-chunks stage `stage` surely stores at once (module docstring)."""
    par, m = scenario.parallel, scenario.num_microbatches
    if scenario.training.schedule is not ScheduleKind.ONE_F_ONE_B:
        return 0
    if par.vpp == 1:
        return min(one_f_one_b_warmup(par.pp, stage, m) + 1, m)
    total = m * par.vpp
    return min(interleaved_warmup(par.pp, stage, m, par.vpp) + 1, total)


def peak_floor_bytes(scenario: Scenario, workload: Workload) -> float:
    """The largest stage's floor (module docstring): never above its exact peak."""
    floors = []
    for stage in workload.stages:
        saved = min(chunk.saved_bytes for chunk in stage.chunks)
        floors.append(stage.static.total_bytes + stored_floor(scenario, stage.stage) * saved)
    return max(floors) * (1 - FLOAT_SLACK)
