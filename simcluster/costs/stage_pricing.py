"""Stage pricing: a scenario's workload -> priced stages, the one place that prices them.

`StagePricing` is built once per hardware profile and serves every layout priced on it
(a run, the `plan` search's bounds and simulations, `validate`'s tables). It prices

* each layer kind (`workload.model.LayerKind`) with `costs.chunk.price_layer_ops`, and the
  embedding and output layer the same way (no context-parallel ring, no TE userbuffers);
* each chunk as its layer segments, extras and FP8 amax reductions
  (`costs.chunk.compose_chunk`), with the host's issue seconds (`costs.host`);
* each stage's messages (`costs.stage_transfers`): pipeline sends, the DP gradient
  reduction and its buckets, the distributed optimizer's parameter all-gather, the
  tied-embedding all-reduce, and the optimizer step (`costs.compute.elementwise_time_s`).

Its caches are keyed by value (frozen dataclasses: a layer kind or the extra's ops, the
`PricingLayout`, message bytes and group placements): two layouts that share a layer kind
or a message share its price, whatever objects carry them. A `PricedStage` holds seconds
and whether each message leaves its NVLink domain; the caller (`simulation`) turns it into
the engine's plan and its typed links.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from simcluster.config.choices import CudaGraphImpl, Dtype
from simcluster.config.graph_scope import CudaGraphScope
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.costs.breakdown import Split, chunk_split, layer_split
from simcluster.costs.chunk import (
    NO_CONTEXT_PARALLEL,
    ChunkCost,
    OpsCost,
    compose_chunk,
    fp8_amax_reduction_s,
    op_seconds,
    price_layer_ops,
    price_ops,
)
from simcluster.costs.compute import OPTIMIZER_KIND, elementwise_time_s
from simcluster.costs.ep_overlap import overlapped_cost, paired_saving_s
from simcluster.costs.host import (
    HostPiece,
    chunk_host_s,
    inorder_wait_s,
    layer_op_kernels,
    layer_sync_points,
    op_kernels,
    pass_pieces,
)
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.costs.placement import (
    ExpertGroups,
    cp_group,
    dp_cp_group,
    expert_groups,
    stages_share_node,
    tp_group,
)
from simcluster.costs.stage_transfers import (
    amax_group,
    bucket_seconds,
    dp_bucket_counts,
    grad_reduce_seconds,
    p2p_seconds,
    tied_reduce_seconds,
)
from simcluster.workload.layer import LayerOps
from simcluster.workload.model import ChunkWork, LayerKind, LayerSegment, StageWork, Workload
from simcluster.workload.ops import CollectiveKind, Op


@dataclass(frozen=True, slots=True)
class PricingLayout:
    """What a chunk's price reads of the scenario's layout: the TP and CP groups, the dtype,
    TE userbuffers, FP8's amax group and CUDA graphs (`pricing_layout`)."""

    tp: GroupPlacement
    cp: GroupPlacement
    dtype: Dtype
    tp_comm_overlap: bool
    amax: GroupPlacement | None
    cuda_graph: CudaGraphImpl
    experts: ExpertGroups | None = None  # a MoE model's expert groups (`costs.placement.expert_groups`)
    ep_overlap: bool = False  # training.overlap_moe_expert_parallel_comm (`costs.ep_overlap`)
    delay_wgrad: bool = False  # training.delay_wgrad_compute (`costs.ep_overlap`, with ep_overlap)
    cuda_graph_scope: tuple[CudaGraphScope, ...] = ()  # what a per-layer graph captures ([]: whole layers)


def pricing_layout(scenario: Scenario, hw: HardwareProfile) -> PricingLayout:
    return PricingLayout(
        tp=tp_group(scenario, hw),
        cp=cp_group(scenario, hw),
        dtype=scenario.training.dtype,
        tp_comm_overlap=scenario.tp_comm_overlap_active,
        amax=amax_group(scenario, hw),
        cuda_graph=scenario.training.cuda_graph_impl,
        experts=expert_groups(scenario, hw),
        ep_overlap=scenario.training.overlap_moe_expert_parallel_comm,
        delay_wgrad=scenario.training.delay_wgrad_compute,
        cuda_graph_scope=tuple(scenario.training.cuda_graph_scope),
    )


