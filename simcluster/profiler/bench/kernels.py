"""The real layer's kernels, one benchmark per op of the simulator's op graph.

Each op of `simcluster.workload.layer.layer_ops` (forward and backward) names a benchmark
that runs what `ParallelTransformerLayer` (profiler/layer/transformer.py) runs for that op, with the
same torch calls, layouts and strided views:

GEMMs (recorded with the op graph's GemmShape m, n, k, batch):
- `linear_bias` QKV / fc1 forward: addmm(bias, x [T, k], Wᵀ)         (column-parallel)
- `linear`      proj / fc2 forward: x [T, k] @ Wᵀ                     (row-parallel)
- `linear_dgrad`  grad [T, n_out] @ W [n_out, n_in]                   (`_Linear.backward`)
- `linear_wgrad`  gradᵀ [n_out, T] @ x [T, n_in]
- `bmm_*`  QKᵀ, ×V and their four backward products on the layer's strided views of the
  QKV output [s, b·a/t, 3d] (autograd's bmm formulas: dA = dC·Bᵀ, dB = Aᵀ·dC).

Memory-bound sites (recorded with the op graph's bytes for the op and the op's name, whose
kind keys the profile's per-kind curves): see `sites`; and the copies `ShardStandInComm`
makes for an all-gather (`standin_all_gather`, a concatenation of t shards) or a
reduce-scatter (`standin_reduce_scatter`, a copy of the first 1/t).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from simcluster.calibration.shapes import standin_copy_bytes, standin_op_name
from simcluster.config.choices import LayerMode
from simcluster.profiler.bench.sites import site_benchmark
from simcluster.profiler.bench.timing import Call, random_tensor
from simcluster.profiler.layer.regions import RegionMath, region_math
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import CollectiveKind, GradOf, Module, Op, OpKind, Pass


@dataclass(frozen=True)
class BuildContext:
    device: torch.device
    dtype: torch.dtype
    generator: torch.Generator
    dropout_prob: float = 0.1
    mode: LayerMode = LayerMode.EAGER  # how the memory-bound sites run (`layer.regions`)

    @property
    def regions(self) -> RegionMath:
        return region_math(self.mode)

    def randn(self, *shape: int, scale: float = 1.0) -> Tensor:
        return random_tensor(shape, self.dtype, self.device, self.generator, scale)


@dataclass(frozen=True)
class Benchmark:
    """One kernel to time: its identity, its op-graph cost terms, and a builder.

    `build(ctx)` allocates one fresh input set and returns the closure that runs the
    kernel on it; the timer rotates over several such closures.
    """

    name: str
    dims: tuple[int, ...]
    gemm: tuple[int, int, int, int] | None  # op graph (m, n, k, batch)
    bytes_moved: float  # op graph bytes (element-wise); HBM bytes of inputs+output (GEMM)
    build: Callable[[BuildContext], Call]
    op: str = ""  # element-wise: the op graph's op it times (the first one planned); GEMM: ""

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return self.name, self.dims


def benchmark_for(op: Op, cfg: LayerConfig) -> Benchmark | None:
    """The benchmark that times `op` of `cfg`'s layer (None: the stand-in does nothing)."""
    if op.kind is OpKind.GEMM:
        assert op.gemm is not None
        return _gemm_benchmark(op, cfg)
    if op.kind is OpKind.COLLECTIVE:
        return _standin_benchmark(op, cfg)
    name, dims, build = site_benchmark(op, cfg)
    return Benchmark(name, dims, None, op.bytes_moved, build, op.name)


# ---------------------------------------------------------------- GEMMs


def _gemm_benchmark(op: Op, cfg: LayerConfig) -> Benchmark:
    g = op.gemm
    assert g is not None
    shape = (g.m, g.n, g.k, g.batch)
    e = cfg.element_bytes
    io_bytes = float(e * g.batch * (g.m * g.k + g.k * g.n + g.m * g.n))
    name = _gemm_kind(op)
    if name.startswith("bmm"):
        dims = (cfg.seq_length, cfg.micro_batch_size * cfg.heads_per_rank, cfg.head_dim)
        return Benchmark(name, dims, shape, io_bytes, _BMM[name](*dims))
    if name == "linear_wgrad":  # C[n_in, n_out] = Xᵀ dY; torch computes dYᵀ X = [n_out, n_in]
        dims = (g.k, g.n, g.m)  # (tokens, n_out, n_in)
    elif name == "linear_dgrad":  # dX[T, n_in] = dY[T, n_out] W[n_out, n_in]
        dims = (g.m, g.k, g.n)
    else:  # Y[T, n] = X[T, k] Wᵀ
        dims = (g.m, g.n, g.k)
    return Benchmark(name, dims, shape, io_bytes, _LINEAR[name](*dims))


