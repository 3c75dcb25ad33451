"""Host issue time: the CPU seconds to launch a task's kernels, and the GPU's wait for them.

PyTorch issues kernels asynchronously, so the GPU is not slowed by the host as long as the
host issues faster than the GPU runs. When it does not (small layers, high TP, many small
kernels), the GPU waits between kernels. Per task (one chunk's forward or backward of one
microbatch) the model is

    task = max(gpu, host),   host = kernels issued · host_issue_s_per_op,
    host-bound wait = max(0, host − gpu),

with `host_issue_s_per_op` the profile's `compute.host_issue_us_per_op` (absent: the host
is not priced and the GPU never waits). It assumes the host's lead does not carry from one
task to the next (each pipeline task starts after a p2p receive) and is free within a task.

Kernels issued: one per op (`workload.ops.Op` is one kernel or collective), two for a TE
linear's FP8 fprop / dgrad GEMM (its input's cast), 3·c − 2 for a context-parallel ring
(c attention steps, c − 1 merges, c − 1 send/receive pairs), one per pass for FP8's delayed
amax reduction.

MoE layers (`costs.moe_host`): the ops of the MoE block issue the kernels Megatron-core's
router, token dispatcher and Transformer Engine's `GroupedLinear` launch for them
(`moe_host.moe_op_kernels`), and a dropless dispatcher's forward blocks the host on a
device-to-host copy of the token counts (`moe_host.sync_points`). A profile may price the
MoE block's launches apart (`compute.moe_host_us_per_op`, and `expert_gemm_host_us_per_launch`
for the expert GEMMs' per-expert launches): kernels are then counted in units of
`host_issue_us_per_op` (a MoE launch weighs their ratio; `moe_host.weighted_moe_kernels`),
so a profile without the keys counts integers, as always. After such a sync the host
has no lead: the GPU waits for every kernel the host issues until the host is ahead again.
A task with syncs is cut into segments at them, and (Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553, token_dispatcher.py
`MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`,
`MoEAllGatherTokenDispatcher.dispatch_postprocess`, fused_a2a.py `FusedDispatch.forward`)

    task = gpu + Σ_segments max(0, host_k − gpu_k),

with gpu_k the GPU seconds of segment k (from the previous sync's copy point to this one's)
and host_k its issue seconds (the host issues up to the sync, the GPU's copy point can be
earlier: `moe_host.SyncPoint`). Without a sync it is the one-segment rule above, computed as
it always was; each segment's max(gpu_k, host_k) ≥ its share, so a task with syncs is never
faster than the same task priced across its whole length.

CUDA graphs (`training.cuda_graph_impl`, Megatron-LM `--cuda-graph-impl`,
megatron/core/transformer/transformer_config.py `cuda_graph_impl`): `local` (Megatron's
CudaGraphManager, the former `--enable-cuda-graph`) and `transformer_engine` (TE
`make_graphed_callables`, the former `--external-cuda-graph`) capture each transformer
layer per microbatch, with the default (empty) `--cuda-graph-modules`: a layer's forward or
backward is one graph launch, and the embedding and output layer stay eager;
`full_iteration` captures the whole forward-backward pass (not the optimizer): no issue
time is left in the tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simcluster.config.choices import CudaGraphImpl, Dtype
from simcluster.config.graph_scope import CudaGraphScope
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.graph_capture import captured_ops, captures_whole_layer, effective_scope
from simcluster.costs.moe_host import SyncPoint, moe_op_kernels, sync_points, weighted_moe_kernels
from simcluster.workload.fp8 import is_te_linear_gemm
from simcluster.workload.model import ChunkWork, LayerSegment
from simcluster.workload.moe_layer import MoELayerSpec
from simcluster.workload.ops import Op, Pass

GRAPH_LAUNCHES_PER_LAYER_PASS = 1  # one captured graph replayed per layer and direction
UNIT_WEIGHTS = (1.0, 1.0)  # a MoE block's launches cost what any kernel does (no profile keys)


def _op_kernels(op: Op, dtype: Dtype) -> int:
    if op.ring is not None:
        return 3 * op.ring.cp_size - 2
    if dtype.quantized and is_te_linear_gemm(op) and op.pass_ is not Pass.WEIGHT_GRAD:
        return 2
    return 1


def op_kernels(ops: tuple[Op, ...], dtype: Dtype, moe: MoELayerSpec | None = None) -> tuple[int, ...]:
    """Kernels (and collectives) the host launches for each op of `ops`, in order (module
    docstring); a MoE layer's (`moe`: its spec) MoE-block ops as `moe_host.moe_op_kernels`."""
    if moe is None:
        return tuple(_op_kernels(op, dtype) for op in ops)
    counts = moe_op_kernels(ops, moe, dtype.quantized)
    return tuple(_op_kernels(op, dtype) if n is None else n for op, n in zip(ops, counts))


