"""Kernel time on one GPU: GEMMs and memory-bound kernels.

GEMM model (roofline with wave quantization):
    t = launch + max(FLOPs / (peak · e_max · e_wave), bytes / (HBM · e_mem))
where e_max is the best large-GEMM efficiency the profile cites (e.g. MAMF), and e_wave
is the best, over candidate CTA tiles (tile_m, tile_n, relative efficiency), of
    rel · tiles / (ceil(tiles / SMs) · SMs),   tiles = batch · ⌈M/tile_m⌉ · ⌈N/tile_n⌉,
so small or skinny GEMMs that leave SMs idle in their last wave run slower, and GEMMs
with low arithmetic intensity (attention's K = head_dim) fall to the memory roofline.
A calibrated profile may list measured GEMMs (`gemm_points`, `simcluster calibrate`); then
    t = launch + FLOPs / rate,   log rate = Σ w_i log(rate_i · e_wave(shape) / e_wave(shape_i))
over the few nearest measured shapes i in log(M, N, K, batch), w_i ∝ 1 / distance² (an
exact match is its own rate). A measured shape's rate already contains the memory roofline
and the device's kernels for it, so it stands as measured. A shape between or beyond the
points is held to the roofline of the measured ceilings: its rate is at most the best
measured GEMM (peak · gemm_max_efficiency), and its time at least its bytes over the
measured copy bandwidth (HBM · memory_bound_efficiency), since rates blended from
compute-bound points say nothing of a skinny GEMM's bytes. (The copy, not the measured
element-wise curves: those are the eager layer's multi-kernel sites, far below what a
GEMM's own operand traffic reaches.) A batched GEMM inside the measured range of every
dimension is interpolated: the wave model may move its blend only within the band of the
measured rates it was blended from (`gemm_placement`; the attention core at head dim 96,
between measured 64 and 128, was otherwise priced at 3/4 of every neighbour by the tile
model's n = 96 on 128-wide tiles).

Memory-bound kernels: t = launch + bytes / (HBM · e_mem), or, with measured
`elementwise_points`, the achieved bandwidth interpolated in log(bytes). A calibrated
profile may also carry one such curve per kernel kind (`elementwise_points_by_op`, keyed
by `elementwise_kind` of the op: dropout's mask draws or an fp32 softmax backward
run far from the bandwidth a plain copy of the same bytes gets); an op of a kind with a
curve uses it, any other op (and the optimizer step) the generic curve. A profile may
instead give one efficiency per kind (`memory_bound_efficiency_by_kind`: fused RMSNorm,
RoPE or SwiGLU kernels reach 35-70 % of the bandwidth a copy gets on an H100, measured in
docs/calibration/h100-2026-11-26/); t = launch + bytes / (HBM · e_kind), a backward kind
without an entry at its forward's efficiency. The optimizer step is kind `OPTIMIZER_KIND`.

Fused flash attention is compute-bound (its working set stays on chip) and is priced from
the achieved TFLOP/s the profile cites for the kernel Megatron-core runs (Transformer
Engine's cuDNN fused attention on Hopper and Blackwell):
    t = launch + FLOPs / (rate(s_k) · causal_efficiency(s_k) if causal)
with FLOPs counted as flash-attention's benchmarks count them (`ops.AttentionShape`: the
causal half for a causal mask, backward 2.5 × forward) and the rates interpolated in
log(s_k), the key length each query block walks (clamped to the measured range). The
measured shapes (batch × s = 16k tokens, 16 heads) fill the GPU, so no wave term is
applied; head dims other than 128 use the head-dim-128 rates, except under a non-vanilla
softmax (`model.softmax_type`, gpt-oss's sinks: TE's cuDNN path only), which takes cuDNN's
head-dim ratio from the profile where it has one (`_cudnn_head_dim_ratio`). A sliding-window layer
(`AttentionShape.window_size`) is priced on its band's FLOPs at the rates of w + 1 keys, the
length each query block walks (not measured with a window: docs/moe.md, "kv_channels and
sliding windows").
"""

from __future__ import annotations

import math

import numpy as np

