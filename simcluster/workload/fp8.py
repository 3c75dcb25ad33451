"""What FP8 training (Transformer Engine, `training.dtype: fp8`) changes in the workload,
hardware-free: which ops are the TE linears, the bytes of their FP8 copies (saved inputs,
cached weights) and, per scaling recipe (`training.fp8_recipe`), the quantizations' extra
work. FP4 (`training.dtype: fp4`, TE's NVFP4BlockScaling recipe) quantizes the same GEMMs
and is counted here the same way, with its own element and scale bytes.

Megatron-core's dense TE layer (`models/gpt/gpt_layer_specs.py`) runs four TE linears per layer: QKV
(`TELayerNormColumnParallelLinear`), proj (`TERowParallelLinear`), fc1 and fc2. Their fprop,
dgrad and wgrad GEMMs run in FP8; the attention core and the LM head (Megatron's own
`ColumnParallelLinear`) stay BF16.
"""

from __future__ import annotations

from dataclasses import replace

from simcluster.config.choices import Dtype, Fp8Recipe, Recompute
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import (
    CollectiveKind,
    CommGroup,
    Module,
    Op,
    OpKind,
    Pass,
    collective,
    elementwise,
)

TE_LINEARS = frozenset(
    {
        Module.QKV, Module.PROJ, Module.FC1, Module.FC2,
        Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC1, Module.SHARED_FC2,
        Module.MLA_DOWN, Module.MLA_UP, Module.MLA_Q_PROJ,
    }
)  # fmt: skip
"""The modules of the layer's TE linears (`workload.layer`), and of a MoE layer's
(`workload.moe_layer`): the routed experts' grouped fc1 / fc2 (TE `GroupedLinear` in
Megatron-core's `TEGroupedMLP`, FP8 under the same autocast; one `Linear` per expert
without grouped GEMM, `SequentialMLP`) and the shared experts' TE column- / row-parallel
linears (`SharedExpertMLP`). The router's gating GEMM is not one: Megatron-core runs it as
a plain matmul in the router's dtype (router.py `TopKRouter.gating`,
`router_gating_linear`), BF16 here. An MLA layer's linears are TE linears too
(`get_gpt_layer_with_transformer_engine_submodules` in models/gpt/gpt_layer_specs.py,
Megatron-LM @d98e8a64, without `mla_down_proj_fusion`): the q / kv down projections TE
`Linear`s reading the input norm's output, the up projections `LayerNormColumnParallelLinear`s
with the latent norms fused (`qk_layernorm`), the q projection without a q latent a
`ColumnParallelLinear`; the MLA core stays BF16 like the dense one."""


def is_te_linear_gemm(op: Op) -> bool:
    """A GEMM (fprop, dgrad or wgrad) of one of the layer's TE linears."""
    return op.kind is OpKind.GEMM and op.module in TE_LINEARS


def te_linear_weight_params(forward: tuple[Op, ...], modules: frozenset[Module] = TE_LINEARS) -> float:
    """Weight elements of the TE linears (of `modules`) on one rank: batch·k·n of each
    fprop GEMM X[m,k]·W[k,n] (`batch` local experts of a grouped expert GEMM, 1 otherwise)."""
    shapes = [
        op.gemm
        for op in forward
        if op.gemm is not None and is_te_linear_gemm(op) and op.module in modules and op.pass_ is Pass.FORWARD
    ]
    return float(sum(shape.batch * shape.k * shape.n for shape in shapes))


EXPERT_LINEARS = frozenset({Module.EXPERT_FC1, Module.EXPERT_FC2})
"""The routed experts' TE linears: parameters sharded over ep·etp, gathered over the
expert-data-parallel group (`workload.model`)."""


FP8_SAVED_BYTES_PER_ELEMENT = 1
MXFP8_BLOCK_ELEMENTS = 32
MXFP8_SCALE_BYTES = 1
"""MXFP8 (`training.fp8_recipe: mxfp8`) gives every 32 consecutive elements along the GEMM's
reduction axis one E8M0 scale byte (TE `MXFP8Quantizer`, OCP MX spec)."""


