"""`plan_layouts`: the bound-pruned search returns exactly the exhaustive top K."""

from __future__ import annotations

import pytest

from simcluster.plan import plan_layouts
from simcluster.plan.search import evaluate_candidate, prepare
from simcluster.plan.space import candidates, search_space
from tests.plan.plan_world import a100, tiny_scenario


def _answer(result):
    return [(c.scenario, c.iteration_time_s, c.peak_memory_bytes) for c in result.candidates]


@pytest.mark.parametrize(
    ("memory_gb", "headroom", "top"),
    [(80.0, 0.1, 5), (0.35, 0.2, 8)],
    ids=["roomy", "tight-memory"],
)
def test_pruned_search_equals_exhaustive(memory_gb, headroom, top):
    """Same top K (layouts, times, peaks, order) with the bound as simulating every fitting
    layout; the bound really skipped layouts, and the counts add up."""
    base, hw = tiny_scenario(), a100(memory_gb)
    pruned = plan_layouts(base, hw, 8, headroom_fraction=headroom, top=top)
    exhaustive = plan_layouts(base, hw, 8, headroom_fraction=headroom, top=top, use_bound=False)
    assert _answer(pruned) == _answer(exhaustive)
    assert len(pruned.candidates) == top
    assert pruned.pruned_bound > 0 and exhaustive.pruned_bound == 0
    assert pruned.simulated < exhaustive.simulated
    for result in (pruned, exhaustive):
        assert result.searched == result.pruned_memory + result.pruned_bound + result.simulated
    times = [c.iteration_time_s for c in pruned.candidates]
    assert times == sorted(times)


def test_tight_memory_prunes_and_respects_headroom():
    """With a small device some layouts do not fit, and every answer leaves the headroom free."""
    result = plan_layouts(tiny_scenario(), a100(0.35), 8, headroom_fraction=0.2, top=8)
    assert result.pruned_memory > 0
    for candidate in result.candidates:
        assert candidate.peak_memory_bytes <= 0.8 * candidate.capacity_bytes


def test_exhaustive_top_is_the_fastest_of_everything_that_fits():
    """The exhaustive answer's first layout is the fastest of all fitting layouts simulated
    one by one (no shared state with the search loop)."""
    base, hw = tiny_scenario(), a100(0.35)
    limit = 0.8 * hw.memory_bytes
    evaluations = [evaluate_candidate(c, hw, limit) for c in prepare(search_space(base, hw, 8), limit)]
    fastest = min(e.iteration_time_s for e in evaluations if e.fits)
    result = plan_layouts(base, hw, 8, headroom_fraction=0.2, top=1)
    assert result.candidates[0].iteration_time_s == fastest


def test_pool_gives_the_same_answer():
    """Two worker processes find the same top K as one."""
    base, hw = tiny_scenario(), a100()
    assert _answer(plan_layouts(base, hw, 8, top=4, workers=2)) == _answer(plan_layouts(base, hw, 8, top=4))


def test_space_follows_megatron_rules_and_stated_restrictions():
    """Every candidate loads as a scenario, uses exactly the GPUs, keeps tp within a node,
    runs 1F1B, and tries the distributed optimizer / overlap only with dp > 1."""
    base, hw = tiny_scenario(), a100()
    layouts = list(candidates(search_space(base, hw, 16)))
    assert layouts
    for scenario in layouts:
        par, tr = scenario.parallel, scenario.training
        assert scenario.num_gpus == 16 and par.tp <= hw.network.gpus_per_node
        assert tr.schedule.value == "1f1b"
        if par.dp == 1:
            assert not tr.use_distributed_optimizer and not tr.overlap_grad_reduce
    assert {s.parallel.tp for s in layouts} == {1, 2, 4, 8}
    assert {s.training.recompute.value for s in layouts} == {"none", "selective", "full"}
    assert any(s.parallel.vpp > 1 for s in layouts)


def test_cp_is_searched_only_with_flash_and_uneven_splits_are_reachable():
    """Unfused attention: cp is 1 (plans unchanged). Llama 3 405B (flash, 126 layers with
    both account-for flags): cp 1, 2, 4, 8 and Meta's pp 16 × vpp 8 are in the space, and
    every candidate uses tp · cp · pp · dp GPUs."""
    from simcluster.config.hardware import load_hardware
    from simcluster.plan.base import load_plan_scenario

    assert search_space(tiny_scenario(), a100(), 8).values["cp"] == (1,)
    base = load_plan_scenario("scenarios/modern/llama3-405b-h100-16k.yaml")
    space = search_space(base, load_hardware(base.hardware), 16384)
    assert space.values["cp"] == (1, 2, 4, 8)
    assert 16 in space.values["pp"] and 8 in space.values["vpp"]
    assert 126 % 16 and 126 % 8  # reachable only through the split rules, not divisors
    flash = search_space(tiny_scenario(attention_backend="flash"), load_hardware("h100-sxm5-80gb"), 8)
    layouts = list(candidates(flash))
    assert {s.parallel.cp for s in layouts} == {1, 2, 4, 8}
    assert all(s.parallel.tp * s.parallel.cp * s.parallel.pp * s.parallel.dp == 8 for s in layouts)


PARAM_GATHER = {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True}


def test_switches_riding_on_a_searched_axis_do_not_shrink_the_space():
    """A base with overlap_param_gather (needs the distributed optimizer and overlap_grad_reduce,
    which the plan tries only with dp > 1) still searches every layout a base without it
    does, dp = 1 included; the switch is on exactly where Megatron allows it."""
    hw = a100()
    plain = list(candidates(search_space(tiny_scenario(), hw, 8)))
    gathered = list(candidates(search_space(tiny_scenario(**PARAM_GATHER), hw, 8)))
    assert len(gathered) == len(plain) and any(s.parallel.dp == 1 for s in gathered)
    for scenario in gathered:
        tr = scenario.training
        assert tr.overlap_param_gather == (tr.use_distributed_optimizer and tr.overlap_grad_reduce)


def test_no_fit_names_the_true_smallest_peak_of_the_layouts_searched():
    """Nothing fits: the error's smallest peak is the minimum over every searched layout's
    exact peak (each evaluated here), and it is a dp = 1 layout for this base, which the
    plan used to leave out (405B on 8 H100s said 1228.4 GB where tp 8 pp 1 needs 918.7)."""
    from simcluster import units
    from simcluster.plan import PlanError
    from simcluster.plan.search import _smallest_peak

    base, hw = tiny_scenario(**PARAM_GATHER), a100(0.005)
    space = search_space(base, hw, 8)
    prepared = prepare(space, limit_bytes=float("inf"))
    peaks = [evaluate_candidate(c, hw, limit_bytes=-float("inf")).peak_memory_bytes for c in prepared]
    smallest = min(peaks)
    peak, _, candidate = _smallest_peak(prepared, hw)
    assert peak == smallest and candidate.scenario.parallel.dp == 1
    with pytest.raises(PlanError, match=f"the smallest peak is {units.bytes_to_gb(smallest):.1f} GB"):
        plan_layouts(base, hw, 8)