from simcluster import units
from simcluster.config.choices import AttentionKernel, Dtype, Fp8Recipe, SoftmaxType
from simcluster.config.hardware import GemmPoint, HardwareProfile
from simcluster.workload.fp8 import fp8_bytes_per_element, quantized_bytes_per_element
from simcluster.workload.ops import AttentionShape, GemmShape, Module, Op, Pass

NEAREST_GEMM_POINTS = 4  # measured shapes blended per prediction


def wave_efficiency(shape: GemmShape, num_sms: int, tiles: list[tuple[int, int, float]]) -> float:
    """Best fraction of SM-time doing useful tiles over the candidate tile shapes."""
    best = 0.0
    for tile_m, tile_n, relative in tiles:
        num_tiles = shape.batch * math.ceil(shape.m / tile_m) * math.ceil(shape.n / tile_n)
        waves = math.ceil(num_tiles / num_sms)
        useful = (shape.batch * shape.m * shape.n) / (num_tiles * tile_m * tile_n)
        best = max(best, relative * useful * num_tiles / (waves * num_sms))
    return best


def gemm_efficiency(shape: GemmShape, hw: HardwareProfile) -> float:
    """Fraction of peak the GEMM's arithmetic reaches (before the memory roofline)."""
    if hw.compute.gemm_points:
        return measured_gemm_flop_per_s(shape, hw) / hw.peak_flop_per_s(Dtype.BF16)
    return hw.compute.gemm_max_efficiency * wave_efficiency(shape, hw.gpu.num_sms, hw.compute.gemm_tiles)


def gemm_time_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype = Dtype.BF16) -> float:
    if hw.compute.gemm_points:
        # A measured shape stands as measured; any other is held to the measured roofline.
        compute_s = shape.flops / measured_gemm_flop_per_s(shape, hw, dtype)
        if _is_measured(shape, hw.compute.gemm_points):
            return hw.kernel_launch_s + compute_s
        return hw.kernel_launch_s + max(compute_s, gemm_memory_roofline_s(shape, hw, dtype))
    moved = shape.bytes_moved(dtype.num_bytes)
    memory_s = moved / achieved_bandwidth_bytes_per_s(moved, hw)
    compute_s = shape.flops / (hw.peak_flop_per_s(dtype) * gemm_efficiency(shape, hw))
    return hw.kernel_launch_s + max(compute_s, memory_s)


def gemm_memory_roofline_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype = Dtype.BF16) -> float:
    """A GEMM's fewest bytes over the device's copy bandwidth (HBM · memory_bound_efficiency):
    no GEMM outside the measured points is priced faster than this."""
    copy_bytes_per_s = hw.memory_bandwidth_bytes_per_s * hw.compute.memory_bound_efficiency
    return shape.bytes_moved(dtype.num_bytes) / copy_bytes_per_s


OPTIMIZER_KIND = "optimizer"  # the optimizer step's kernels (Adam, grad norm, copies, zeroing)
KERNEL_KINDS = {
    Module.EMBEDDING: "lookup",
    Module.EMBEDDING_DROPOUT: "dropout",
    Module.ATTENTION_DROPOUT: "dropout",
    Module.QK_NORM: "layernorm",  # a LayerNorm over the heads (an RMSNorm names "rmsnorm")
}
"""Modules whose element-wise kernel is not named by the module's value: both dropouts are
one kernel kind, the embedding's forward is its row lookup."""
ONE_WAY_KINDS = frozenset(
    {Module.RESIDUAL_GRAD_ADD, Module.FP8_AMAX, Module.FP8_SCALE, Module.STANDIN_ALL_GATHER,
     Module.STANDIN_REDUCE_SCATTER, Module.EXPERT_FP8_PADDING, Module.MOE_INPUT_GRAD_ADD}
)  # fmt: skip
"""Kernels that are the same kernel in whichever pass they run (no ".bwd" kind)."""


