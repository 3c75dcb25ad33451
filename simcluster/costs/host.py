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

from simcluster.config.choices import CudaGraphImpl, Dtype
from simcluster.config.hardware import HardwareProfile
from simcluster.workload.fp8 import is_te_linear_gemm
from simcluster.workload.model import ChunkWork
from simcluster.workload.ops import Op, Pass

GRAPH_LAUNCHES_PER_LAYER_PASS = 1  # one captured graph replayed per layer and direction


def kernels_issued(ops: tuple[Op, ...], dtype: Dtype) -> int:
    """Kernels (and collectives) the host launches for `ops` (module docstring). Not cached
    here: `costs.stage_pricing` caches each chunk's host seconds by value."""
    count = 0
    for op in ops:
        if op.ring is not None:
            count += 3 * op.ring.cp_size - 2
        elif dtype.quantized and is_te_linear_gemm(op) and op.pass_ is not Pass.WEIGHT_GRAD:
            count += 2
        else:
            count += 1
    return count


def chunk_kernels(chunk: ChunkWork, dtype: Dtype, graph: CudaGraphImpl, amax: bool) -> tuple[int, int]:
    """Kernels the host issues for one microbatch's forward and backward (with recompute)
    of `chunk`, after what CUDA graphs capture."""
    if graph is CudaGraphImpl.FULL_ITERATION:
        return 0, 0
    forward = backward = 0
    for segment in chunk.segments:
        layer, n = segment.layer, segment.num_layers
        if graph is CudaGraphImpl.NONE:
            forward += n * kernels_issued(layer.forward, dtype)
            backward += n * (kernels_issued(layer.backward, dtype) + kernels_issued(layer.recompute, dtype))
        else:
            forward += n * GRAPH_LAUNCHES_PER_LAYER_PASS
            backward += n * GRAPH_LAUNCHES_PER_LAYER_PASS
    extras = [extra for extra in (chunk.embedding, chunk.output) if extra is not None]
    per_pass = int(amax)
    return (
        forward + sum(kernels_issued(e.forward, dtype) for e in extras) + per_pass,
        backward + sum(kernels_issued(e.backward, dtype) for e in extras) + per_pass,
    )


def chunk_host_s(
    chunk: ChunkWork, hw: HardwareProfile, dtype: Dtype, graph: CudaGraphImpl, amax: bool
) -> tuple[float, float]:
    """Host issue seconds of one microbatch's forward and backward of `chunk` (0, 0 where
    the profile does not price the host)."""
    per_op = hw.compute.host_issue_s_per_op
    if per_op is None:
        return 0.0, 0.0
    forward, backward = chunk_kernels(chunk, dtype, graph, amax)
    return forward * per_op, backward * per_op


def host_wait_s(gpu_s: float, host_s: float) -> float:
    """Seconds the GPU waits for the host in a task: max(0, host − gpu)."""
    return max(0.0, host_s - gpu_s)