def kernels_issued(ops: tuple[Op, ...], dtype: Dtype, moe: MoELayerSpec | None = None) -> int:
    """Kernels (and collectives) the host launches for `ops` (module docstring). Not cached
    here: `costs.stage_pricing` caches each chunk's host seconds by value."""
    return sum(op_kernels(ops, dtype, moe))


def _issued(
    ops: tuple[Op, ...], dtype: Dtype, moe: MoELayerSpec | None, weights: tuple[float, float]
) -> tuple[float, ...]:
    """`op_kernels`, a MoE block's launches weighted by the profile's MoE host costs
    (`moe_host.weighted_moe_kernels`); the plain counts where every weight is 1."""
    counts = op_kernels(ops, dtype, moe)
    if moe is None or weights == UNIT_WEIGHTS:
        return counts
    return weighted_moe_kernels(ops, counts, moe, dtype.quantized, weights)


def layer_op_kernels(
    ops: tuple[Op, ...], dtype: Dtype, moe: MoELayerSpec | None, graph: CudaGraphImpl,
    scope: tuple[CudaGraphScope, ...] = (), recompute: bool = False,
    weights: tuple[float, float] = UNIT_WEIGHTS,
) -> tuple[float, ...]:  # fmt: skip
    """Kernels the host issues for each op of one pass of a layer, after what CUDA graphs
    capture (`costs.graph_capture`): a captured op issues nothing, the layer's graph one
    launch on its first captured op; a whole layer captured is one launch a pass. In units
    of the profile's per-kernel host cost: a MoE block's launches × `weights` (the profile's
    `HostIssueModel.moe_host_weights`; integers where both are 1)."""
    if graph is CudaGraphImpl.NONE:
        return _issued(ops, dtype, moe, weights)
    none = tuple(0 for _ in ops)
    if graph is CudaGraphImpl.FULL_ITERATION:
        return none
    regions = effective_scope(scope, moe)
    if captures_whole_layer(regions, moe):
        return none if recompute or not ops else (GRAPH_LAUNCHES_PER_LAYER_PASS, *none[1:])
    captured = captured_ops(ops, regions, moe, recompute)
    counts: list[float] = [0 if hit else n for n, hit in zip(_issued(ops, dtype, moe, weights), captured)]
    if True in captured and not recompute:
        counts[captured.index(True)] = GRAPH_LAUNCHES_PER_LAYER_PASS
    return tuple(counts)


def layer_sync_points(
    ops: tuple[Op, ...], moe: MoELayerSpec | None, graph: CudaGraphImpl,
    scope: tuple[CudaGraphScope, ...] = (),
) -> tuple[SyncPoint, ...]:  # fmt: skip
    """`moe_host.sync_points` of a layer pass; with a per-layer graph whose scope is whole
    layers or holds moe_preprocess, Megatron-core copies the counts at the dispatch
    (`cuda_dtoh_point` "before_ep_alltoall", token_dispatcher.py `__init__`)."""
    if moe is None or graph is CudaGraphImpl.FULL_ITERATION:
        return ()
    at_dispatch = graph is not CudaGraphImpl.NONE and (not scope or CudaGraphScope.MOE_PREPROCESS in scope)
    return sync_points(ops, moe, at_dispatch)