def elementwise_kind(op: Op) -> str:
    """The kernel kind of an element-wise op, the key of a profile's per-kind curves and
    efficiencies: its module's kernel ("layernorm" for every norm, "softmax", "swiglu",
    "dropout" for both dropouts, `KERNEL_KINDS`), with ".bwd" in the input-gradient pass
    ("softmax.bwd", "layernorm.bwd") unless the kernel is one-way (`ONE_WAY_KINDS`:
    "residual_grad_add", "amax", "fp8_scale", the calibration stand-ins' copies); the
    embedding's weight-gradient scatter-add is "wgrad". These are the kinds calibration
    records carry under the op's name (`calibration.records.recorded_op_kind`). An op whose
    kernel is not its module's names it (`Op.kernel`: an RMSNorm's "rmsnorm", with ".bwd" in
    its backward; a profile without that kind prices it as its module's, `KIND_FALLBACK`)."""
    kind = op.kernel or KERNEL_KINDS.get(op.module, op.module.value)
    if op.module in ONE_WAY_KINDS:
        return kind
    if op.pass_ is Pass.WEIGHT_GRAD:
        return "wgrad"
    return f"{kind}.bwd" if op.pass_ is Pass.INPUT_GRAD else kind


KIND_FALLBACK = {"rmsnorm": "layernorm", "bias_add": Module.RESIDUAL_GRAD_ADD.value}
"""A kind a profile may not price -> the kind it is priced as then (its backward likewise,
but a one-way kind has no backward): an RMSNorm as the layer norm every profile before the
RMSNorm curve priced it as (the shipped profiles' "layernorm" efficiency is the fused
RMSNorm's, measured); the dropout-0 bias add (`workload.layer.BIAS_ADD_KERNEL`) as the
residual add, the measured kernel of the same traffic (two activations read, one written;
the bias is h elements), and its backward (the bias gradient's one read) at the same rate."""
ONE_WAY_KIND_NAMES = frozenset(module.value for module in ONE_WAY_KINDS)


def priced_kind(hw: HardwareProfile, kind: str | None) -> str | None:
    """`kind`, or its `KIND_FALLBACK` (".bwd" kept, but not on a one-way kind) where the
    profile has neither a curve nor an efficiency (own or its forward's) for it."""
    if kind is None:
        return None
    forward = kind.removesuffix(".bwd")
    fallback = KIND_FALLBACK.get(forward)
    if fallback is None or kind in hw.compute.elementwise_points_by_op or kind_efficiency(hw, kind):
        return kind
    return fallback if fallback in ONE_WAY_KIND_NAMES else fallback + kind.removeprefix(forward)


def kind_efficiency(hw: HardwareProfile, kind: str | None) -> float | None:
    """The profile's `memory_bound_efficiency_by_kind` entry for `kind`, a backward kind
    without its own entry taking its forward's ("swiglu.bwd" -> "swiglu"); None when the
    profile lists neither."""
    by_kind = hw.compute.memory_bound_efficiency_by_kind
    if kind is None or not by_kind:
        return None
    return by_kind.get(kind, by_kind.get(kind.removesuffix(".bwd")))


def achieved_bandwidth_bytes_per_s(bytes_moved: float, hw: HardwareProfile, kind: str | None = None) -> float:
    """Bytes per second a memory-bound kernel of `kind` moving `bytes_moved` reaches, the
    most specific figure first: the kind's measured curve, the kind's efficiency
    (`kind_efficiency`) × HBM, the generic measured curve, HBM · e_mem; a kind the profile
    does not price is priced as its `KIND_FALLBACK` (`priced_kind`)."""
    kind = priced_kind(hw, kind)
    kind_points = hw.compute.elementwise_points_by_op.get(kind) if kind is not None else None
    efficiency = None if kind_points else kind_efficiency(hw, kind)
    if efficiency is not None:
        return hw.memory_bandwidth_bytes_per_s * efficiency
    points = kind_points or hw.compute.elementwise_points
    if points:
        sizes = np.log([p[0] for p in points])
        rates = [p[1] for p in points]
        gb_per_s = float(np.interp(math.log(max(bytes_moved, 1.0)), sizes, rates))
        return gb_per_s * 1e9
    return hw.memory_bandwidth_bytes_per_s * hw.compute.memory_bound_efficiency


def elementwise_time_s(bytes_moved: float, hw: HardwareProfile, kind: str | None = None) -> float:
    """launch + bytes / achieved bandwidth; `kind` (`elementwise_kind`) picks the profile's
    per-kind curve where it has one."""
    if bytes_moved <= 0:
        return 0.0
    return hw.kernel_launch_s + bytes_moved / achieved_bandwidth_bytes_per_s(bytes_moved, hw, kind)


FP8_GEMM_OUTPUT_BYTES = 2  # Transformer Engine's FP8 GEMMs write bf16 outputs


