"""Collectives as plan data (issue 18): a collective the engine has no code for — a synthetic
MoE-style all-to-all (dispatch, combine) inside a chunk's forward — added to a plan as one
`Collective` on a typed link, and the engine accounts its time on that link, FIFO with the
link's other traffic, and in the category the collective names. Times worked out by hand
(forward 1 s, backward 2 s, as tests/engine/test_engine_pipeline.py's `uniform_plan`)."""

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from simcluster.config import load_hardware, parse_scenario
from simcluster.config.choices import ScheduleKind
from simcluster.engine.links import Link, LinkKind, LinkScope
from simcluster.engine.plan import (
    Collective,
    Issue,
    Occurrence,
    PipelinePlan,
    TaskRef,
    TimeCategory,
    Transfer,
)
from simcluster.engine.simulator import simulate
from simcluster.schedule.tasks import Phase
from simcluster.simulation import build_plan
from simcluster.steady_state import simulate_steady_state
from simcluster.workload.model import build_workload
from tests.engine.test_engine_pipeline import uniform_plan

A100 = load_hardware("a100-sxm4-80gb")

EP_LINK = Link.of_stage(LinkKind.NVLINK, 0)  # stage 0's NVLink: "nvlink:0"
A2A = TimeCategory.TP_COMM  # any category the plan names: none of uniform_plan's parts use it


def _all_to_all(pieces_s=(0.25, 0.5), link=EP_LINK, occurrence=Occurrence.EVERY, chunk=0) -> Collective:
    """Dispatch then combine inside each forward of `chunk`: the forward's work in three
    slices, the all-to-all between them, blocking (Megatron's alltoall token dispatcher)."""
    task = TaskRef(Phase.FORWARD, chunk, occurrence)
    return Collective("a2a", link, pieces_s, A2A, Issue.INSIDE, task, numbered=True, span="a2a wait")


def _with(plan: PipelinePlan, stage: int, *collectives: Collective) -> PipelinePlan:
    stages = list(plan.stages)
    stages[stage] = replace(stages[stage], collectives=collectives)
    return replace(plan, stages=tuple(stages))


def test_an_all_to_all_inside_the_forward_is_timed_on_its_link_and_in_its_category():
    """m = 1: F0 runs 1/3 s, dispatch 0.25 s, 1/3 s, combine 0.5 s, 1/3 s = 1.75 s; B0 2 s."""
    plain = uniform_plan(1, 1, 1)
    result = simulate(_with(plain, 0, _all_to_all()), record=True)
    assert result.iteration_time_s == pytest.approx(3.75)
    assert simulate(plain).iteration_time_s == pytest.approx(3.0)
    busy = result.stages[0].busy_s
    assert busy[A2A] == pytest.approx(0.75)
    assert busy[TimeCategory.COMPUTE] == pytest.approx(3.0)  # the work itself is unchanged
    spans = result.link_spans["nvlink:0"]
    assert [(label, seconds) for _, seconds, label in spans] == [("a2a.0 F0.0", 0.25), ("a2a.1 F0.0", 0.5)]
    assert [start for start, _, _ in spans] == pytest.approx([1 / 3, 1 / 3 + 0.25 + 1 / 3])
    waits = [span for span in result.spans if span[1] == "a2a wait"]
    assert [(category, duration) for _, _, category, _, duration in waits] == [
        ("tp_comm", pytest.approx(0.25)),
        ("tp_comm", pytest.approx(0.5)),
    ]
    forward = next(span for span in result.spans if span[1] == "F0.0")
    assert forward[4] == pytest.approx(1.75)  # the task's span holds its slices and waits


def test_inside_a_backward_too():
    """B0's 2 s in three slices of 2/3 s around 0.25 s and 0.5 s: it ends at 1 + 2.75; the
    wait is drawn under the default span name."""
    moe_backward = replace(_all_to_all(), task=TaskRef(Phase.BACKWARD, 0), span="")
    result = simulate(_with(uniform_plan(1, 1, 1), 0, moe_backward), record=True)
    assert result.iteration_time_s == pytest.approx(3.75)
    assert result.stages[0].busy_s[A2A] == pytest.approx(0.75)
    assert [span[1] for span in result.spans if span[2] == "tp_comm"] == ["a2a wait", "a2a wait"]
    assert [label for _, _, label in result.link_spans["nvlink:0"]] == ["a2a.0 B0.0", "a2a.1 B0.0"]


