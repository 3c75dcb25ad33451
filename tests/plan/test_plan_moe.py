"""`plan` on a MoE model: ep and etp join the search (Megatron-core's folding rules), a
pinned value is respected, and a dense model searches exactly as before."""

from __future__ import annotations

import math

import pytest

from simcluster.config.scenario import Scenario
from simcluster.plan import PlanError, plan_layouts
from simcluster.plan.search import prepare, static_key
from simcluster.plan.space import PLAN_AXES, candidates, plan_axes, search_space
from simcluster.workload.model import build_workload
from tests.plan.plan_world import a100, tiny_moe_scenario, tiny_scenario

# a small slice of the space keeps the exhaustive comparison quick
FEW = {"micro_batch_size": (1, 4), "recompute": ("none",), "use_distributed_optimizer": (True,)}


def test_moe_space_searches_ep_and_etp_by_megatron_rules():
    """ep over the divisors of num_experts, etp over {tp, 1}; every layout proposed has ep
    dividing the experts and ep·etp dividing tp·cp·dp (so ep 8 on 8 GPUs only without a
    pipeline); ep > 1 and etp < tp both occur; tp 1 searches etp 1 once."""
    space = search_space(tiny_moe_scenario(), a100(), 8)
    assert space.values["ep"] == (1, 2, 4, 8)
    assert space.values["etp"] == ("tp", 1)
    layouts = list(candidates(space))
    seen = set()
    for scenario in layouts:
        par = scenario.parallel
        assert 8 % par.ep == 0
        assert (par.tp * par.cp * par.dp) % (par.ep * par.etp) == 0
        assert par.ep * par.etp <= 8 // par.pp
        assert par.etp in {1, par.tp}
        seen.add((par.ep, par.etp, par.tp))
    assert {ep for ep, _, _ in seen} == {1, 2, 4, 8}
    assert any(etp < tp for _, etp, tp in seen)
    assert len({s.model_dump_json() for s in layouts}) == len(layouts)


def test_pinned_ep_and_etp_are_respected():
    """choices={"ep": (2,), "etp": (1,)}: every layout searched and answered has them."""
    base, hw = tiny_moe_scenario(), a100()
    space = search_space(base, hw, 8, {"ep": [2], "etp": [1]})
    assert all((s.parallel.ep, s.parallel.etp) == (2, 1) for s in candidates(space))
    result = plan_layouts(base, hw, 8, top=3, choices={"ep": [2], "etp": [1], **FEW})
    assert [(c.scenario.parallel.ep, c.scenario.parallel.etp) for c in result.candidates] == [(2, 1)] * 3


@pytest.mark.parametrize(
    ("base", "choices", "message"),
    [
        (tiny_moe_scenario(), {"ep": [3]}, "--ep: value 3: must divide model.moe.num_experts (8)"),
        (tiny_moe_scenario(), {"ep": [2, 2]}, "listed twice"),
        (tiny_moe_scenario(), {"etp": [0]}, "--etp: value 0"),
        (
            tiny_scenario(),
            {"ep": [2]},
            "--ep: not searched for this model (expert parallelism needs model.moe)",
        ),
    ],
    ids=["ep-not-dividing-experts", "twice", "etp-zero", "dense"],
)
def test_bad_choices_are_clear_errors(base, choices, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        search_space(base, a100(), 8, choices)


def test_moe_pruned_search_equals_exhaustive():
    """On a MoE model the bound-pruned top K equals simulating every fitting layout."""
    base, hw = tiny_moe_scenario(), a100()
    pruned = plan_layouts(base, hw, 8, top=4, choices=FEW)
    exhaustive = plan_layouts(base, hw, 8, top=4, choices=FEW, use_bound=False)
    answer = [(c.scenario, c.iteration_time_s) for c in pruned.candidates]
    assert answer == [(c.scenario, c.iteration_time_s) for c in exhaustive.candidates]
    assert pruned.simulated < exhaustive.simulated
    assert pruned.axes == PLAN_AXES and "ep" in pruned.to_json_dict()["axes"]


def test_static_memory_shards_the_experts_over_ep():
    """The plan's memory bound is the workload's: ep 2 holds half the routed experts of ep 1,
    2 + 4 + 12 bytes a parameter without the distributed optimizer (4 layers of 8 experts
    of 3·512·256 parameters: 12.58M routed parameters a rank at ep 1)."""
    base, hw = tiny_moe_scenario(), a100()
    choices = {"tp": (1,), "pp": (1,), "cp": (1,), "vpp": (1,), "micro_batch_size": (1,),
               "sequence_parallel": (False,), "recompute": ("none",),
               "use_distributed_optimizer": (False,), "overlap_grad_reduce": (False,)}  # fmt: skip
    static = {}
    for ep in (1, 2):
        (candidate,) = prepare(search_space(base, hw, 8, {**choices, "ep": (ep,)}), math.inf)
        workload = build_workload(candidate.scenario)
        assert candidate.static_bytes == max(stage.static.total_bytes for stage in workload.stages)
        static[ep] = candidate.static_bytes
    routed_per_rank_at_ep1 = 4 * 8 * 3 * 512 * 256
    assert static[1] - static[2] == pytest.approx(routed_per_rank_at_ep1 / 2 * 18)


def test_dense_model_searches_without_expert_axes():
    """A dense model's axes are the ones before ep / etp, every layout keeps ep 1 and etp
    null, and the JSON lists the same axes as before."""
    base = tiny_scenario()
    assert plan_axes(base) == tuple(a for a in PLAN_AXES if a not in ("ep", "etp"))
    space = search_space(base, a100(), 8)
    assert space.values["ep"] == (1,)
    assert all((s.parallel.ep, s.parallel.etp) == (1, None) for s in candidates(space))
    result = plan_layouts(base, a100(), 8, top=2)
    assert result.to_json_dict()["axes"] == [
        "tp", "pp", "cp", "vpp", "micro_batch_size", "sequence_parallel", "recompute",
        "use_distributed_optimizer", "overlap_grad_reduce",
    ]  # fmt: skip


@pytest.mark.parametrize("base", [tiny_scenario(), tiny_moe_scenario()], ids=["dense", "moe"])
def test_copied_layouts_equal_loaded_scenarios_and_share_static_memory_by_key(base):
    """Each layout (copied from the base, not validated again) equals the scenario the loader
    makes of its JSON, hash included; layouts with one `static_key` have one static memory."""
    statics: dict[Scenario, set[float]] = {}
    space = search_space(base, a100(), 8, {"micro_batch_size": (1, 4)})
    for scenario in candidates(space):
        loaded = Scenario.model_validate(scenario.model_dump(mode="json"))
        assert loaded == scenario and hash(loaded) == hash(scenario)
        stages = build_workload(scenario).stages
        statics.setdefault(static_key(scenario), set()).add(max(stage.static.total_bytes for stage in stages))
    assert all(len(values) == 1 for values in statics.values())
    assert len(statics) < sum(1 for _ in candidates(space)) / 4