def fp8_gemm_time_s(shape: GemmShape, hw: HardwareProfile, recipe: Fp8Recipe = Fp8Recipe.DELAYED) -> float:
    """A Transformer Engine FP8 GEMM: the roofline of `gemm_time_s` at the FP8 peak times
    `fp8_gemm_max_efficiency` (the profile's FP8 MAMF) and the same wave quantization, with
    1-byte operands and a bf16 output (fp32 when accumulating into main_grad). A profile
    with measured FP8 GEMMs (`fp8_gemm_points`) takes the rate at the shape from them
    (`interpolated_flop_per_s`, capped at the ceiling) instead: the ceiling is the best rate
    of a shape sweep (MAMF), which the 4k-sized GEMMs of a training step do not reach. A
    calibrated profile's bf16 `gemm_points` are otherwise scaled by the ratio of the FP8 to
    the BF16 ceiling (a declared assumption: no FP8 GEMM is measured there yet).

    Under MXFP8 (`recipe`) the block-scaled kernel runs at `compute.mxfp8_gemm_rate_ratio`
    of that rate (absent: the same rate) and reads one E8M0 scale per 32 operand elements;
    under block scaling at `compute.fp8_block_gemm_rate_ratio` (cuBLAS's block-scaled kernel
    on Hopper, MXFP8 on Blackwell), reading one FP32 scale per 128 elements."""
    if recipe is Fp8Recipe.MXFP8:
        relative = hw.compute.mxfp8_gemm_rate_ratio or 1.0
    elif recipe is Fp8Recipe.BLOCKWISE:
        relative = hw.compute.fp8_block_gemm_rate_ratio or 1.0
    else:
        relative = 1.0
    return _quantized_gemm_time_s(shape, hw, fp8_bytes_per_element(recipe), relative, cap_flop_per_s=None)


def fp4_gemm_time_s(shape: GemmShape, hw: HardwareProfile) -> float:
    """A Transformer Engine NVFP4 GEMM (`training.dtype: fp4`): the per-tensor FP8 GEMM's rate
    at the same shape (`fp8_gemm_time_s`) times `compute.nvfp4_gemm_rate_ratio`, the kernel-only
    NVFP4 / FP8 ratio measured on the device (absent: the ratio of the two peaks), at most the
    FP4 peak times the FP8 ceiling; operands of 1/2 byte plus one E4M3 scale per 16 elements,
    a bf16 output. Where the FP8 rate comes from measured points, so does this one."""
    peak_fp4, peak_fp8 = hw.peak_fp4_flop_per_s, hw.peak_fp8_flop_per_s
    ceiling = hw.compute.fp8_gemm_max_efficiency
    if peak_fp4 is None or peak_fp8 is None or ceiling is None:
        raise ValueError(f"hardware {hw.name!r} has no FP4 tensor-core peak (gpu.peak_fp4_tflop_per_s)")
    relative = hw.compute.nvfp4_gemm_rate_ratio or peak_fp4 / peak_fp8
    operand_bytes = quantized_bytes_per_element(Dtype.FP4, Fp8Recipe.DELAYED)
    return _quantized_gemm_time_s(shape, hw, operand_bytes, relative, cap_flop_per_s=peak_fp4 * ceiling)


def quantized_gemm_time_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype, recipe: Fp8Recipe) -> float:
    """A TE linear's GEMM under `dtype` fp8 (`fp8_gemm_time_s` with `recipe`) or fp4
    (`fp4_gemm_time_s`)."""
    if dtype is Dtype.FP4:
        return fp4_gemm_time_s(shape, hw)
    return fp8_gemm_time_s(shape, hw, recipe)