@dataclass(frozen=True, slots=True)
class PricedChunk:
    """One chunk's microbatch: the GPU's seconds and the host's seconds to issue the
    kernels of its forward and its backward (with recompute)."""

    cost: ChunkCost
    host_forward_s: float
    host_backward_s: float
    # the GPU's wait for the host, op by op in issue order (`costs.host.inorder_wait_s`);
    # None: the host is not priced (or a graph captures the whole iteration): no wait
    forward_wait_s: float | None = None
    backward_wait_s: float | None = None

    @property
    def forward_busy_s(self) -> float:
        """The forward task's seconds: GPU + its in-order host wait (`costs.host`)."""
        return self.cost.forward_s + self.forward_host_wait_s

    @property
    def backward_busy_s(self) -> float:
        return self.cost.backward_s + self.backward_host_wait_s

    @property
    def forward_host_wait_s(self) -> float:
        """Seconds the GPU waits for the host in the forward task."""
        return self.forward_wait_s or 0.0

    @property
    def backward_host_wait_s(self) -> float:
        return self.backward_wait_s or 0.0


def _slice_price(
    hw: HardwareProfile, ops: LayerOps, tp: GroupPlacement, dtype: Dtype, cp: GroupPlacement,
    tp_comm_overlap: bool, experts: ExpertGroups | None,
) -> Callable[[tuple[Op, ...]], OpsCost]:  # fmt: skip
    """Prices a run of `ops`' ops as `price_layer_ops` prices a whole pass (the EP overlap's
    phases, the host's sync segments)."""

    def price(part: tuple[Op, ...]) -> OpsCost:
        return price_ops(part, hw, tp, dtype, cp, tp_comm_overlap, ops.fp8_recipe, experts)

    return price


@dataclass(frozen=True, slots=True)
class PricedTransfer:
    """A message or collective of `seconds`, over the NICs where it `crosses_nodes` (leaves
    its NVLink domain), else over NVLink."""

    crosses_nodes: bool
    seconds: float
    # a pipeline send whose chunks send messages of different sizes (standalone MTP,
    # `Workload.message_bytes`): each chunk's seconds; `seconds` is then the least of them
    chunk_seconds: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class PricedGather:
    """The distributed optimizer's parameter all-gather: per chunk, each bucket's seconds;
    `overlapped` with the next iteration's forwards (--overlap-param-gather) or not; over
    the NICs where its DP × CP group `crosses_nodes`."""

    buckets: tuple[tuple[float, ...], ...]
    overlapped: bool
    crosses_nodes: bool

    @property
    def total_s(self) -> float:
        return sum(sum(chunk) for chunk in self.buckets)


@dataclass(frozen=True, slots=True)
class PricedStage:
    """Everything a stage's plan needs priced, independent of the microbatch count."""

    stage: int
    chunks: tuple[PricedChunk, ...]
    send_forward: PricedTransfer | None  # to the next virtual stage (None without a pipeline)
    send_backward: PricedTransfer | None
    grad_reduce: PricedTransfer | None  # DP × CP reduction (None when d·c = 1)
    tied_grad_reduce: PricedTransfer | None  # first <-> last stage embedding grads
    optimizer_s: float
    grad_buckets: tuple[tuple[float, ...], ...] | None  # overlapped reduce-scatter, per chunk
    param_gather: PricedGather | None
    # MoE: the expert gradients' reduction over the expert-data-parallel group, and (with the
    # distributed optimizer) the expert parameters' all-gather over it, each per chunk
    expert_grad_reduce: PricedTransfer | None = None
    expert_param_gather: PricedGather | None = None
    # EP overlap: each chunk priced without the pair's saving, for the tasks the pipeline
    # runs alone (warm-up forwards, cooldown backwards); None without the overlap
    unpaired_chunks: tuple[PricedChunk, ...] | None = None


