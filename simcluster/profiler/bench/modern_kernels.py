"""The modern layers' kernels as Megatron-core / Transformer Engine run them, each timed alone:
RMSNorm, RoPE and SwiGLU (forward and backward, the layer's compiled regions,
`layer.regions`), GQA flash attention (SDPA with `enable_gqa`, causal, forward and
forward + backward), FP8 GEMMs (`torch._scaled_mm`, per-tensor scales, e4m3 inputs, bf16
output) beside the same GEMMs in bf16, and AdamW (`fused=True` where torch has it).

Shapes: Llama 3 8B at t 1 and Llama 3 70B at t 8 (8192 tokens, head dim 128; GQA 32/8 and
8/1 heads per rank), the shard shapes the H100 measurements in
docs/calibration/h100-2026-11-26/ were taken at. `quick`: tiny shapes of the same kinds.

Bytes of a memory-bound kernel are its ideal HBM traffic: each input read once, each
output written once (RMSNorm forward: x and w in, y and the fp32 rstd out; RoPE: x in, x
out, the cos/sin tables once). AdamW moves 28 bytes per fp32 parameter (param, m, v read
and written, grad read). A kernel torch cannot run here (FP8 on a CPU or a pre-Hopper GPU,
a GQA shape without a kernel) is skipped with its reason, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from simcluster.calibration.records import ModernKernelRecord
from simcluster.config.choices import LayerMode
from simcluster.profiler.bench.kernels import BuildContext
from simcluster.profiler.bench.timing import Call, Timer, median_and_spread
from simcluster.profiler.layer.ops import rope_tables

ELEMENT = 2  # bf16 bytes


@dataclass(frozen=True)
class ModernShape:
    """One rank's shard of a modern layer: tokens, hidden, heads / kv heads per rank, head dim,
    FFN width per rank (before SwiGLU's doubling)."""

    name: str
    tokens: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_per_rank: int


FULL_SHAPES = (
    ModernShape("llama3-8b t1", 8192, 4096, 32, 8, 128, 14336),
    ModernShape("llama3-70b t8", 8192, 8192, 8, 1, 128, 3584),
)
QUICK_SHAPES = (ModernShape("tiny", 64, 64, 4, 2, 16, 96),)


@dataclass(frozen=True)
class ModernBench:
    name: str
    kind: str
    dims: tuple[int, ...]
    flops: float
    bytes_moved: float
    build: Callable[[BuildContext], Call]
    detail: str


def plan_modern(quick: bool) -> list[ModernBench]:
    """Every modern kernel over the shapes, in a fixed order."""
    benches: list[ModernBench] = []
    for shape in QUICK_SHAPES if quick else FULL_SHAPES:
        benches += _memory_bound(shape) + _attention(shape) + _gemms(shape)
    benches.append(_adamw(2**14 if quick else 2**28))
    return benches


def _memory_bound(sh: ModernShape) -> list[ModernBench]:
    t, h, d = sh.tokens, sh.hidden_size, sh.head_dim
    f2 = 2 * sh.ffn_per_rank
    rms_fwd = ELEMENT * (2 * t * h + h) + 4 * t
    rope_bytes = ELEMENT * (2 * t * sh.heads * d + 2 * t * d)
    return [
        ModernBench(
            "rms_norm.forward",
            "memory_bound",
            (t, h),
            0.0,
            rms_fwd,
            _rms(t, h, False),
            f"{sh.name}: x [tokens, hidden]",
        ),
        ModernBench(
            "rms_norm.backward",
            "memory_bound",
            (t, h),
            0.0,
            rms_fwd + ELEMENT * t * h,
            _rms(t, h, True),
            f"{sh.name}: grad, x, w, rstd in; grad_x, grad_w out",
        ),
        ModernBench(
            "rope.forward",
            "memory_bound",
            (t, sh.heads, d),
            0.0,
            rope_bytes,
            _rope(t, sh.heads, d, False),
            f"{sh.name}: q [tokens, 1, heads, head_dim]",
        ),
        ModernBench(
            "rope.backward",
            "memory_bound",
            (t, sh.heads, d),
            0.0,
            rope_bytes,
            _rope(t, sh.heads, d, True),
            f"{sh.name}: grad of q",
        ),
        ModernBench(
            "swiglu.forward",
            "memory_bound",
            (t, f2),
            0.0,
            ELEMENT * 1.5 * t * f2,
            _swiglu(t, f2, False),
            f"{sh.name}: fc1 output [tokens, 2·ffn/t]",
        ),
        ModernBench(
            "swiglu.backward",
            "memory_bound",
            (t, f2),
            0.0,
            ELEMENT * 2.5 * t * f2,
            _swiglu(t, f2, True),
            f"{sh.name}: x and grad in, grad_x out",
        ),
    ]


def _rms(t: int, h: int, backward: bool) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        r = ctx.regions
        x, w = ctx.randn(t, h), 1 + ctx.randn(h, scale=0.02)
        if not backward:
            return lambda: r.rms_norm_fwd(x, w, 1e-5)
        _, rstd = r.rms_norm_fwd(x, w, 1e-5)
        grad = ctx.randn(t, h)
        return lambda: r.rms_norm_bwd(grad, x, w, rstd)

    return build


def _rope(t: int, heads: int, d: int, backward: bool) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        r = ctx.regions
        cos, sin = rope_tables(torch.arange(t), d, 10000.0, ctx.dtype)
        cos, sin = cos.to(ctx.device), sin.to(ctx.device)
        x = ctx.randn(t, 1, heads, d)
        if backward:
            return lambda: r.rope_bwd(x, cos, sin)
        return lambda: r.rope_fwd(x, cos, sin)

    return build


def _swiglu(t: int, f2: int, backward: bool) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        r = ctx.regions
        x = ctx.randn(t, f2)
        if not backward:
            return lambda: r.swiglu_fwd(x)
        grad = ctx.randn(t, f2 // 2)
        return lambda: r.swiglu_bwd(grad, x)

    return build


def _attention(sh: ModernShape) -> list[ModernBench]:
    """GQA flash: [1, heads, s, d] queries over [1, kv_heads, s, d] keys/values, causal;
    FLOPs as `AttentionRecord` counts them (2·b·h·s²·d forward causal, 2.5× backward)."""
    s, d = sh.tokens, sh.head_dim
    fwd = 2.0 * sh.heads * s * s * d
    dims = (1, sh.heads, sh.kv_heads, s, d)
    return [
        ModernBench(
            "gqa_flash.forward",
            "attention",
            dims,
            fwd,
            0.0,
            _sdpa(dims, False),
            f"{sh.name}: b, heads, kv heads, s, head dim; causal",
        ),
        ModernBench(
            "gqa_flash.forward_backward",
            "attention",
            dims,
            3.5 * fwd,
            0.0,
            _sdpa(dims, True),
            f"{sh.name}: forward + backward",
        ),
    ]


def _sdpa(dims: tuple[int, ...], backward: bool) -> Callable[[BuildContext], Call]:
    b, heads, kv, s, d = dims

    def build(ctx: BuildContext) -> Call:
        q = ctx.randn(b, s, heads, d).transpose(1, 2).requires_grad_(backward)
        k = ctx.randn(b, s, kv, d).transpose(1, 2).requires_grad_(backward)
        v = ctx.randn(b, s, kv, d).transpose(1, 2).requires_grad_(backward)

        def call() -> object:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)
            if backward:
                return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            return out

        return call

    return build


def _gemms(sh: ModernShape) -> list[ModernBench]:
    """fc1 and fc2 of the shard, forward: Y[T, n] = X[T, k] Wᵀ, in FP8 and bf16."""
    t, h = sh.tokens, sh.hidden_size
    out: list[ModernBench] = []
    for label, n, k in (("fc1", 2 * sh.ffn_per_rank, h), ("fc2", h, sh.ffn_per_rank)):
        flop = 2.0 * t * n * k
        for kind, build in (("gemm_fp8", _fp8_gemm(t, n, k)), ("gemm_bf16", _bf16_gemm(t, n, k))):
            out.append(
                ModernBench(f"{label}.{kind}", kind, (t, n, k), flop, 0.0, build, f"{sh.name}: m, n, k")
            )
    return out


def _fp8_gemm(t: int, n: int, k: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        a = ctx.randn(t, k).to(torch.float8_e4m3fn)
        w = ctx.randn(n, k).to(torch.float8_e4m3fn)
        one = torch.ones((), device=ctx.device, dtype=torch.float32)
        call = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        call()  # raises where this device has no FP8 GEMM: skipped by the caller
        return call

    return build


def _bf16_gemm(t: int, n: int, k: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        a, w = ctx.randn(t, k), ctx.randn(n, k, scale=0.02)
        return lambda: a @ w.t()

    return build


def _adamw(num_params: int) -> ModernBench:
    return ModernBench(
        "adamw.step",
        "optimizer",
        (num_params,),
        0.0,
        28.0 * num_params,
        _adamw_build(num_params),
        "fp32 params in 8 tensors; fused=True where torch has it, else foreach",
    )


def _adamw_build(num_params: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        params = [torch.zeros(num_params // 8, device=ctx.device, requires_grad=True) for _ in range(8)]
        for p in params:
            p.grad = torch.randn(p.shape, device=ctx.device, generator=ctx.generator)
        try:
            opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
            opt.step()
        except (RuntimeError, TypeError):
            opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        return opt.step

    return build


def time_modern(
    timer: Timer,
    ctx: BuildContext,
    benches: list[ModernBench],
    read_sensors: Callable[[], tuple[float | None, float | None]],
    before_each: Callable[[], None] = lambda: None,
    on_step: Callable[[str], None] = lambda label: None,
) -> tuple[list[ModernKernelRecord], list[str]]:
    """(records, skipped 'name dims: reason') of every modern bench, the memory-bound ones in
    `ctx.mode`; FP8, attention and AdamW are the library's fused kernels in either mode."""
    records, skipped = [], []
    for bench in benches:
        before_each()
        try:
            calls = [bench.build(ctx)]
            seconds, spread = median_and_spread(timer.times_s(calls))
        except (RuntimeError, TypeError, NotImplementedError) as error:
            skipped.append(f"{bench.name} {bench.dims}: {str(error).splitlines()[0][:160]}")
            on_step(f"{bench.name} skipped")
            continue
        clock, power = read_sensors()
        mode = ctx.mode.value if bench.kind == "memory_bound" else LayerMode.FUSED.value
        records.append(
            ModernKernelRecord(
                bench.name,
                bench.kind,
                bench.dims,
                bench.flops,
                bench.bytes_moved,
                seconds,
                spread,
                mode,
                bench.detail,
                clock,
                power,
            )
        )
        on_step(f"{bench.name} {bench.dims}")
    return records, skipped