def chunk_kernels(
    chunk: ChunkWork, dtype: Dtype, graph: CudaGraphImpl, amax: bool, scope: tuple[CudaGraphScope, ...] = (),
    weights: tuple[float, float] = UNIT_WEIGHTS,
) -> tuple[float, float]:  # fmt: skip
    """Kernels the host issues for one microbatch's forward and backward (with recompute)
    of `chunk`, after what CUDA graphs capture (a MoE block's weighted: `layer_op_kernels`)."""
    if graph is CudaGraphImpl.FULL_ITERATION:
        return 0, 0
    forward: float = 0
    backward: float = 0
    for segment in chunk.segments:
        layer, n, moe = segment.layer, segment.num_layers, segment.kind.moe
        forward += n * sum(layer_op_kernels(layer.forward, dtype, moe, graph, scope, False, weights))
        rerun = sum(layer_op_kernels(layer.recompute, dtype, moe, graph, scope, True, weights))
        back = sum(layer_op_kernels(layer.backward, dtype, moe, graph, scope, False, weights))
        backward += n * (back + rerun)
    extras = [extra for extra in (chunk.embedding, chunk.output) if extra is not None]
    per_pass = int(amax)
    return (
        forward + sum(kernels_issued(e.forward, dtype) for e in extras) + per_pass,
        backward + sum(kernels_issued(e.backward, dtype) for e in extras) + per_pass,
    )


def chunk_host_s(
    chunk: ChunkWork, hw: HardwareProfile, dtype: Dtype, graph: CudaGraphImpl, amax: bool,
    scope: tuple[CudaGraphScope, ...] = (),
) -> tuple[float, float]:  # fmt: skip
    """Host issue seconds of one microbatch's forward and backward of `chunk` (0, 0 where
    the profile does not price the host)."""
    per_op = hw.compute.host_issue_s_per_op
    if per_op is None:
        return 0.0, 0.0
    forward, backward = chunk_kernels(chunk, dtype, graph, amax, scope, hw.compute.moe_host_weights())
    return forward * per_op, backward * per_op


def host_wait_s(gpu_s: float, host_s: float) -> float:
    """Seconds the GPU waits for the host in a task: max(0, host − gpu)."""
    return max(0.0, host_s - gpu_s)


@dataclass(frozen=True, slots=True)
class HostPiece:
    """A run of one task's work: the GPU's seconds, the kernels the host issues for it, and
    whether the host then blocks until the GPU has finished it (`sync_after`)."""

    gpu_s: float
    kernels: float  # in units of the per-kernel host cost (`layer_op_kernels`)
    sync_after: bool = False


def segmented_wait_s(pieces: Sequence[HostPiece], per_op_s: float) -> float:
    """Σ over the segments between syncs of max(0, host_k − gpu_k) (module docstring)."""
    wait_s = gpu_s = host_s = 0.0
    for piece in pieces:
        gpu_s += piece.gpu_s
        host_s += piece.kernels * per_op_s
        if piece.sync_after:
            wait_s += max(0.0, host_s - gpu_s)
            gpu_s = host_s = 0.0
    return wait_s + max(0.0, host_s - gpu_s)


def pass_pieces(
    ops: tuple[Op, ...], total_gpu_s: float, price: Callable[[tuple[Op, ...]], float],
    kernels: tuple[float, ...], points: tuple[SyncPoint, ...],
) -> tuple[HostPiece, ...]:  # fmt: skip
    """One pass of a layer (`total_gpu_s` its priced seconds, `kernels` per op) cut at its
    sync `points`: each piece's GPU seconds are `price` of its ops, the last piece's the
    rest of the total (so the pieces sum to the layer's price), its kernels those issued
    before the sync."""
    pieces, gpu_from, host_from, gpu_sum = [], 0, 0, 0.0
    for point in points:
        gpu_s = price(ops[gpu_from : point.gpu_index])
        pieces.append(HostPiece(gpu_s, sum(kernels[host_from : point.host_index]), True))
        gpu_sum += gpu_s
        gpu_from, host_from = point.gpu_index, point.host_index
    pieces.append(HostPiece(max(0.0, total_gpu_s - gpu_sum), sum(kernels[host_from:])))
    return tuple(pieces)


def has_sync(segment: LayerSegment, graph: CudaGraphImpl = CudaGraphImpl.NONE) -> bool:
    """Whether a layer of `segment` blocks the host in its forward (`moe_host.sync_points`)."""
    return bool(layer_sync_points(segment.layer.forward, segment.kind.moe, graph))