def test_every_forward_runs_it_and_the_first_or_last_only_once():
    m = 3
    plain = uniform_plan(1, m, 1)
    every = simulate(_with(plain, 0, _all_to_all()), record=True)
    assert len(every.link_spans["nvlink:0"]) == 2 * m
    assert every.iteration_time_s == pytest.approx(3.0 * m + 0.75 * m)
    assert every.stages[0].busy_s[A2A] == pytest.approx(0.75 * m)
    for occurrence in (Occurrence.FIRST, Occurrence.LAST):
        once = simulate(_with(plain, 0, _all_to_all(occurrence=occurrence)), record=True)
        assert len(once.link_spans["nvlink:0"]) == 2
        assert once.iteration_time_s == pytest.approx(3.0 * m + 0.75)


def test_it_queues_fifo_behind_other_traffic_on_its_link():
    """A 2 s transfer issued at the iteration start on the same link (gating B0, which
    starts later anyway) holds the link until 2.0: the dispatch issued at 0.5 (F0's first
    slice of 0.5 s with one piece) waits until 2.0 and ends at 2.5, F0 at 3.0, B0 at 5.0.
    On a link of its own the dispatch ends at 1.0 and F0 at 1.5, and B0 waits for the early
    transfer until 2.0: it ends at 4.0."""
    early = Collective("early", EP_LINK, (2.0,), TimeCategory.DP_COMM, Issue.START,
                       TaskRef(Phase.BACKWARD, 0, Occurrence.FIRST))  # fmt: skip
    plain = uniform_plan(1, 1, 1)
    shared = simulate(_with(plain, 0, early, _all_to_all((0.5,))), record=True)
    assert shared.iteration_time_s == pytest.approx(5.0)
    assert shared.stages[0].busy_s[A2A] == pytest.approx(2.0)  # queued 1.5 s + its own 0.5 s
    assert shared.link_spans["nvlink:0"] == [(0.0, 2.0, "early"), (2.0, 0.5, "a2a.0 F0.0")]
    own = Link(LinkKind.NVLINK, LinkScope.STAGE, "ep:0")
    apart = simulate(_with(plain, 0, early, _all_to_all((0.5,), link=own)))
    assert apart.iteration_time_s == pytest.approx(4.0)
    assert apart.stages[0].busy_s[A2A] == pytest.approx(0.5)


def test_it_shares_a_link_with_pipeline_sends():
    """Two stages, one microbatch, sends of 0.5 s on stage 0's link, non-blocking, and an
    all-to-all inside stage 0's forward on that same link: the p2p queue and the
    all-to-all's pieces interleave on one FIFO; stage 1 sees the activation 0.5 s after F0
    ends, which the all-to-all made 0.75 s longer."""
    plain = replace(uniform_plan(2, 1, 1, p2p_s=0.5), blocking_p2p=False)
    stages = list(plain.stages)
    stages[0] = replace(stages[0], send_forward=Transfer(EP_LINK, 0.5), send_backward=Transfer(EP_LINK, 0.5))
    base = replace(plain, stages=tuple(stages))
    with_a2a = simulate(_with(base, 0, _all_to_all()), record=True)
    assert with_a2a.iteration_time_s == pytest.approx(simulate(base).iteration_time_s + 0.75)
    labels = [label for _, _, label in with_a2a.link_spans["nvlink:0"]]
    assert labels == ["a2a.0 F0.0", "a2a.1 F0.0", "F0.0"]


def test_a_steady_state_run_with_the_all_to_all_is_the_full_run():
    """The certificate sees the collective (its signatures name what each position issues):
    the extended short run gives the full run's time."""
    p, v, m = 4, 1, 64

    def plan_for(microbatches: int) -> PipelinePlan:
        a2a = _all_to_all(link=Link.of_stage(LinkKind.NVLINK, 2))
        return _with(uniform_plan(p, microbatches, v, p2p_s=0.1), 2, a2a)

    ran, extended = simulate_steady_state(plan_for, ScheduleKind.ONE_F_ONE_B, p, v, m)
    assert len(ran.stages[2].tasks) < 2 * m  # a short run was certified and extended
    full = simulate(plan_for(m))
    assert extended.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
    assert extended.stages[2].busy_s[A2A] == pytest.approx(full.stages[2].busy_s[A2A], rel=1e-12)
    assert full.stages[2].busy_s[A2A] == pytest.approx(0.75 * m)