LINEAR_FPROPS = {
    Module.QKV: "linear_bias",
    Module.FC1: "linear_bias",
    Module.PROJ: "linear",
    Module.FC2: "linear",
}
"""The layer's linears' forward GEMMs (QKV and fc1 add their bias in the GEMM)."""
BMMS = {
    (Module.QK, None): "bmm_qk",
    (Module.AV, None): "bmm_av",
    (Module.AV, GradOf.PROBS): "bmm_av_dgrad_probs",
    (Module.AV, GradOf.V): "bmm_av_dgrad_v",
    (Module.QK, GradOf.Q): "bmm_qk_dgrad_q",
    (Module.QK, GradOf.K): "bmm_qk_dgrad_k",
}
"""The unfused attention core's batched GEMMs, each way."""


def _gemm_kind(op: Op) -> str:
    if op.pass_ is Pass.FORWARD and op.module in LINEAR_FPROPS:
        return LINEAR_FPROPS[op.module]
    if (op.module, op.grad_of) in BMMS:
        return BMMS[op.module, op.grad_of]
    if op.pass_ is Pass.INPUT_GRAD and op.module not in (Module.QK, Module.AV):
        return "linear_dgrad"
    if op.pass_ is Pass.WEIGHT_GRAD:
        return "linear_wgrad"
    raise KeyError(f"no benchmark for GEMM op {op.name!r}: add one to profiler/bench/kernels.py")


def _linear_bias(tokens: int, n: int, k: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        x, w, b = ctx.randn(tokens, k), ctx.randn(n, k, scale=0.02), ctx.randn(n, scale=0.02)
        return lambda: torch.addmm(b, x, w.t())

    return build


def _linear(tokens: int, n: int, k: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        x, w = ctx.randn(tokens, k), ctx.randn(n, k, scale=0.02)
        return lambda: torch.matmul(x, w.t())

    return build


def _linear_dgrad(tokens: int, n_out: int, n_in: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        grad, w = ctx.randn(tokens, n_out), ctx.randn(n_out, n_in, scale=0.02)
        return lambda: grad @ w

    return build


def _linear_wgrad(tokens: int, n_out: int, n_in: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        grad, x = ctx.randn(tokens, n_out), ctx.randn(tokens, n_in)
        return lambda: grad.t() @ x

    return build


_LINEAR = {
    "linear_bias": _linear_bias,
    "linear": _linear,
    "linear_dgrad": _linear_dgrad,
    "linear_wgrad": _linear_wgrad,
}


def _qkv_views(ctx: BuildContext, s: int, batch: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """q [B, s, d], k [B, d, s], v [B, s, d] as strided views of one [s, B, 3d] QKV output."""
    qkv = ctx.randn(s, batch, 3 * d)
    q, k, v = qkv.split(d, dim=-1)
    return q.transpose(0, 1), k.permute(1, 2, 0), v.transpose(0, 1)


def _bmm(kind: str) -> Callable[[int, int, int], Callable[[BuildContext], Call]]:
    def dims(s: int, batch: int, d: int) -> Callable[[BuildContext], Call]:
        def build(ctx: BuildContext) -> Call:
            q, k, v = _qkv_views(ctx, s, batch, d)
            probs = ctx.randn(batch, s, s, scale=1.0 / s)  # [B, s, s]
            grad_ctx = ctx.randn(s, batch, d).transpose(0, 1)  # view of the [s, b, h/t] grad
            grad_scores = ctx.randn(batch, s, s)
            products = {
                "bmm_qk": lambda: torch.bmm(q, k),
                "bmm_av": lambda: torch.bmm(probs, v),
                "bmm_av_dgrad_probs": lambda: torch.bmm(grad_ctx, v.transpose(1, 2)),
                "bmm_av_dgrad_v": lambda: torch.bmm(probs.transpose(1, 2), grad_ctx),
                "bmm_qk_dgrad_q": lambda: torch.bmm(grad_scores, k.transpose(1, 2)),
                "bmm_qk_dgrad_k": lambda: torch.bmm(q.transpose(1, 2), grad_scores),
            }
            return products[kind]

        return build

    return dims


_BMM = {
    kind: _bmm(kind)
    for kind in (
        "bmm_qk",
        "bmm_av",
        "bmm_av_dgrad_probs",
        "bmm_av_dgrad_v",
        "bmm_qk_dgrad_q",
        "bmm_qk_dgrad_k",
    )
}


def _standin_benchmark(op: Op, cfg: LayerConfig) -> Benchmark | None:
    """`ShardStandInComm`'s copy for a collective (all-reduce: none, t = 1: none)."""
    copy_bytes = standin_copy_bytes(op, cfg.tp)
    if copy_bytes == 0:
        return None
    t, rows = cfg.tp, cfg.tokens
    width = cfg.hidden_size
    standin = standin_op_name(op)
    if op.collective is CollectiveKind.ALL_GATHER:

        def build(ctx: BuildContext) -> Call:
            shard = ctx.randn(rows // t, width)
            return lambda: torch.cat([shard] * t, dim=0)

        return Benchmark("standin_all_gather", (rows, width, t), None, copy_bytes, build, standin)

    def build_scatter(ctx: BuildContext) -> Call:
        full = ctx.randn(rows, width)
        return lambda: full[: rows // t].clone()

    return Benchmark("standin_reduce_scatter", (rows, width, t), None, copy_bytes, build_scatter, standin)