class StagePricing:
    """Prices workloads on one hardware profile (module docstring); build once per profile
    and reuse it across layouts."""

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw
        self._layers: dict[tuple[object, ...], ChunkCost] = {}
        self._chunks: dict[tuple[object, ...], PricedChunk] = {}
        self._seconds: dict[tuple[object, ...], float] = {}
        self._splits: dict[tuple[object, ...], Split] = {}
        self._buckets: dict[tuple[object, ...], tuple[tuple[float, ...], ...]] = {}
        self._pieces: dict[tuple[object, ...], tuple[tuple[HostPiece, ...], tuple[HostPiece, ...]]] = {}

    def layer(
        self, key: LayerKind | LayerOps, ops: LayerOps, tp: GroupPlacement, dtype: Dtype,
        cp: GroupPlacement = NO_CONTEXT_PARALLEL, tp_comm_overlap: bool = False,
        experts: ExpertGroups | None = None, ep_overlap: bool = False, delay_wgrad: bool = False,
    ) -> ChunkCost:  # fmt: skip
        """`price_layer_ops(ops, …)`, cached by `key`: the layer's kind, or (for the
        embedding, the output layer or a layer without a kind) the ops themselves. With
        `ep_overlap` the dispatcher's seconds the combined 1F1B schedule hides are taken
        off (`costs.ep_overlap`), the experts' weight gradients delayed with `delay_wgrad`."""
        cache_key = (key, tp, dtype, cp, tp_comm_overlap, experts, ep_overlap, ep_overlap and delay_wgrad)
        cost = self._layers.get(cache_key)
        if cost is None:
            cost = price_layer_ops(ops, self.hw, tp, dtype, cp, tp_comm_overlap, experts)
            if ep_overlap:
                price = _slice_price(self.hw, ops, tp, dtype, cp, tp_comm_overlap, experts)
                cost = overlapped_cost(cost, paired_saving_s(ops, price, delay_wgrad, self.hw))
            self._layers[cache_key] = cost
        return cost

    def segment(self, segment: LayerSegment, layout: PricingLayout) -> ChunkCost:
        """One layer of `segment`'s kind, with the layout's ring and userbuffers."""
        return self.layer(
            segment.kind, segment.layer, layout.tp, layout.dtype, layout.cp, layout.tp_comm_overlap,
            layout.experts, layout.ep_overlap, layout.delay_wgrad,
        )  # fmt: skip

    def extra(self, ops: LayerOps, layout: PricingLayout) -> ChunkCost:
        """The embedding or the output layer (plain NCCL pricing, no ring)."""
        return self.layer(ops, ops, layout.tp, layout.dtype)

    def amax_s(self, layout: PricingLayout) -> float:
        """FP8 delayed scaling's amax all-reduce, once per pass (0 otherwise)."""
        if layout.dtype is not Dtype.FP8 or layout.amax is None:
            return 0.0
        return fp8_amax_reduction_s(layout.amax, self.hw)

    def chunk(self, chunk: ChunkWork, layout: PricingLayout) -> PricedChunk:
        """The chunk's segments, then its embedding / output layer, then FP8's amax
        reductions (`compose_chunk`), and the host's issue seconds."""
        shape = tuple((segment.kind, segment.num_layers) for segment in chunk.segments)
        key = (shape, chunk.embedding, chunk.output, layout)
        priced = self._chunks.get(key)
        if priced is None:
            extras = [self.extra(extra, layout) for extra in (chunk.embedding, chunk.output) if extra]
            layers = [(segment.num_layers, self.segment(segment, layout)) for segment in chunk.segments]
            cost = compose_chunk(layers, extras, self.amax_s(layout))
            graph, amax = layout.cuda_graph, layout.amax is not None
            host = chunk_host_s(chunk, self.hw, layout.dtype, graph, amax, layout.cuda_graph_scope)
            waits = self._host_waits(chunk, layout)
            priced = self._chunks[key] = PricedChunk(cost, *host, *waits)
        return priced

    def _host_waits(self, chunk: ChunkWork, layout: PricingLayout) -> tuple[float | None, float | None]:
        """The forward's and backward's host-bound waits, op by op in issue order, cut at a
        MoE dispatcher's syncs (`costs.host.inorder_wait_s`); (None, None) where the host is
        not priced or a graph captures the whole iteration."""
        per_op = self.hw.compute.host_issue_s_per_op
        if per_op is None or layout.cuda_graph is CudaGraphImpl.FULL_ITERATION:
            return None, None
        forward: list[HostPiece] = []
        backward: list[HostPiece] = []
        if chunk.output is not None:
            backward += self._extra_pieces(chunk.output, layout)[1]
        if chunk.embedding is not None:
            forward += self._extra_pieces(chunk.embedding, layout)[0]
        for segment in chunk.segments:
            layer_forward, layer_backward = self._layer_pieces(segment, layout)
            forward += layer_forward * segment.num_layers
        for segment in reversed(chunk.segments):
            backward += self._layer_pieces(segment, layout)[1] * segment.num_layers
        if chunk.output is not None:
            forward += self._extra_pieces(chunk.output, layout)[0]
        if chunk.embedding is not None:
            backward += self._extra_pieces(chunk.embedding, layout)[1]
        if layout.amax is not None:
            amax = HostPiece(self.amax_s(layout), 1)
            forward, backward = [*forward, amax], [*backward, amax]
        return inorder_wait_s(forward, per_op), inorder_wait_s(backward, per_op)

    def _extra_pieces(self, ops: LayerOps, layout: PricingLayout) -> tuple[list[HostPiece], list[HostPiece]]:
        """The embedding's or the output layer's ops, one piece each (plain NCCL pricing)."""
        cost, dtype = self.extra(ops, layout), layout.dtype
        slice_cost = _slice_price(self.hw, ops, layout.tp, dtype, NO_CONTEXT_PARALLEL, False, None)

        def price(part: tuple[Op, ...]) -> float:
            return slice_cost(part).total_s

        def pieces(part: tuple[Op, ...], total_s: float) -> list[HostPiece]:
            own = op_seconds(part, self.hw, layout.tp, dtype, fp8_recipe=ops.fp8_recipe)
            return list(pass_pieces(part, total_s, price, op_kernels(part, dtype), (), own))

        return pieces(ops.forward, cost.forward_s), pieces(ops.backward, cost.backward_s)

    def _layer_pieces(
        self, segment: LayerSegment, layout: PricingLayout
    ) -> tuple[tuple[HostPiece, ...], tuple[HostPiece, ...]]:
        """One layer's forward, and its recompute then backward, one piece per op, marked at
        its syncs."""
        key = ("host_pieces", segment.kind, layout)
        pieces = self._pieces.get(key)
        if pieces is None:
            cost, ops, moe = self.segment(segment, layout), segment.layer, segment.kind.moe
            slice_cost = _slice_price(
                self.hw, ops, layout.tp, layout.dtype, layout.cp, layout.tp_comm_overlap, layout.experts
            )

            def price(part: tuple[Op, ...]) -> float:
                return slice_cost(part).total_s

            args = (layout.dtype, moe, layout.cuda_graph, layout.cuda_graph_scope)
            rates = (self.hw, layout.tp, layout.dtype, layout.cp, ops.fp8_recipe, layout.experts)
            weights = self.hw.compute.moe_host_weights()
            passes = [
                pass_pieces(
                    part, total, price,
                    layer_op_kernels(part, *args, recompute=part is ops.recompute, weights=weights),
                    layer_sync_points(part, moe, layout.cuda_graph, layout.cuda_graph_scope),
                    op_seconds(part, *rates),
                )
                for part, total in (
                    (ops.forward, cost.forward.total_s), (ops.recompute, cost.recompute.total_s),
                    (ops.backward, cost.backward.total_s),
                )
            ]  # fmt: skip
            pieces = self._pieces[key] = (passes[0], passes[1] + passes[2])
        return pieces

    def layer_of(self, workload: Workload, layout: PricingLayout) -> ChunkCost:
        """The workload's representative layer (`Workload.layer`), as its chunks run it."""
        ops = workload.layer
        return self.layer(
            ops, ops, layout.tp, layout.dtype, layout.cp, layout.tp_comm_overlap, layout.experts,
            layout.ep_overlap, layout.delay_wgrad,
        )  # fmt: skip

    def layer_split(self, key: LayerKind | LayerOps, ops: LayerOps, layout: PricingLayout) -> Split:
        """One layer's price split by kind of work (`costs.breakdown.layer_split`), cached by
        `key` as `layer` is. The caller must not change the returned mapping."""
        cache_key = (key, layout)
        split = self._splits.get(cache_key)
        if split is None:
            cost = self.layer(
                key, ops, layout.tp, layout.dtype, layout.cp, layout.tp_comm_overlap, layout.experts,
                layout.ep_overlap, layout.delay_wgrad,
            )  # fmt: skip
            split = self._splits[cache_key] = layer_split(
                ops, cost, self.hw, layout.tp, layout.dtype, layout.cp
            )
        return split

    def chunk_split(self, chunk: ChunkWork, layout: PricingLayout) -> Split:
        """The chunk's microbatch split by kind (`costs.breakdown.chunk_split`): its
        segments' layer splits, extras, amax reductions and host-bound waits."""
        priced = self.chunk(chunk, layout)
        layers = [(s.num_layers, self.layer_split(s.kind, s.layer, layout)) for s in chunk.segments]
        extras = [self.extra(extra, layout) for extra in (chunk.embedding, chunk.output) if extra]
        wait_s = priced.forward_host_wait_s + priced.backward_host_wait_s
        return chunk_split(layers, extras, self.amax_s(layout), wait_s)

    def _cached(self, key: tuple[object, ...], price: Callable[[], float]) -> float:
        seconds = self._seconds.get(key)
        if seconds is None:
            seconds = self._seconds[key] = price()
        return seconds

    def stages(self, scenario: Scenario, workload: Workload) -> tuple[PricedStage, ...]:
        layout = pricing_layout(scenario, self.hw)
        return tuple(self.stage(scenario, workload, stage, layout) for stage in workload.stages)

    def stage(
        self, scenario: Scenario, workload: Workload, stage: StageWork, layout: PricingLayout | None = None
    ) -> PricedStage:
        """One stage's chunks and messages (`PricedStage`)."""
        hw, par, r = self.hw, scenario.parallel, stage.stage
        layout = layout or pricing_layout(scenario, hw)
        tr = scenario.training
        dp_group = dp_cp_group(scenario, hw) if par.dp * par.cp > 1 else None
        optimizer_s = self._cached(
            ("optimizer", stage.optimizer_step_bytes),
            lambda: elementwise_time_s(stage.optimizer_step_bytes, hw, OPTIMIZER_KIND),
        )
        grad_reduce = buckets = gather = None
        if dp_group is not None:
            grad_reduce = self._grad_reduce(dp_group, stage.dp_gradient_bytes, tr.use_distributed_optimizer)
            if tr.use_distributed_optimizer:
                counts = dp_bucket_counts(scenario, stage)
                chunks = len(stage.chunks)
                if tr.overlap_grad_reduce:
                    buckets = self._bucket_seconds(
                        CollectiveKind.REDUCE_SCATTER, stage.dp_gradient_bytes / chunks, counts, dp_group
                    )
                gather_buckets = self._bucket_seconds(
                    CollectiveKind.ALL_GATHER, stage.param_gather_bytes / chunks, counts, dp_group
                )
                gather = PricedGather(gather_buckets, tr.overlap_param_gather, dp_group.crosses_nodes)
        expert_reduce, expert_gather = self._expert_transfers(scenario, stage, layout)
        return PricedStage(
            stage=r,
            chunks=tuple(self.chunk(chunk, layout) for chunk in stage.chunks),
            send_forward=self._send(scenario, workload, r, 1, layout),
            send_backward=self._send(scenario, workload, r, -1, layout),
            grad_reduce=grad_reduce,
            tied_grad_reduce=self._tied(scenario, stage),
            optimizer_s=optimizer_s,
            grad_buckets=buckets,
            param_gather=_with_expert_gather(gather, expert_gather),
            expert_grad_reduce=expert_reduce,
            expert_param_gather=expert_gather if gather is None else None,
            unpaired_chunks=self._unpaired_chunks(stage, layout),
        )

    def _unpaired_chunks(self, stage: StageWork, layout: PricingLayout) -> tuple[PricedChunk, ...] | None:
        """Under the EP overlap, the stage's chunks as a pass that runs alone prices them:
        without the combined 1F1B pair's saving (`costs.ep_overlap`), as without the key."""
        if not layout.ep_overlap:
            return None
        alone = replace(layout, ep_overlap=False, delay_wgrad=False)
        return tuple(self.chunk(chunk, alone) for chunk in stage.chunks)

    def _expert_transfers(
        self, scenario: Scenario, stage: StageWork, layout: PricingLayout
    ) -> tuple[PricedTransfer | None, PricedGather | None]:
        """A MoE stage's expert gradients reduced over the expert-data-parallel group
        (all-reduce, or reduce-scatter with the distributed optimizer: `grad_reduce_seconds`)
        and, with the distributed optimizer, its expert parameters all-gathered over it (each
        chunk's share in one piece: no buckets in this slice)."""
        groups = layout.experts
        if groups is None or stage.expert_gradient_bytes == 0 or groups.edp.num_ranks == 1:
            return None, None
        tr, edp = scenario.training, groups.edp
        reduce = self._grad_reduce(edp, stage.expert_gradient_bytes, tr.use_distributed_optimizer)
        if not tr.use_distributed_optimizer:
            return reduce, None
        gather_bytes = stage.expert_param_gather_bytes
        seconds = self._cached(
            ("expert gather", edp, gather_bytes),
            lambda: collective_time_s(CollectiveKind.ALL_GATHER, gather_bytes, edp, self.hw),
        )
        chunks = len(stage.chunks)
        per_chunk = tuple((seconds / chunks,) for _ in range(chunks))
        return reduce, PricedGather(per_chunk, tr.overlap_param_gather, edp.crosses_nodes)

    def _send(
        self, scenario: Scenario, workload: Workload, src: int, step: int, layout: PricingLayout
    ) -> PricedTransfer | None:
        """Rank `src`'s pipeline send to rank src + `step` (1: forward, -1: backward): one
        `p2p_bytes` message a hop, or with standalone MTP each chunk's message
        `Workload.message_bytes` of the hop it makes (virtual stage c·pp + src to the one
        `step` away), its shape sent first."""
        par = scenario.parallel
        if par.pp == 1:
            return None
        same = stages_share_node(scenario, self.hw, src, (src + step) % par.pp)
        gather = par.tp > 1 and not par.sequence_parallel
        shapes = workload.mtp_standalone

        def seconds_for(message: float) -> float:
            key = ("p2p", same, message, layout.tp, gather, shapes)
            return self._cached(key, lambda: p2p_seconds(self.hw, same, message, layout.tp, gather, shapes))

        if not shapes:  # every hop one message (plan prices many layouts: the short way)
            return PricedTransfer(not same, seconds_for(workload.p2p_bytes))
        hops = range(src, par.pp * par.vpp, par.pp)  # the rank's virtual stages, chunk by chunk
        chunk_seconds = tuple(seconds_for(workload.message_bytes(min(vs, vs + step))) for vs in hops)
        if len(set(chunk_seconds)) == 1:
            return PricedTransfer(not same, chunk_seconds[0])
        return PricedTransfer(not same, min(chunk_seconds), chunk_seconds)

    def _grad_reduce(self, group: GroupPlacement, gradient_bytes: float, distributed: bool) -> PricedTransfer:
        key = ("reduce", group, gradient_bytes, distributed)
        seconds = self._cached(key, lambda: grad_reduce_seconds(self.hw, group, gradient_bytes, distributed))
        return PricedTransfer(group.crosses_nodes, seconds)

    def _bucket_seconds(
        self, kind: CollectiveKind, chunk_bytes: float, counts: tuple[int, ...], group: GroupPlacement
    ) -> tuple[tuple[float, ...], ...]:
        key = (kind, chunk_bytes, counts, group)
        buckets = self._buckets.get(key)
        if buckets is None:
            buckets = self._buckets[key] = bucket_seconds(self.hw, kind, chunk_bytes, counts, group)
        return buckets

    def _tied(self, scenario: Scenario, stage: StageWork) -> PricedTransfer | None:
        grad_bytes = stage.embedding_grad_bytes
        if grad_bytes == 0:
            return None
        same = stages_share_node(scenario, self.hw, 0, scenario.parallel.pp - 1)
        seconds = self._cached(
            ("tied", same, grad_bytes), lambda: tied_reduce_seconds(self.hw, same, grad_bytes)
        )
        return PricedTransfer(not same, seconds)


