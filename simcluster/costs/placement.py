"""Where ranks sit: Megatron's rank order (tensor fastest, then data, then pipeline) on
nodes of `gpus_per_node` GPUs, and the communicators that follow from it."""

from __future__ import annotations

from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.costs.network import GroupPlacement


def global_rank(scenario: Scenario, stage: int, dp_rank: int = 0, tp_rank: int = 0) -> int:
    par = scenario.parallel
    return tp_rank + par.tp * (dp_rank + par.dp * stage)


def node_of(rank: int, hw: HardwareProfile) -> int:
    return rank // hw.network.gpus_per_node


def strided_group(size: int, stride: int, hw: HardwareProfile) -> GroupPlacement:
    """A group of `size` ranks `stride` apart (aligned at a node boundary)."""
    gpn = hw.network.gpus_per_node
    per_node = max(1, min(size, gpn // stride)) if stride <= gpn else 1
    return GroupPlacement(num_ranks=size, ranks_per_node=per_node)


def tp_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement:
    return strided_group(scenario.parallel.tp, 1, hw)


def dp_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement:
    return strided_group(scenario.parallel.dp, scenario.parallel.tp, hw)


def stages_share_node(scenario: Scenario, hw: HardwareProfile, stage_a: int, stage_b: int) -> bool:
    return node_of(global_rank(scenario, stage_a), hw) == node_of(global_rank(scenario, stage_b), hw)
