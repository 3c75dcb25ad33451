"""A pipeline stage's messages besides its tasks: pipeline p2p, the data-parallel gradient
reduction (in buckets where Megatron overlaps it), the distributed optimizer's parameter
all-gather, the tied-embedding all-reduce and FP8's amax-reduction group. Pure functions of
values (message bytes, group placements, switches), so `costs.stage_pricing` can cache them
by their inputs."""

from __future__ import annotations

import math

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.costs.network import GroupPlacement, collective_time_s, p2p_time_s
from simcluster.costs.placement import strided_group
from simcluster.workload.model import StageWork
from simcluster.workload.ops import CollectiveKind

MIN_BUCKET_PARAMS = 40_000_000  # Megatron's default DP bucket: max(40M, 1M · |DP×CP|) params
BUCKET_PARAMS_PER_DP_RANK = 1_000_000  # (Megatron-LM training.py::resolve_ddp_bucket_size)


SHAPE_MESSAGE_BYTES = 3 * 8
"""A p2p tensor's shape [s, b, h] as three int64 (`_communicate_shapes`)."""


def p2p_seconds(
    hw: HardwareProfile, same_node: bool, message_bytes: float, tp: GroupPlacement, gather: bool,
    exchanges_shapes: bool = False,
) -> float:  # fmt: skip
    """One pipeline send: each rank sends its 1/t of the activation. Without SP (`gather`:
    t > 1 and no sequence parallelism) the receiver then all-gathers the t pieces over
    NVLink (Megatron-LM 2021's scatter/gather p2p, `megatron/p2p_communication.py`) before
    the p2p call returns, so the message is delivered only after that all-gather.
    `exchanges_shapes` (standalone MTP: `config.mtp_standalone`, whose hops differ in size):
    the tensor's shape goes first in a message of its own, awaited before the tensor's
    (Megatron-core `P2PCommunicator._communicate` -> `_communicate_shapes`, Megatron-LM
    @d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/pipeline_parallel/p2p_communication.py)."""
    seconds = p2p_time_s(message_bytes, same_node, hw)
    if exchanges_shapes:
        seconds += p2p_time_s(SHAPE_MESSAGE_BYTES, same_node, hw)
    if gather:
        seconds += collective_time_s(CollectiveKind.ALL_GATHER, message_bytes * tp.num_ranks, tp, hw)
    return seconds


def dp_bucket_params(scenario: Scenario) -> float:
    """Megatron's `ddp_config.bucket_size` in parameters: max(40M, 1M · |DP×CP|)."""
    par = scenario.parallel
    return max(MIN_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * par.dp * par.cp)


def dp_bucket_counts(scenario: Scenario, stage: StageWork) -> tuple[int, ...]:
    """Buckets per chunk of `stage`. Megatron buckets only with --overlap-grad-reduce, and
    only on pipeline rank 0's first model chunk (`DistributedDataParallel.__init__` sets
    bucket_size None on pp rank > 0; training.py::get_model disables bucketing for chunks
    after the first); everywhere else a chunk's parameters are one bucket. A stage's
    parameters are split evenly over its chunks, and a bucketed chunk into equal buckets of
    at most the bucket size (Megatron closes a bucket at a parameter boundary past it)."""
    chunks = len(stage.chunks)
    counts = [1] * chunks
    if scenario.training.overlap_grad_reduce and stage.stage == 0:
        counts[0] = max(1, math.ceil(stage.num_params / chunks / dp_bucket_params(scenario)))
    return tuple(counts)


def grad_reduce_seconds(
    hw: HardwareProfile, group: GroupPlacement, gradient_bytes: float, distributed_optimizer: bool
) -> float:
    """DP reduction of the main grads over the DP × CP `group` (`costs.placement.dp_cp_group`:
    CP ranks hold identical weights): an all-reduce, or with the distributed optimizer a
    reduce-scatter (the all-gather of the updated parameters is `bucket_seconds` of
    ALL_GATHER)."""
    if distributed_optimizer:
        return collective_time_s(CollectiveKind.REDUCE_SCATTER, gradient_bytes, group, hw)
    return collective_time_s(CollectiveKind.ALL_REDUCE, gradient_bytes, group, hw)


def bucket_seconds(
    hw: HardwareProfile,
    kind: CollectiveKind,
    chunk_bytes: float,
    counts: tuple[int, ...],
    group: GroupPlacement,
) -> tuple[tuple[float, ...], ...]:
    """Per chunk, the seconds of each of its `counts[chunk]` equal buckets' collective of
    `chunk_bytes / count` over `group`: with the distributed optimizer, the reduce-scatter
    of the gradients (`start_grad_sync` per bucket, with --overlap-grad-reduce) and the
    all-gather of the updated parameters (2 bytes per parameter, 1 for the TE linears'
    with --fp8-param-gather: `StageWork.param_gather_bytes`). Each bucket is its own
    collective, so each pays the collective's latency."""
    return tuple((collective_time_s(kind, chunk_bytes / n, group, hw),) * n for n in counts)


def tied_reduce_seconds(hw: HardwareProfile, same_node: bool, embedding_grad_bytes: float) -> float:
    """The all-reduce of the tied word embedding's gradient between the first and the last
    stage (Megatron's embedding group of two ranks)."""
    group = GroupPlacement(num_ranks=2, ranks_per_node=2 if same_node else 1)
    return collective_time_s(CollectiveKind.ALL_REDUCE, embedding_grad_bytes, group, hw)


def amax_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement | None:
    """FP8's amax-reduction group, TP × DP × CP (`get_amax_reduction_group(
    with_context_parallel=True)`): contiguous ranks in Megatron's tp-cp-dp-pp order. Only
    delayed scaling reduces the amaxes once per pass; the other recipes scale each tensor
    from its own amax (`workload.fp8.current_scaling_ops`): None there."""
    if scenario.training.dtype is not Dtype.FP8 or scenario.training.fp8_recipe is not Fp8Recipe.DELAYED:
        return None
    par = scenario.parallel
    return strided_group(par.tp * par.dp * par.cp, 1, hw)
