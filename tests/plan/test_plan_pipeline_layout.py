"""`plan` / `sweep` with `parallel.pipeline_layout`: a layout is tied to pp · vpp, so it is kept
on every candidate and only the (pp, vpp) it fits are searched (`sweep.axes.split_values`)."""

from __future__ import annotations

from simcluster.config.scenario import parse_scenario
from simcluster.plan.space import candidates, explain_no_layout, search_space
from simcluster.sweep.axes import split_values
from tests.plan.plan_world import TINY, a100

LAYOUT = "Et|t|t|tL"  # four virtual stages: pp 4 × vpp 1 or pp 2 × vpp 2


def _base():
    data = {**TINY, "parallel": {"tp": 1, "pp": 4, "pipeline_layout": LAYOUT}}
    return parse_scenario(data, "tiny-layout")


def test_only_the_pp_and_vpp_the_layout_fits_are_searched():
    """On 8 GPUs: pp 4 × vpp 1 and pp 2 × vpp 2 (pp 1 × vpp 4 cannot interleave; pp 8 has no
    layout of 4 stages); every candidate keeps the layout and splits by it."""
    base = _base()
    assert split_values(base, 8) == ((1, 2, 4), (1, 2, 4))
    layouts = list(candidates(search_space(base, a100(), 8)))
    assert layouts
    assert {(s.parallel.pp, s.parallel.vpp) for s in layouts} == {(4, 1), (2, 2)}
    assert all(s.parallel.pipeline_layout == LAYOUT for s in layouts)
    two = next(s for s in layouts if s.parallel.pp == 2)
    assert two.pipeline_split.chunk_layers == ((1, 1), (1, 1))


def test_without_a_layout_the_search_is_unchanged():
    data = {**TINY, "parallel": {"tp": 1, "pp": 4}}
    assert split_values(parse_scenario(data, "tiny"), 8) == ((1, 2, 4), (1, 2, 4))
    pairs = {
        (s.parallel.pp, s.parallel.vpp)
        for s in candidates(search_space(parse_scenario(data, "t"), a100(), 8))
    }
    assert {(1, 1), (2, 1)} <= pairs  # the layout search excludes both


def test_no_layout_message_names_the_pipeline_layout():
    space = search_space(_base(), a100(), 3)
    assert "stage count of parallel.pipeline_layout 'Et|t|t|tL'" in explain_no_layout(space)
