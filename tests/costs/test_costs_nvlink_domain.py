"""Placement on NVLink domains (GB200 NVL72: 72 GPUs over 4-GPU trays) and the all-reduce
(NVLS) vs ring all-gather tables. Hand-computed answers from the profiles' tables."""

from pathlib import Path

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.costs.placement import stages_share_node, strided_group
from simcluster.workload.ops import CollectiveKind

ROOT = Path(__file__).resolve().parents[2]
H100 = load_hardware("h100-sxm5-80gb")
GB200 = load_hardware("gb200-nvl72")
A100 = load_hardware("a100-sxm4-80gb-public")
SIZE = 8589.934592e6  # 8 GiB: a measured row of every table below
NODE = GroupPlacement(num_ranks=8, ranks_per_node=8)


def test_a_group_of_16_stays_on_nvlink_in_nvl72_but_crosses_ib_on_h100():
    """A tp·cp group of 16 contiguous ranks: 16 in one NVL72 domain (4 trays), so NVLink;
    on 8-GPU H100 nodes two nodes of 8, so InfiniBand."""
    gb200, h100 = strided_group(16, 1, GB200), strided_group(16, 1, H100)
    assert (gb200.ranks_per_node, gb200.crosses_nodes) == (16, False)
    assert (h100.ranks_per_node, h100.crosses_nodes) == (8, True)
    # NVL72: (n−1)/n · S / ring busbw at 8 GiB (679.61 GB/s, above the latency floor).
    assert collective_time_s(CollectiveKind.ALL_GATHER, SIZE, gb200, GB200) == pytest.approx(
        15 / 16 * SIZE / 679.61e9
    )
    # H100: base + 15 IB steps, busbw = min(8 ranks × 47 GB/s NIC, 370 GB/s NVLink ring).
    assert collective_time_s(CollectiveKind.ALL_GATHER, SIZE, h100, H100) == pytest.approx(
        (8.4 + 15 * 14) * 1e-6 + 15 / 16 * SIZE / 370e9
    )


def test_a_strided_group_counts_ranks_per_domain():
    """A DP group of 16 with stride t = 8: 9 ranks per NVL72 domain, 1 per H100 node."""
    assert strided_group(16, 8, GB200).ranks_per_node == 9
    assert strided_group(16, 8, H100).ranks_per_node == 1


def test_pipeline_neighbours_on_different_trays_of_one_rack_use_nvlink():
    """t = 8: stage 1 starts at rank 8, two trays away on GB200 but in the same rack."""
    scenario = load_scenario(ROOT / "scenarios/hardware/gpt3-175b-sp-selective-gb200.yaml")
    assert stages_share_node(scenario, GB200, 0, 1)
    assert stages_share_node(scenario, GB200, 0, 7)  # 64 GPUs: all in one rack
    assert not stages_share_node(scenario, H100, 0, 1)


def test_nvls_speeds_up_all_reduce_only():
    """H100 at 8 GiB: all-reduce at the NVLS 478.87 GB/s, all-gather / reduce-scatter at the
    ring 370, so all-reduce beats reduce-scatter + all-gather; A100 (one table) does not."""
    all_reduce = collective_time_s(CollectiveKind.ALL_REDUCE, SIZE, NODE, H100)
    assert all_reduce == pytest.approx(1.75 * SIZE / 478.87e9)
    gather = collective_time_s(CollectiveKind.ALL_GATHER, SIZE, NODE, H100)
    assert gather == pytest.approx(0.875 * SIZE / 370e9)
    assert collective_time_s(CollectiveKind.REDUCE_SCATTER, SIZE, NODE, H100) == pytest.approx(gather)
    assert all_reduce < 2 * gather
    a100_split = 2 * collective_time_s(CollectiveKind.ALL_GATHER, SIZE, NODE, A100)
    assert collective_time_s(CollectiveKind.ALL_REDUCE, SIZE, NODE, A100) == pytest.approx(a100_split)


def test_an_all_reduce_over_four_ranks_runs_at_the_ring_busbw_not_the_nvls_one():
    """NCCL runs an all-reduce of at most 4 GPUs as a ring (8×H200: 363.3 GB/s with NVLS on
    or off; ml-engineering "SHARP"): a TP-4 or 2-rank all-reduce at 8 GiB takes 2(n−1)/n · S
    over the ring's 370 GB/s on H100, not the 8-GPU NVLS 478.87; 5 ranks and up keep NVLS."""
    for n in (2, 4):
        group = GroupPlacement(num_ranks=n, ranks_per_node=n)
        assert collective_time_s(CollectiveKind.ALL_REDUCE, SIZE, group, H100) == pytest.approx(
            2 * (n - 1) / n * SIZE / 370e9
        )
    five = GroupPlacement(num_ranks=5, ranks_per_node=5)
    assert collective_time_s(CollectiveKind.ALL_REDUCE, SIZE, five, H100) == pytest.approx(
        1.6 * SIZE / 478.87e9
    )


def test_a_small_all_reduce_over_four_ranks_keeps_the_sweeps_latency_ramp():
    """Below the ring table's one 16 GiB point the all-reduce sweep's own rate stands where
    it is lower (H100, 1 MiB: 43.70 GB/s), so the cap never makes a small message faster."""
    mib = 1.048576e6
    group = GroupPlacement(num_ranks=4, ranks_per_node=4)
    assert collective_time_s(CollectiveKind.ALL_REDUCE, mib, group, H100) == pytest.approx(
        1.5 * mib / 43.70e9
    )


def test_a100_has_no_ring_table_so_its_all_reduce_is_unchanged_at_any_width():
    """The A100 profile (Table 4/5 validation) has one all-reduce sweep and no ring table."""
    group = GroupPlacement(num_ranks=4, ranks_per_node=4)
    assert A100.network.nvlink_allgather_busbw is None
    gather = collective_time_s(CollectiveKind.ALL_GATHER, SIZE, group, A100)  # the same one sweep
    assert collective_time_s(CollectiveKind.ALL_REDUCE, SIZE, group, A100) == pytest.approx(2 * gather)
