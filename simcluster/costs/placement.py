"""Where ranks sit: Megatron's rank order (tensor fastest, then context, then data, then
pipeline: `tp-cp-ep-dp-pp` with ep = 1 for dense layers, Megatron-core `parallel_state.py::RankGenerator`) on
NVLink domains of `HardwareProfile.nvlink_domain_size` GPUs (a node of `gpus_per_node`
GPUs, or a larger fabric of several nodes such as GB200 NVL72's 72 GPUs in 4-GPU trays), and
the communicators that follow from it. A group whose ranks stay in one domain uses NVLink,
even where they sit on different compute trays."""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.costs.network import GroupPlacement


def global_rank(scenario: Scenario, stage: int, dp_rank: int = 0, tp_rank: int = 0, cp_rank: int = 0) -> int:
    """tp_rank + t·(cp_rank + c·(dp_rank + d·stage)): Megatron-core's order `tp-cp-ep-dp-pp`
    (`megatron/training/initialize.py` → `parallel_state.initialize_model_parallel`,
    `RankGenerator`: the first token varies fastest). CP groups have stride t, DP groups
    stride t·c, pipeline neighbours t·c·d."""
    par = scenario.parallel
    return tp_rank + par.tp * (cp_rank + par.cp * (dp_rank + par.dp * stage))


def node_of(rank: int, hw: HardwareProfile) -> int:
    """The compute node (tray) holding `rank`: its NICs."""
    return rank // hw.network.gpus_per_node


def nvlink_domain_of(rank: int, hw: HardwareProfile) -> int:
    """The NVLink domain holding `rank`: ranks of one domain talk over NVLink."""
    return rank // hw.nvlink_domain_size


def strided_group(size: int, stride: int, hw: HardwareProfile) -> GroupPlacement:
    """A group of `size` ranks `stride` apart (aligned at a domain boundary)."""
    domain = hw.nvlink_domain_size
    per_domain = max(1, min(size, domain // stride)) if stride <= domain else 1
    return GroupPlacement(num_ranks=size, ranks_per_node=per_domain)


def tp_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement:
    return strided_group(scenario.parallel.tp, 1, hw)


def cp_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement:
    """The context-parallel ring: c ranks t apart (with t = 8 on 8-GPU nodes every member
    sits on another node; on a 72-GPU NVLink domain they stay on NVLink)."""
    return strided_group(scenario.parallel.cp, scenario.parallel.tp, hw)


def dp_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement:
    """The pure data-parallel group: d ranks t·c apart."""
    par = scenario.parallel
    return strided_group(par.dp, par.tp * par.cp, hw)


def dp_cp_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement:
    """The gradient-reduction and distributed-optimizer group, d·c ranks t apart: CP ranks
    hold identical weights, so Megatron-core reduces gradients over DP × CP
    (`distributed_data_parallel.py`, `intra_dp_cp_group`) and `get_megatron_optimizer`
    shards the distributed optimizer over the same `intra_dp_cp_group`. cp and dp are
    adjacent in the rank order, so the d·c ranks form one strided run. Equals `dp_group`
    when c = 1."""
    par = scenario.parallel
    return strided_group(par.dp * par.cp, par.tp, hw)


def stages_share_node(scenario: Scenario, hw: HardwareProfile, stage_a: int, stage_b: int) -> bool:
    """Whether two stages' first ranks share an NVLink domain (p2p over NVLink)."""
    rank_a, rank_b = global_rank(scenario, stage_a), global_rank(scenario, stage_b)
    return nvlink_domain_of(rank_a, hw) == nvlink_domain_of(rank_b, hw)


@dataclass(frozen=True, slots=True)
class ExpertGroups:
    """The MoE communicators of one stage under Megatron-core's parallel folding
    (`workload.moe_groups`: the expert grid etp-ep-edp over the stage's tp·cp·dp ranks):
    ep ranks `etp` apart, etp consecutive, etp·ep consecutive, and the expert-data-parallel
    group of edp ranks etp·ep apart (expert gradients, expert optimizer shards); and the
    router's groups for its load-balancing loss's token counts: tp·cp consecutive ranks
    (aux_loss) and the stage's tp·cp·dp consecutive ranks (global_aux_loss, which crosses
    nodes once the stage spans several), router.py `tp_cp_group` / `tp_dp_cp_group`."""

    ep: GroupPlacement
    etp: GroupPlacement
    etp_ep: GroupPlacement
    edp: GroupPlacement
    tp_cp: GroupPlacement | None = None
    tp_dp_cp: GroupPlacement | None = None


def expert_groups(scenario: Scenario, hw: HardwareProfile) -> ExpertGroups | None:
    """The scenario's expert groups on `hw` (None for a dense model)."""
    par = scenario.parallel
    if scenario.model.moe is None:
        return None
    etp = par.etp or par.tp
    edp = par.tp * par.cp * par.dp // (par.ep * etp)
    return ExpertGroups(
        ep=strided_group(par.ep, etp, hw),
        etp=strided_group(etp, 1, hw),
        etp_ep=strided_group(etp * par.ep, 1, hw),
        edp=strided_group(edp, etp * par.ep, hw),
        tp_cp=strided_group(par.tp * par.cp, 1, hw),
        tp_dp_cp=strided_group(par.tp * par.cp * par.dp, 1, hw),
    )