BLOCKWISE_TILE_ELEMENTS = 128
BLOCKWISE_WEIGHT_BLOCK_ELEMENTS = 128 * 128
BLOCKWISE_SCALE_BYTES = 4
"""FP8 block scaling (`training.fp8_recipe: blockwise`, TE `Float8BlockScaling`): one FP32 scale
per 1×128 tile of an activation or gradient (`x_block_scaling_dim` / `grad_block_scaling_dim` 1)
and per 128×128 block of a weight (`w_block_scaling_dim` 2), transformer_engine/common/recipe/
__init__.py @d0067d0 ("The scaling factors are float32 containers")."""
NVFP4_ELEMENT_BYTES = 0.5
NVFP4_BLOCK_ELEMENTS = 16
NVFP4_SCALE_BYTES = 1
"""NVFP4 (`training.dtype: fp4`, TE `NVFP4BlockScaling`): E2M1 elements, two to a byte, and
one E4M3 scale per 16 consecutive elements along the GEMM's reduction axis, plus one FP32
scale per tensor (recipe/__init__.py @d0067d0). Weights are quantized in 16×16 blocks, but TE
stores their scales in the same 1×16 layout the GEMM reads (`NVFP4Quantizer.get_scale_shape`,
pytorch/tensor/nvfp4_tensor.py), so every copy carries 1/16 byte of scale per element."""


def fp8_bytes_per_element(recipe: Fp8Recipe) -> float:
    """Bytes of one element of an FP8 tensor copy, its scales included: 1, 1 + 1/32 under
    MXFP8, 1 + 4/128 under block scaling (a per-tensor scale is a single float). Saved
    activations, the casts' outputs (`costs.chunk.fp8_cast_bytes_per_element`) and the FP8
    weight copies TE caches (cast once per step, on the first microbatch, unless
    --fp8-param-gather makes the FP8 copy the parameter) are such copies; a block-scaled
    weight's copies carry one scale per 128×128 block (`quantized_weight_bytes_per_element`)."""
    if recipe is Fp8Recipe.MXFP8:
        return FP8_SAVED_BYTES_PER_ELEMENT + MXFP8_SCALE_BYTES / MXFP8_BLOCK_ELEMENTS
    if recipe is Fp8Recipe.BLOCKWISE:
        return FP8_SAVED_BYTES_PER_ELEMENT + BLOCKWISE_SCALE_BYTES / BLOCKWISE_TILE_ELEMENTS
    return float(FP8_SAVED_BYTES_PER_ELEMENT)


def quantized_bytes_per_element(dtype: Dtype, recipe: Fp8Recipe) -> float:
    """Bytes of one element of a quantized activation or gradient copy under `dtype` (FP8 with
    `recipe`, or NVFP4: 1/2 + 1/16)."""
    if dtype is Dtype.FP4:
        return NVFP4_ELEMENT_BYTES + NVFP4_SCALE_BYTES / NVFP4_BLOCK_ELEMENTS
    return fp8_bytes_per_element(recipe)


def quantized_weight_bytes_per_element(dtype: Dtype, recipe: Fp8Recipe) -> float:
    """Bytes of one element of a quantized weight copy: as `quantized_bytes_per_element`, but a
    block-scaled FP8 weight has one FP32 scale per 128×128 block."""
    if dtype is Dtype.FP8 and recipe is Fp8Recipe.BLOCKWISE:
        return FP8_SAVED_BYTES_PER_ELEMENT + BLOCKWISE_SCALE_BYTES / BLOCKWISE_WEIGHT_BLOCK_ELEMENTS
    return quantized_bytes_per_element(dtype, recipe)


def fp8_copies(recipe: Fp8Recipe, hardware_copies: int, dtype: Dtype = Dtype.FP8) -> int:
    """FP8 copies of a tensor whose GEMMs read it both row-wise and column-wise (a weight, or
    an activation that also feeds a wgrad): the hardware's `fp8_weight_copies` (2 where FP8
    GEMMs take only the TN layout, so TE keeps a transposed copy; TE `Linear` sets the
    quantizer's usage to rowwise and columnwise while training), but always 2 under MXFP8,
    block scaling and NVFP4, whose scales run along each GEMM's reduction axis ("the quantized
    tensor and its transpose are not numerically equivalent ... both versions are computed from
    the high precision input", recipe/__init__.py)."""
    if dtype is Dtype.FP4 or recipe in (Fp8Recipe.MXFP8, Fp8Recipe.BLOCKWISE):
        return 2
    return hardware_copies


