"""Cost model: GEMM roofline and wave quantization, ring collectives, p2p."""

import pytest

from simcluster.config.choices import Dtype
from simcluster.config.hardware import load_hardware
from simcluster.costs.chunk import price_ops
from simcluster.costs.compute import elementwise_time_s, gemm_efficiency, gemm_time_s, wave_efficiency
from simcluster.costs.network import GroupPlacement, collective_time_s, p2p_time_s, ring_factor
from simcluster.workload.ops import CollectiveKind, GemmShape, Module, Pass, collective, elementwise, gemm

B = Pass.INPUT_GRAD

A100 = load_hardware("a100-sxm4-80gb-public")
A100_DTYPE = Dtype.BF16
TILES = [tuple(t) for t in A100.compute.gemm_tiles]
NODE = GroupPlacement(num_ranks=8, ranks_per_node=8)


def test_large_square_gemm_reaches_the_cited_ceiling():
    """A GEMM filling whole waves runs at gemm_max_efficiency (A100 public: MAMF 86.9 % × 0.8652
    sustained, 75.19 %)."""
    shape = GemmShape(m=256 * 108, n=128 * 8, k=8192)
    assert wave_efficiency(shape, 108, TILES) == pytest.approx(1.0)
    assert gemm_efficiency(shape, A100) == pytest.approx(0.7519)


def test_a_gemm_one_tile_past_a_wave_is_slower_per_flop():
    """109 tiles on 108 SMs need two waves: efficiency drops (wave quantization)."""
    full = GemmShape(m=128 * 108, n=128, k=4096)
    spill = GemmShape(m=128 * 109, n=128, k=4096)
    assert gemm_efficiency(spill, A100) < gemm_efficiency(full, A100)


def test_skinny_gemm_falls_to_the_memory_roofline():
    """Attention's K = head_dim GEMM is memory bound: time ≈ bytes / achieved HBM bandwidth."""
    shape = GemmShape(m=2048, n=2048, k=64, batch=32)
    memory_s = shape.bytes_moved(2) / (
        A100.memory_bandwidth_bytes_per_s * A100.compute.memory_bound_efficiency
    )
    assert gemm_time_s(shape, A100) == pytest.approx(A100.kernel_launch_s + memory_s)


def test_elementwise_is_bytes_over_bandwidth_plus_launch():
    """1 GB through a 2,039 GB/s × 0.85 memory system takes ~0.577 ms + launch."""
    assert elementwise_time_s(1e9, A100) == pytest.approx(2e-6 + 1e9 / (2039e9 * 0.85))


def test_ring_factors_follow_nccl_busbw():
    """All-reduce moves 2(n−1)/n, all-gather and reduce-scatter (n−1)/n of the buffer."""
    assert ring_factor(CollectiveKind.ALL_REDUCE, 8) == pytest.approx(1.75)
    assert ring_factor(CollectiveKind.ALL_GATHER, 8) == pytest.approx(0.875)


def test_all_reduce_equals_reduce_scatter_plus_all_gather():
    """Paper claim: SP's reduce-scatter + all-gather move the same bytes as TP's all-reduce."""
    size = 100e6
    all_reduce = collective_time_s(CollectiveKind.ALL_REDUCE, size, NODE, A100)
    split = collective_time_s(CollectiveKind.REDUCE_SCATTER, size, NODE, A100) + collective_time_s(
        CollectiveKind.ALL_GATHER, size, NODE, A100
    )
    assert split == pytest.approx(all_reduce)


def test_nvlink_allreduce_reproduces_the_measured_sweep():
    """At a measured size, the model returns the nccl-tests time (128 MiB: 1327.6 µs)."""
    seconds = collective_time_s(CollectiveKind.ALL_REDUCE, 134.217728e6, NODE, A100)
    assert seconds == pytest.approx(1327.6e-6, rel=0.01)