def test_bad_collectives_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="issue inside needs task"):
        Collective("a2a", EP_LINK, (0.1,), A2A, Issue.INSIDE)
    with pytest.raises(ValueError, match="issue tasks_done takes no task"):
        Collective("x", EP_LINK, (0.1,), A2A, Issue.TASKS_DONE, TaskRef(Phase.FORWARD, 0))
    with pytest.raises(ValueError, match="needs a group link"):
        Collective("x", EP_LINK, (0.1,), A2A, Issue.READY)
    with pytest.raises(ValueError, match="pieces_s must be >= 0"):
        Collective("x", EP_LINK, (-1.0,), A2A, Issue.TASKS_DONE)
    with pytest.raises(ValueError, match="at most one per task"):
        simulate(_with(uniform_plan(1, 1, 1), 0, _all_to_all(), _all_to_all()))
    with pytest.raises(ValueError, match="task chunk 1 is not one of the stage's 1 chunks"):
        _with(uniform_plan(1, 1, 1), 0, _all_to_all(chunk=1))
    with pytest.raises(ValueError, match="expected KIND:STAGE"):
        Transfer("infiniband:0", 1.0)


def test_links_are_typed_and_the_earlier_names_parse():
    assert Transfer("nvlink:3", 1.0).link == Link(LinkKind.NVLINK, LinkScope.STAGE, "nvlink:3")
    assert Transfer("nic:shared", 1.0).link.scope is LinkScope.GROUP
    assert Link.of_stage(LinkKind.NIC, 2, channel="dp").name == "dp:2"


def test_the_engine_has_no_code_of_its_own_for_it():
    """What the tests above ran is data: no name or string in the engine's code (its
    docstrings aside, which say how MoE plugs in) is about all-to-alls, experts or MoE."""
    words = set()
    for path in (Path(__file__).parents[2] / "simcluster" / "engine").glob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and ast.get_docstring(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                words.add(node.id)
            elif isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                words.add(node.name)
            elif (
                isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            ):
                words.add(node.value)
    text = " ".join(words).lower()
    assert "collective" in text and "stage_process" in text  # the walk saw the engine's code
    for word in ("all-to-all", "alltoall", "all_to_all", "a2a", "expert", "moe", "dispatch"):
        assert word not in text, word


def test_megatron_data_parallel_slots_compile_into_ordinary_collectives():
    """The distributed optimizer with both overlaps, pp 2, v 2, tied embeddings: per chunk a
    parameter all-gather issued at the start gating the chunk's first forward and a
    bucketed reduce-scatter spread through its last backward, then the embedding
    all-reduce joined on the group link; without overlap, one reduction when the tasks are
    done and the all-gather after the step."""
    data = {
        "hardware": "a100-sxm4-80gb",
        "model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
                  "seq_length": 512, "vocab_size": 5000},
        "parallel": {"tp": 1, "pp": 2, "dp": 4, "vpp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 16, "use_distributed_optimizer": True},
    }  # fmt: skip
    overlapped = {**data["training"], "overlap_grad_reduce": True, "overlap_param_gather": True}
    plain, both = (
        build_plan(scenario, A100, build_workload(scenario))
        for scenario in (parse_scenario(data, "dp"), parse_scenario({**data, "training": overlapped}, "dp"))
    )
    issued = [(c.issue, c.task) for c in both.collectives[0]]
    assert issued == [
        (Issue.START, TaskRef(Phase.FORWARD, 0, Occurrence.FIRST)),
        (Issue.START, TaskRef(Phase.FORWARD, 1, Occurrence.FIRST)),
        (Issue.SPREAD, TaskRef(Phase.BACKWARD, 0, Occurrence.LAST)),
        (Issue.SPREAD, TaskRef(Phase.BACKWARD, 1, Occurrence.LAST)),
        (Issue.READY, None),
    ]
    assert {c.link.name for c in both.collectives[0][:2]} == {"dp:0"}
    tied = [c.link for stage in both.collectives for c in stage if c.issue is Issue.READY]
    assert len(tied) == 2 and tied[0] == tied[1] and tied[0].scope is LinkScope.GROUP
    assert [c.issue for c in plain.collectives[1]] == [Issue.TASKS_DONE, Issue.READY, Issue.STEP]
    assert all(c.category is TimeCategory.DP_COMM for stage in both.collectives for c in stage)