def quantized_gemm_floor_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype, recipe: Fp8Recipe) -> float:
    """The fewest seconds a quantized GEMM (`quantized_gemm_time_s`) may be priced at by a
    model built on top of it: launch + max(FLOPs at its ceiling, its bytes over the copy
    bandwidth). The ceiling is the FP8 peak · `fp8_gemm_max_efficiency` times the recipe's
    rate ratio (MXFP8, block scaling) or, for NVFP4, the FP4 peak · that ceiling; the bytes
    are the quantized operands (with their scales) and the bf16 output (fp32 accumulating
    into main_grad), as `_quantized_gemm_time_s` counts them."""
    peak, ceiling = hw.peak_fp8_flop_per_s, hw.compute.fp8_gemm_max_efficiency
    if peak is None or ceiling is None:
        raise ValueError(f"hardware {hw.name!r} has no FP8 tensor-core peak and FP8 GEMM ceiling")
    if dtype is Dtype.FP4:
        if hw.peak_fp4_flop_per_s is None:
            raise ValueError(f"hardware {hw.name!r} has no FP4 tensor-core peak (gpu.peak_fp4_tflop_per_s)")
        best = hw.peak_fp4_flop_per_s * ceiling
    elif recipe is Fp8Recipe.MXFP8:
        best = peak * ceiling * (hw.compute.mxfp8_gemm_rate_ratio or 1.0)
    elif recipe is Fp8Recipe.BLOCKWISE:
        best = peak * ceiling * (hw.compute.fp8_block_gemm_rate_ratio or 1.0)
    else:
        best = peak * ceiling
    output_bytes = 8 if shape.accumulate_fp32 else FP8_GEMM_OUTPUT_BYTES
    operands = quantized_bytes_per_element(dtype, recipe) * (shape.m * shape.k + shape.k * shape.n)
    moved = float(shape.batch * (operands + output_bytes * shape.m * shape.n))
    copy_bytes_per_s = hw.memory_bandwidth_bytes_per_s * hw.compute.memory_bound_efficiency
    return hw.kernel_launch_s + max(shape.flops / best, moved / copy_bytes_per_s)


def _quantized_gemm_time_s(
    shape: GemmShape, hw: HardwareProfile, operand_bytes: float, relative: float, cap_flop_per_s: float | None
) -> float:
    """The FP8 GEMM roofline of `fp8_gemm_time_s` with its rate times `relative` (at most
    `cap_flop_per_s` where given) and `operand_bytes` per operand element."""
    peak, ceiling = hw.peak_fp8_flop_per_s, hw.compute.fp8_gemm_max_efficiency
    if peak is None or ceiling is None:
        raise ValueError(f"hardware {hw.name!r} has no FP8 tensor-core peak and FP8 GEMM ceiling")
    output_bytes = 8 if shape.accumulate_fp32 else FP8_GEMM_OUTPUT_BYTES
    operands = operand_bytes * (shape.m * shape.k + shape.k * shape.n)
    moved = float(shape.batch * (operands + output_bytes * shape.m * shape.n))
    memory_s = moved / achieved_bandwidth_bytes_per_s(moved, hw)
    cap = math.inf if cap_flop_per_s is None else cap_flop_per_s
    if hw.compute.fp8_gemm_points:
        # Measured FP8 GEMMs: the rate at this shape, interpolated between them as
        # `measured_gemm_flop_per_s` does, capped at the ceiling; the memory roofline stays
        # for shapes far from the (compute-bound) points.
        rate = interpolated_flop_per_s(shape, hw.compute.fp8_gemm_points, hw, cap_flop_per_s=peak * ceiling)
        return hw.kernel_launch_s + max(shape.flops / min(rate * relative, cap), memory_s)
    if hw.compute.gemm_points:
        bf16_ceiling = hw.peak_flop_per_s(Dtype.BF16) * hw.compute.gemm_max_efficiency
        rate = measured_gemm_flop_per_s(shape, hw) * peak * ceiling / bf16_ceiling
        return hw.kernel_launch_s + shape.flops / min(rate * relative, cap)
    wave = wave_efficiency(shape, hw.gpu.num_sms, hw.compute.gemm_tiles)
    compute_s = shape.flops / min(peak * ceiling * wave * relative, cap)
    return hw.kernel_launch_s + max(compute_s, memory_s)


