"""The enumeration's early refusals (`space.surely_refused`) only skip layouts the
scenario loader refuses too: the searched layouts are the loader's."""

from __future__ import annotations

from itertools import product

import pytest

from simcluster.config.scenario import cross_field_problems
from simcluster.plan.space import DP_ONLY_AXES, _expert_tp, _scenario, search_space, surely_refused
from tests.plan.plan_world import a100, tiny_moe_scenario, tiny_scenario


@pytest.mark.parametrize("base", [tiny_scenario(), tiny_moe_scenario()], ids=["dense", "moe"])
def test_early_refusals_are_the_loaders(base):
    """Every combination refused early has a loader problem; the early rules do fire."""
    space = search_space(base, a100(), 8, {"micro_batch_size": (1, 4, 16)})
    names, moe = list(space.values), base.model.moe is not None
    base_training = base.training.model_dump()
    refused = 0
    for combination in product(*space.values.values()):
        layout = dict(zip(names, combination))
        model_parallel = int(layout["tp"]) * int(layout["cp"]) * int(layout["pp"])
        if 8 % model_parallel:
            continue
        dp = 8 // model_parallel
        if dp == 1 and any(layout[name] for name in DP_ONLY_AXES):
            continue
        etp = _expert_tp(layout, space.values["etp"], moe)
        if etp == 0:
            continue
        layout["etp"] = etp
        if surely_refused(layout, dp, base.training.global_batch_size, moe):
            refused += 1
            assert cross_field_problems(_scenario(base, base_training, layout, dp)), layout
    assert refused > 0