def fp8_saved_forward(forward: tuple[Op, ...], cfg: LayerConfig) -> tuple[Op, ...]:
    """The forward ops with FP8's saved bytes (docs/memory.md, "FP8"): a TE
    Linear saves only its quantized input, 1 byte per element (TE `linear.py`), and a
    LayerNormLinear its FP8 ln_out, the local sequence shard under SP
    (`layernorm_linear.py`). So QKV's and fc1's ln_out and fc2's input drop to 1 byte, and
    proj keeps an FP8 copy of its input O, on top of the bf16 O the flash-attention kernel
    saves (or in place of its own bf16 copy with the unfused core and under the core_attn
    checkpoint). The norm inputs, the activation's input and the attention tensors stay
    bf16. Full recompute keeps only the (bf16) layer input: unchanged. Under NVFP4 the saved
    copy is the column-wise one the wgrad reads, 1/2 + 1/16 byte per element. MLA
    (`workload.mla_layer`): the up projections' ln_out drops to the quantized byte as QKV's
    does; the down projections (and the q projection without a q latent) each keep a
    quantized copy of the input norm's output."""
    if cfg.recompute is Recompute.FULL:
        return forward
    e, fp8 = cfg.element_bytes, quantized_bytes_per_element(cfg.dtype, cfg.fp8_recipe)
    out = []
    for index, op in enumerate(forward):
        fprop = op.gemm if op.pass_ is Pass.FORWARD else None
        if fprop is not None and op.module in (Module.QKV, Module.FC1, Module.FC2, Module.MLA_UP):
            op = replace(op, saved_bytes=op.saved_bytes * fp8 / e)
        elif fprop is not None and op.module in (Module.MLA_DOWN, Module.MLA_Q_PROJ):
            # each TE linear keeps its own quantized copy of the norm's output (the local
            # shard under SP), where the 16-bit GEMMs shared one bf16 tensor
            op = replace(op, saved_bytes=fp8 * quantized_input_elements(forward, index, cfg.tp))
        elif fprop is not None and op.module is Module.PROJ:
            input_elements = fprop.batch * fprop.m * fprop.k
            op = replace(op, saved_bytes=fp8 * float(input_elements))
        out.append(op)
    return tuple(out)


def moe_fp8_saved_forward(forward: tuple[Op, ...], cfg: LayerConfig) -> tuple[Op, ...]:
    """A MoE MLP's forward ops (`workload.moe_layer.moe_mlp_ops`) with FP8's saved bytes,
    as `fp8_saved_forward` does for the dense MLP: the experts' grouped fc1 and fc2 keep
    their quantized inputs (TE `GroupedLinear` saves the FP8 inputs it quantized, 1 byte an
    element), the shared fc2 its quantized input, and the shared fc1 an FP8 copy of the block
    input (its local shard under SP: TE re-gathers it for wgrad) beside the BF16 block input
    the router's BF16 GEMM keeps. The activations' inputs, the probs and the router's
    tensors stay BF16. Full recompute keeps only the layer input: unchanged."""
    if cfg.recompute is Recompute.FULL:
        return forward
    e, fp8 = cfg.element_bytes, quantized_bytes_per_element(cfg.dtype, cfg.fp8_recipe)
    out = []
    for index, op in enumerate(forward):
        fprop = op.gemm if op.pass_ is Pass.FORWARD else None
        if fprop is not None and op.module in (Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC2):
            op = replace(op, saved_bytes=op.saved_bytes * fp8 / e)
        elif fprop is not None and op.module is Module.SHARED_FC1:
            elements = quantized_input_elements(forward, index, cfg.tp)
            op = replace(op, saved_bytes=op.saved_bytes + fp8 * elements)
        out.append(op)
    return tuple(out)


AMAX_READ_BYTES_PER_ELEMENT = 2
"""Current scaling's amax pass reads the bf16 tensor once before the cast."""
AMAX_BYTES = 4
"""One fp32 amax (and scale) per quantized tensor."""
NORM_FED_LINEARS = frozenset({Module.QKV, Module.FC1, Module.MLA_UP})
"""The LayerNormLinears: the norm kernel before their fprop computes the amax of its output."""