def _with_expert_gather(gather: PricedGather | None, experts: PricedGather | None) -> PricedGather | None:
    """The dense parameter gather with the expert all-gather as one more piece of each
    chunk's gather (the engine gates a task on one collective), serialised with it on the
    stage's dp channel; the dense gather alone where there is no expert gather. Without a
    dense gather the expert one stays `PricedStage.expert_param_gather`."""
    if gather is None or experts is None:
        return gather
    return PricedGather(
        tuple(dense + extra for dense, extra in zip(gather.buckets, experts.buckets, strict=True)),
        gather.overlapped,
        gather.crosses_nodes or experts.crosses_nodes,
    )


def host_issue_share(stages: Sequence[PricedStage]) -> float:
    """The host's issue seconds over the GPU's seconds, forward + backward of one microbatch,
    for the chunk where that ratio is largest (`costs.host`): 1 or more is host-bound, just
    under 1 is a run whose time depends on the host CPU's issue speed as much as on the GPU
    (docs/moe_host.md, "The H100 MoE miss has the host's signature"). 0 where the profile
    does not price the host."""
    shares = [
        (c.host_forward_s + c.host_backward_s) / gpu_s
        for stage in stages
        for c in stage.chunks
        if (gpu_s := c.cost.forward_s + c.cost.backward_s) > 0
    ]
    return max(shares, default=0.0)
