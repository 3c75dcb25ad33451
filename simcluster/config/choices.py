"""The closed sets of choices a scenario can name. Shared by every layer of the package."""

from __future__ import annotations

import enum


class Recompute(str, enum.Enum):
    """Activation recomputation (Korthikanti et al. §5): none, selective (re-run the
    attention core in backward), or full (store only each layer's input, re-run the layer)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class ScheduleKind(str, enum.Enum):
    """Pipeline schedules. ONE_F_ONE_B becomes interleaved 1F1B when vpp > 1."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"


class Dtype(str, enum.Enum):
    """Activation / weight precision of the run. FP8 is Transformer Engine's recipe: FP8
    GEMMs, bf16 everywhere else (activations, norms, attention), so its element is 2 bytes.
    FP4 likewise: NVFP4 GEMMs in the TE linears (Megatron-core `--fp4-format e2m1`), bf16
    everywhere else."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"
    FP4 = "fp4"

    @property
    def num_bytes(self) -> int:
        return 4 if self is Dtype.FP32 else 2

    @property
    def quantized(self) -> bool:
        """Transformer Engine quantizes the TE linears' GEMM operands (FP8 or FP4)."""
        return self in (Dtype.FP8, Dtype.FP4)


class Activation(str, enum.Enum):
    """The MLP's non-linearity (Megatron `--swiglu`, `--squared-relu`; GeLU by default).
    SwiGLU is gated: fc1 produces gate and up, 2·ffn wide (Megatron-core `transformer/mlp.py`)."""

    GELU = "gelu"
    SWIGLU = "swiglu"
    SQUARED_RELU = "squared_relu"

    @property
    def gated(self) -> bool:
        return self is Activation.SWIGLU


class Normalization(str, enum.Enum):
    """Megatron `--normalization {LayerNorm, RMSNorm}`."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class PositionEmbedding(str, enum.Enum):
    """Megatron `--position-embedding-type {learned_absolute, rope}`."""

    LEARNED = "learned"
    ROPE = "rope"


class AttentionBackend(str, enum.Enum):
    """How the attention core runs: the paper's unfused kernels (QKᵀ, scale-mask-softmax,
    dropout, ×V, with the s² score tensor) or one fused flash-attention kernel per
    direction (no s² activations; Megatron-core `--attention-backend flash|fused|auto`)."""

    UNFUSED = "unfused"
    FLASH = "flash"


class SoftmaxType(str, enum.Enum):
    """Megatron-core `TransformerConfig.softmax_type` (`--softmax-type`): vanilla, off-by-one
    (a fixed 0 logit in the denominator) or learnable (a learned logit per head: gpt-oss's
    attention sinks). Transformer Engine runs a non-vanilla softmax only in its cuDNN fused
    attention (FlashAttention takes no softmax offset), priced at the layer's head dim where
    the profile has cuDNN's head-dim rates (`costs.compute.flash_attention_flop_per_s`)."""

    VANILLA = "vanilla"
    OFF_BY_ONE = "off-by-one"
    LEARNABLE = "learnable"


class AttentionKernel(str, enum.Enum):
    """Which fused-attention kernels run `attention_backend: flash` (docs/cost_model.md): auto is
    the kernel Transformer Engine's DotProductAttention picks by default (cuDNN fused
    attention on Hopper and later, priced by the profile's `compute.flash_attention_*`);
    flash_attn_2 is Dao's FlashAttention-2, which TE runs when its cuDNN backend is turned
    off (`NVTE_FUSED_ATTN=0`) and flash-attn 2 is what is installed (priced by the profile's
    `compute.flash_attn_2`). Same saved tensors either way: only the rate differs."""

    AUTO = "auto"
    FLASH_ATTN_2 = "flash_attn_2"


class Fp8Recipe(str, enum.Enum):
    """How Transformer Engine scales FP8 tensors (Megatron `--fp8-recipe`, `fp8_utils.py::get_fp8_recipe`):
    delayed (Megatron's default: the scale from earlier steps' amax history, one amax
    all-reduce per autocast pass), tensorwise (current scaling: one scale per tensor from
    the tensor itself, so an amax pass before each cast), mxfp8 (one E8M0 scale per 32
    elements, computed in the cast; Blackwell tensor cores only) or blockwise (TE
    `Float8BlockScaling`, DeepSeek-V3-style: one FP32 scale per 1×128 tile of activations and
    gradients and per 128×128 block of weights, computed in the cast; cuBLAS block-scaled
    GEMMs on Hopper, emulated with MXFP8 on Blackwell)."""

    DELAYED = "delayed"
    TENSORWISE = "tensorwise"
    MXFP8 = "mxfp8"
    BLOCKWISE = "blockwise"


class Fp4Recipe(str, enum.Enum):
    """How Transformer Engine scales FP4 tensors (Megatron-core `--fp4-recipe`,
    `fp4_utils.py::get_fp4_recipe`): nvfp4 is TE's `NVFP4BlockScaling` (E2M1 elements, one
    E4M3 scale per 16 elements plus one FP32 scale per tensor; Blackwell tensor cores only)."""

    NVFP4 = "nvfp4"


class LayerMode(str, enum.Enum):
    """How the real torch layer runs its memory-bound regions when it is measured: `eager`,
    each torch op its own kernel(s), or `fused`, each region (norm, RoPE, gated activation,
    bias-dropout-add, softmax, dropout) one torch.compile'd kernel per direction, as
    Megatron-core and Transformer Engine run fused kernels (e.g. TE's fused RoPE and norms,
    Megatron's `bias_dropout_add_fused_train`, `bias_swiglu_impl`, `FusedScaleMaskSoftmax`)."""

    EAGER = "eager"
    FUSED = "fused"


class CudaGraphImpl(str, enum.Enum):
    """Which CUDA graphs replace the host's kernel launches (Megatron-LM `--cuda-graph-impl`,
    megatron/core/transformer/transformer_config.py `cuda_graph_impl`): none; local
    (Megatron's per-layer CudaGraphManager, the deprecated `--enable-cuda-graph`);
    transformer_engine (TE `make_graphed_callables` per layer, the deprecated
    `--external-cuda-graph`); full_iteration (one graph for the whole forward-backward
    pass, not the optimizer). Priced only where the profile prices host issue time
    (`costs.host`)."""

    NONE = "none"
    LOCAL = "local"
    TRANSFORMER_ENGINE = "transformer_engine"
    FULL_ITERATION = "full_iteration"