def flash_attention_flop_per_s(shape: AttentionShape, hw: HardwareProfile) -> float:
    """Achieved FLOP/s of a fused flash-attention call (module docstring), from the tables of
    the kernels `shape.kernel` names: the profile's `flash_attention_*` for auto (its default
    kernels), `flash_attn_2` for FlashAttention-2. Raises ValueError when the profile has no
    such rates."""
    compute = hw.compute
    if shape.kernel is AttentionKernel.FLASH_ATTN_2:
        if compute.flash_attn_2 is None:
            raise ValueError(
                f"hardware profile {hw.name!r} has no compute.flash_attn_2 rates: it cannot price "
                "attention_kernel: flash_attn_2 (use attention_kernel: auto, or add measured rates "
                "with sources)"
            )
        rates = compute.flash_attn_2
        fwd, bwd, causal = rates.fwd_tflop_per_s, rates.bwd_tflop_per_s, rates.causal_efficiency
    elif (
        compute.flash_attention_fwd_tflop_per_s is None
        or compute.flash_attention_bwd_tflop_per_s is None
        or compute.flash_attention_causal_efficiency is None
    ):
        raise ValueError(
            f"hardware profile {hw.name!r} has no compute.flash_attention_* rates: it cannot price "
            "attention_backend: flash (use attention_backend: unfused, or add measured rates with sources)"
        )
    else:
        fwd = compute.flash_attention_fwd_tflop_per_s
        bwd = compute.flash_attention_bwd_tflop_per_s
        causal = compute.flash_attention_causal_efficiency
    # a sliding window walks w + 1 keys per query block, not s (`AttentionShape.keys_walked`)
    keys = shape.keys_walked
    tflop_per_s = _interp_log(keys, bwd if shape.backward else fwd)
    if shape.causal:
        tflop_per_s *= _interp_log(keys, causal)
    tflop_per_s *= _cudnn_head_dim_ratio(shape, hw)
    return units.tflop_per_s_to_flop_per_s(tflop_per_s)


def _cudnn_head_dim_ratio(shape: AttentionShape, hw: HardwareProfile) -> float:
    """cuDNN's rate at `shape.head_dim` over its head-dim-128 rate, for a non-vanilla softmax
    (`model.softmax_type`: TE runs it in cuDNN's fused attention only) where the profile has the
    head dim's row (`compute.flash_attention_head_dim_ratio`, interpolated in log keys like the
    rates); 1 otherwise: the vanilla softmax keeps the head-dim-128 rates at every head dim."""
    table = hw.compute.flash_attention_head_dim_ratio
    if shape.softmax_type is SoftmaxType.VANILLA or table is None or shape.head_dim not in table:
        return 1.0
    rows = table[shape.head_dim]
    column = 3 if shape.backward else (2 if shape.causal else 1)
    return _interp_log(shape.keys_walked, [(row[0], row[column]) for row in rows])


def attention_time_s(shape: AttentionShape, hw: HardwareProfile) -> float:
    """launch + FLOPs / achieved rate of one fused flash-attention kernel."""
    return hw.kernel_launch_s + shape.flops / flash_attention_flop_per_s(shape, hw)


def _interp_log(x: float, points: list[tuple[float, float]]) -> float:
    """Piecewise-linear in log x through (x_i, y_i), held flat outside the points."""
    return float(np.interp(math.log(x), np.log([p[0] for p in points]), [p[1] for p in points]))


_RATES: dict[int, tuple[HardwareProfile, dict[tuple[GemmShape, Dtype], float]]] = {}
_RATES_MAX_PROFILES = 16


def measured_gemm_flop_per_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype = Dtype.BF16) -> float:
    """`_measured_gemm_flop_per_s`, remembered per profile object (a pure function of the
    shape, dtype and the frozen profile; the entry holds the profile, so its id cannot be
    reused while cached): a plan prices the same GEMM shapes in thousands of layouts, and
    the interpolation over the measured points was 40 % of a MoE plan's bound time."""
    entry = _RATES.get(id(hw))
    if entry is None or entry[0] is not hw:
        if len(_RATES) >= _RATES_MAX_PROFILES:
            _RATES.clear()
        entry = _RATES[id(hw)] = (hw, {})
    rates = entry[1]
    rate = rates.get((shape, dtype))
    if rate is None:
        rate = rates[(shape, dtype)] = _measured_gemm_flop_per_s(shape, hw, dtype)
    return rate