def test_crossing_nodes_is_slower_and_more_ranks_per_node_help():
    """A DP ring with one rank per node is NIC-bound; 8 ranks per node use 8 NICs (192 GB/s)."""
    one = GroupPlacement(num_ranks=16, ranks_per_node=1)
    eight = GroupPlacement(num_ranks=16, ranks_per_node=8)
    size = 1e9
    t_one = collective_time_s(CollectiveKind.ALL_REDUCE, size, one, A100)
    t_eight = collective_time_s(CollectiveKind.ALL_REDUCE, size, eight, A100)
    assert t_one > 7 * t_eight
    latency_s = (8.4 + 2 * 15 * 14) * 1e-6  # NCCL ring: base + 2(n−1) network steps
    assert t_eight == pytest.approx(latency_s + 1.875 * size / 192e9)


def test_p2p_inter_node_uses_one_nic():
    """6.3 MB over a 24 GB/s HDR NIC ≈ 0.26 ms + latency; NVLink is much faster."""
    assert p2p_time_s(6.29e6, same_node=False, hw=A100) == pytest.approx(6.29e6 / 24e9 + 22.4e-6)
    assert p2p_time_s(6.29e6, same_node=True, hw=A100) < p2p_time_s(6.29e6, same_node=False, hw=A100) / 5


def test_overlapped_collective_hides_behind_the_next_gemm():
    """overlaps_next: with full overlap the pair costs max(comm, gemm); with 0 the sum."""
    ops = (
        collective("ar", CollectiveKind.ALL_REDUCE, 100e6, overlaps_next=True, module=Module.QKV, pass_=B),
        gemm("wgrad", GemmShape(8192, 3072, 6144), module=Module.QKV, pass_=Pass.WEIGHT_GRAD),
        elementwise("tail", 1e6, module=Module.LAYERNORM, pass_=B),
    )
    comm = collective_time_s(CollectiveKind.ALL_REDUCE, 100e6, NODE, A100)
    compute = gemm_time_s(GemmShape(8192, 3072, 6144), A100) + elementwise_time_s(1e6, A100)
    hidden = price_ops(ops, A100, NODE, A100_DTYPE)
    serial_hw = A100.model_copy(
        update={"network": A100.network.model_copy(update={"tp_overlap_fraction": 0.0})}
    )
    serial = price_ops(ops, serial_hw, NODE, A100_DTYPE)
    assert hidden.total_s == pytest.approx(
        max(comm, compute - elementwise_time_s(1e6, A100)) + elementwise_time_s(1e6, A100)
    )
    assert serial.total_s == pytest.approx(comm + compute)


def test_measured_gemm_points_stand_at_their_shapes_and_keep_the_roofline_elsewhere():
    """With `gemm_points`, a measured shape costs launch + FLOPs / its rate, as measured; a
    shape the points only bracket (a skinny attention BMM, K = 128, blended from square
    compute-bound points) can not run faster than its bytes allow."""
    from simcluster.config.hardware import GemmPoint

    points = [GemmPoint(m=n, n=n, k=n, tflop_per_s=250.0) for n in (2048, 4096, 8192)]
    hw = A100.model_copy(update={"compute": A100.compute.model_copy(update={"gemm_points": points})})
    square = GemmShape(m=4096, n=4096, k=4096)
    assert gemm_time_s(square, hw) == pytest.approx(hw.kernel_launch_s + square.flops / 250e12)
    skinny = GemmShape(m=2048, n=2048, k=128, batch=96)
    from simcluster.costs.compute import achieved_bandwidth_bytes_per_s

    bytes_moved = skinny.bytes_moved(2)
    roofline_s = bytes_moved / achieved_bandwidth_bytes_per_s(bytes_moved, hw)
    assert gemm_time_s(skinny, hw) >= hw.kernel_launch_s + roofline_s * (1 - 1e-9)
    assert gemm_time_s(skinny, hw) > hw.kernel_launch_s + skinny.flops / 250e12