def gathered_input(ops: tuple[Op, ...], index: int) -> bool:
    """The op at `index` (a GEMM) reads the output of the blocking all-gather just before it
    (so TE quantized the local shard: `current_scaling_ops`, `costs.chunk.fp8_cast_s`)."""
    before = ops[index - 1] if index else None
    return (
        before is not None
        and before.collective is CollectiveKind.ALL_GATHER
        and not before.overlaps_next
        and before.group is CommGroup.TP  # a MoE dispatcher's gathers carry BF16 tokens
    )


def quantized_input_elements(ops: tuple[Op, ...], index: int, tp: int) -> float:
    """Elements of the A operand [m, k] the TE GEMM at `index` quantizes: its local shard
    (1/tp) where it reads a gathered input (`gathered_input`: TE quantizes, then gathers)."""
    shape = ops[index].gemm
    assert shape is not None
    return float(shape.batch * shape.m * shape.k) / (tp if gathered_input(ops, index) else 1)


def amax_pass_ops(ops: tuple[Op, ...], cfg: LayerConfig) -> tuple[Op, ...]:
    """The per-tensor amax work of the recipes that scale from the tensor itself: FP8 current
    scaling (`current_scaling_ops`) and NVFP4, whose second-level FP32 scale is the tensor's
    amax (`NVFP4Quantizer::quantize_impl`, pytorch/csrc/quantizer.cpp @d0067d0: an amax kernel,
    `nvte_hadamard_transform_amax` with the random Hadamard transform, then the amax
    all-reduce where the shard is gathered, then the fused RHT + cast). Under NVFP4 every TE
    fprop input has its own amax pass, the norm-fed ones included: with RHT the norm does not
    compute it (`Impl::UNFUSED` in pytorch/csrc/extensions/normalization.cpp when `with_rht`
    and `with_post_rht_amax`). Block-scaled recipes (mxfp8, blockwise) take their scales
    inside the cast: nothing added."""
    if cfg.dtype is Dtype.FP4:
        return current_scaling_ops(ops, cfg, norm_fused_amax=False)
    if cfg.fp8_recipe is Fp8Recipe.TENSORWISE:
        return current_scaling_ops(ops, cfg)
    return ops


def current_scaling_ops(
    ops: tuple[Op, ...], cfg: LayerConfig, norm_fused_amax: bool = True
) -> tuple[Op, ...]:
    """`training.fp8_recipe: tensorwise` (TE `Float8CurrentScaling`): each fprop input and
    dgrad grad-output is quantized with a scale from its own amax
    (`Float8CurrentScalingQuantizer::quantize_impl`, pytorch/csrc/quantizer.cpp): an amax
    kernel reads the bf16 tensor, the scale is computed by a second (tiny) kernel, then the
    cast runs (priced with the GEMM, `costs.chunk.fp8_cast_s`). Two exceptions from TE's
    code: a LayerNormLinear's norm kernel computes the amax of its output
    (`FUSED_NORM_AMAX_FP8` in pytorch/csrc/extensions/normalization.cpp), so the QKV and fc1
    fprops have no amax pass; and where the quantized shard is all-gathered (sequence
    parallelism: column-parallel inputs, row-parallel grad-outputs) the amax is first
    all-reduced (MAX) over the tensor-parallel group (`with_amax_reduction`,
    `_customize_quantizers_float8_current_scaling` in module/linear.py and
    layernorm_linear.py). These ops go before the collective the GEMM reads or overlaps, as TE
    quantizes first (`grad_output_preprocess`) and then gathers. wgrad GEMMs
    reuse the two quantized operands. Delayed scaling's once-per-pass amax all-reduce
    (`costs.chunk.fp8_amax_reduction_s`) is not run under this recipe. `norm_fused_amax`
    False (NVFP4, `amax_pass_ops`) gives the QKV and fc1 fprops their own amax pass too."""
    out: list[Op] = []
    for index, op in enumerate(ops):
        if is_te_linear_gemm(op) and op.gemm is not None and op.pass_ is not Pass.WEIGHT_GRAD:
            gathered = gathered_input(ops, index)
            elements = quantized_input_elements(ops, index, cfg.tp)
            quantize: list[Op] = []
            norm_fed = norm_fused_amax and op.pass_ is Pass.FORWARD and op.module in NORM_FED_LINEARS
            amax, scale, pass_ = Module.FP8_AMAX, Module.FP8_SCALE, op.pass_
            if not norm_fed:
                amax_bytes = AMAX_READ_BYTES_PER_ELEMENT * elements
                quantize.append(elementwise(f"{op.name}.amax", amax_bytes, module=amax, pass_=pass_))
            if gathered and cfg.tp > 1:
                reduce = collective(
                    f"{op.name}.amax_allreduce",
                    CollectiveKind.ALL_REDUCE,
                    AMAX_BYTES,
                    module=amax,
                    pass_=pass_,
                )
                quantize.append(reduce)
            quantize.append(elementwise(f"{op.name}.fp8_scale", 2 * AMAX_BYTES, module=scale, pass_=pass_))
            # before the collective the GEMM reads (gathered input) or runs beside (bulk overlap)
            before = out[-1] if out else None
            moved = [out.pop()] if gathered or (before is not None and before.overlaps_next) else []
            out += quantize + moved
        out.append(op)
    return tuple(out)