def _measured_gemm_flop_per_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype) -> float:
    """Rate interpolated from `gemm_points` (module docstring), at most the best measured
    GEMM (peak · gemm_max_efficiency). The points are 16-bit measurements; an fp32 GEMM is
    scaled by the profile's fp32 / bf16 peak ratio."""
    peak = units.tflop_per_s_to_flop_per_s(hw.gpu.peak_bf16_tflop_per_s)
    measured = _is_measured(shape, hw.compute.gemm_points)
    ceiling = peak if measured else peak * hw.compute.gemm_max_efficiency
    rate = interpolated_flop_per_s(shape, hw.compute.gemm_points, hw, cap_flop_per_s=ceiling)
    return rate * (hw.peak_flop_per_s(dtype) / hw.peak_flop_per_s(Dtype.BF16))


def interpolated_flop_per_s(
    shape: GemmShape, points: list[GemmPoint], hw: HardwareProfile, cap_flop_per_s: float
) -> float:
    """The rate at `shape` from measured `points`, as `measured_gemm_flop_per_s` blends them
    (the nearest few in log(M, N, K, batch), weights 1/distance², each point's rate moved to
    this shape's wave efficiency), at most `cap_flop_per_s`."""
    tiles = hw.compute.gemm_tiles
    target = np.log([shape.m, shape.n, shape.k, shape.batch])
    coords = np.log([[p.m, p.n, p.k, p.batch] for p in points])
    distance2 = np.sum((coords - target) ** 2, axis=1)
    nearest = np.argsort(distance2, kind="stable")[:NEAREST_GEMM_POINTS]
    exact = nearest[distance2[nearest] < 1e-12]
    chosen = exact if exact.size else nearest
    weights = np.ones(len(chosen)) if exact.size else 1.0 / distance2[chosen]
    wave = wave_efficiency(shape, hw.gpu.num_sms, tiles)
    log_rates = [
        math.log(points[i].tflop_per_s * wave / wave_efficiency(_shape_of(points[i]), hw.gpu.num_sms, tiles))
        for i in chosen
    ]
    rate = units.tflop_per_s_to_flop_per_s(math.exp(float(np.average(log_rates, weights=weights))))
    if gemm_placement(shape, points) == "interpolated":
        # A batched GEMM between measured ones (the attention core's head dim 96 between 64 and
        # 128): the wave model may move the blend within the band of the measured rates it was
        # blended from, never outside it.
        band = [units.tflop_per_s_to_flop_per_s(points[i].tflop_per_s) for i in chosen]
        rate = min(max(rate, min(band)), max(band))
    return min(rate, cap_flop_per_s)


def is_inside_measured_range(shape: GemmShape, points: list[GemmPoint]) -> bool:
    """`shape` lies within [min, max] of the measured points in each of M, N and K, and its
    batch is at least the smallest measured one: beyond the largest, more batches only fill
    the GPU further, at the plateau the largest measured ones reach (the committed H100 QKᵀ at
    s 2048, head dim 128: 322 TFLOP/s at batch 32 to 311 at 192,
    docs/calibration/h100-2026-11-26-script/microbench_static_rows.json)."""
    inside = all(
        min(getattr(p, dim) for p in points) <= getattr(shape, dim) <= max(getattr(p, dim) for p in points)
        for dim in ("m", "n", "k")
    )
    return inside and shape.batch >= min(p.batch for p in points)


def gemm_placement(shape: GemmShape, points: list[GemmPoint]) -> str:
    """How `measured_gemm_flop_per_s` places `shape` among measured `points`:
    "measured" (an exact shape: its own rate); "interpolated" (a batched GEMM inside the
    measured range, `is_inside_measured_range`, e.g. the attention core at head dim 96 between
    measured 64 and 128: the blend of its nearest points, held within their rates);
    "wave_model" (any other: the blend moved by the wave model, at most the best GEMM, its
    time at least its bytes over the copy bandwidth). Single GEMMs keep the wave model inside
    the range too: the shipped profiles' points are single GEMMs priced so, and their results
    stay as they were."""
    if _is_measured(shape, points):
        return "measured"
    if shape.batch > 1 and is_inside_measured_range(shape, points):
        return "interpolated"
    return "wave_model"


def _is_measured(shape: GemmShape, points: list[GemmPoint]) -> bool:
    size = (shape.m, shape.n, shape.k, shape.batch)
    return any((p.m, p.n, p.k, p.batch) == size for p in points)


def _shape_of(point: GemmPoint) -> GemmShape:
    return GemmShape(point.m, point.n, point.k, point.batch)
