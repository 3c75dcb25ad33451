"""Host issue time: the CPU seconds to launch a task's kernels, and the GPU's wait for them.

PyTorch issues kernels asynchronously, so the GPU is not slowed by the host as long as the
host issues faster than the GPU runs. When it does not (small layers, high TP, many small
kernels), the GPU waits between kernels. A CUDA stream runs its kernels in issue order, so
within a task (one chunk's forward or backward of one microbatch) the model follows the ops
in order (`inorder_wait_s`):

    host_i = host_{i-1} + kernels_i · host_issue_s_per_op,
    gpu_i  = max(gpu_{i-1}, host_i) + seconds_i,
    task   = gpu_n,   host-bound wait = gpu_n − Σ seconds_i,

with `host_issue_s_per_op` the profile's `compute.host_issue_us_per_op` (absent: the host
is not priced and the GPU never waits). The host's lead builds while long kernels run and
is spent on runs of short ones; where a run of host-heavy ops comes before the GPU-heavy
ones that would hide it, the GPU waits even when the task's host total is below its GPU
total, so the wait is at least max(0, host − gpu) of the whole task and can be more. The
host's lead does not carry from one task to the next (each pipeline task starts after a p2p
receive, which Megatron-core's batched p2p ends with `torch.cuda.synchronize`,
p2p_communication.py `_communicate`). Each op's seconds are its own price, scaled so the
pass sums to the layer's price (`pass_pieces`).

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
so a profile without the keys counts integers, as always. At such a sync (Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553, token_dispatcher.py
`MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`,
`MoEAllGatherTokenDispatcher.dispatch_postprocess`, fused_a2a.py `FusedDispatch.forward`)
the host, having issued the ops up to the sync, waits until the GPU has finished the op
where the copy was recorded (it can be earlier: `moe_host.SyncPoint`), and goes on from
there with no lead.

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
from simcluster.workload.model import ChunkWork
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


@dataclass(frozen=True, slots=True)
class HostPiece:
    """One op of a task, in issue order: the GPU's seconds for it, the kernels the host
    issues for it, and whether the host then blocks until the GPU has finished the op
    `copy_lag` pieces back (`sync_after`; 0: this one), where a device-to-host copy was
    recorded (`moe_host.SyncPoint`)."""

    gpu_s: float
    kernels: float  # in units of the per-kernel host cost (`layer_op_kernels`)
    sync_after: bool = False
    copy_lag: int = 0


def inorder_wait_s(pieces: Sequence[HostPiece], per_op_s: float) -> float:
    """Seconds the GPU waits for the host over one task's `pieces` (module docstring): the
    GPU starts a piece once it has finished the one before and the host has issued it; the
    host issues its kernels one after another from the task's start and, after a sync, from
    the moment the GPU reaches the copy."""
    host_t = gpu_t = busy_s = 0.0
    finish: list[float] = []
    for piece in pieces:
        host_t += piece.kernels * per_op_s
        gpu_t = max(gpu_t, host_t) + piece.gpu_s
        busy_s += piece.gpu_s
        finish.append(gpu_t)
        if piece.sync_after:
            copy = len(finish) - 1 - piece.copy_lag
            host_t = max(host_t, finish[copy] if copy >= 0 else 0.0)
    return max(0.0, gpu_t - busy_s)


def pass_pieces(
    ops: tuple[Op, ...], total_gpu_s: float, price: Callable[[tuple[Op, ...]], float],
    kernels: tuple[float, ...], points: tuple[SyncPoint, ...], own_s: tuple[float, ...],
) -> tuple[HostPiece, ...]:  # fmt: skip
    """One pass of a layer (`total_gpu_s` its priced seconds, `kernels` per op), one piece
    per op, marked at its sync `points`. Each op's GPU seconds are its own seconds `own_s`
    (`costs.chunk.op_seconds`), scaled so that the ops before each copy point sum to `price`
    of that run and the pass to `total_gpu_s` (which holds what pricing the ops together adds
    or hides: TP overlap, the EP overlap's phases)."""
    if not ops:
        return ()
    gpu = list(own_s)
    start, done = 0, 0.0
    bounds = [point.gpu_index for point in points] + [len(ops)]
    for k, end in enumerate(bounds):
        target = price(ops[start:end]) if k < len(points) else max(0.0, total_gpu_s - done)
        raw = sum(own_s[start:end])
        for i in range(start, end):
            gpu[i] = own_s[i] * target / raw if raw > 0 else target / (end - start)
        done, start = done + target, end
    lags = {point.host_index - 1: point.host_index - point.gpu_index for point in points}
    return tuple(HostPiece(gpu[i], kernels[i], i in lags, lags.get(i, 0)) for i in range(len(ops)))