# --- TE GroupedLinear's per-expert quantization (MoE experts with --moe-grouped-gemm) --------
CURRENT_SCALING_SPLIT_KERNELS = 4
"""Kernels `Float8CurrentScalingQuantizer::quantize_impl` launches per tensor
(pytorch/csrc/quantizer.cpp, TransformerEngine @71bbefbf153418f943640df0f7373625dc93fa46):
`nvte_compute_amax_with_config` (a one-thread `zero_amax_kernel`, then the amax reduction:
common/recipe/current_scaling.cu `launch_amax_kernel`), `nvte_compute_scale_from_amax` (one
thread) and `nvte_quantize_v2` (the cast, with its transpose where one is written)."""
BLOCK_SCALED_SPLIT_KERNELS = 1
"""`MXFP8Quantizer::quantize` and `Float8BlockQuantizer::quantize`: one `nvte_quantize_v2` per
tensor, scales computed inside the cast."""
CURRENT_SCALING_PRICED_KERNELS = 3
"""What `current_scaling_ops` and the GEMM's cast price for one quantized GEMM input: the amax
op, the scale op and the cast (`costs.chunk.fp8_cast_s`), one launch each."""


def grouped_split_quantize_kernels(dtype: Dtype, recipe: Fp8Recipe, local_experts: int) -> int:
    """Kernels TE's `GroupedLinear` launches to quantize one grouped GEMM input (its fprop
    input or its dgrad grad-output) over `local_experts` splits: `tex.split_quantize`
    (pytorch/csrc/extensions/cast.cpp @71bbefbf) quantizes each split with its own quantizer
    (`multi_tensor_quantize_impl`'s loop: `quantizer_cpp_list[i]->quantize`) for current
    scaling, MXFP8 and block scaling; delayed scaling takes the fused
    `nvte_multi_cast_transpose` (one launch for every split) and NVFP4 its grouped kernels
    (`split_quantize_nvfp4_impl`): one launch counted for either, as today. Called for the
    fprop and dgrad GEMMs (`_GroupedLinear.forward` / `backward`); wgrad reuses both."""
    if dtype is Dtype.FP4 or recipe is Fp8Recipe.DELAYED:
        return 1
    if recipe is Fp8Recipe.TENSORWISE:
        return CURRENT_SCALING_SPLIT_KERNELS * local_experts
    return BLOCK_SCALED_SPLIT_KERNELS * local_experts


def grouped_split_quantize_extra_kernels(op: Op, dtype: Dtype, recipe: Fp8Recipe) -> int:
    """The launches of `grouped_split_quantize_kernels` the op graph does not price already
    for the grouped expert GEMM `op` (0 for any other op, a wgrad, a 16-bit run or a single
    local expert's GEMM): the GEMM's cast (one launch) and, under current scaling, its amax
    and scale ops (`CURRENT_SCALING_PRICED_KERNELS`)."""
    shape = op.gemm
    if (
        shape is None
        or not dtype.quantized
        or op.module not in EXPERT_LINEARS
        or op.pass_ is Pass.WEIGHT_GRAD
        or shape.batch <= 1
    ):
        return 0
    priced = CURRENT_SCALING_PRICED_KERNELS if recipe is Fp8Recipe.TENSORWISE and dtype is Dtype.FP8 else 1
    return max(0, grouped_split_quantize_kernels(dtype, recipe, shape.batch) - priced)
