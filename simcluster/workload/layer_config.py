"""The one description of a transformer layer on one tensor-parallel rank, torch-free.

Shape (Korthikanti Table 1: b, s, h, a; f the MLP width), parallel setting (t, sequence
parallelism), recompute and precision, with every fact derived from them (head dim, heads
and sequence rows per rank, tokens). The simulator's op graph (`workload.layer`) reads it;
the real torch layer's `profiler.layer.spec.LayerSpec` extends it with what only a run
needs (dropout probability, layer-norm epsilon). A new layer option is one field here.
Field names follow Megatron; fields are keyword-ordered as the torch layer takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    AttentionKernel,
    Dtype,
    Fp8Recipe,
    Normalization,
    PositionEmbedding,
    Recompute,
    SoftmaxType,
)
from simcluster.config.layer_rules import (
    attention_kernel_allowed,
    flash_precision_allowed,
    query_group_problems,
    query_groups_or_default,
)
from simcluster.config.layer_shape import ffn_hidden_size_or_default, indivisible_sizes
from simcluster.config.moe_choices import RecomputeModule

_SIZES = ("hidden_size", "num_attention_heads", "seq_length", "micro_batch_size", "ffn_hidden_size", "tp")


@dataclass(frozen=True, slots=True)
class LayerConfig:
    """One layer on one rank. `ffn_hidden_size` 0 means Megatron's default 4h;
    `num_query_groups` 0 (or None) means a key/value head per query head (no GQA);
    `kv_channels` 0 (or None) means Megatron's default head width h / a (`--kv-channels`:
    Qwen3 and gpt-oss set it apart from h / a; Megatron-core attention.py
    `query_projection_size = kv_channels * num_attention_heads`). `window_size` is this
    layer's sliding window (Megatron `--window-size (w, 0)` on a layer that
    `is_layer_window_attention` picks; None = full causal attention): the flash kernel
    computes the band only, the unfused core computes all s² scores and masks them.
    `qk_layernorm` (Megatron `--qk-layernorm`, Qwen3) adds a norm of the layer's kind over
    each query and key head between the QKV projection and RoPE (`workload.layer`).
    `add_bias_linear` (Megatron-core TransformerConfig, default True; `--disable-bias-linear`
    sets it False) gives QKV, proj, fc1 and fc2 their biases; without them the
    bias-dropout-adds have no bias gradient to reduce and GeLU runs unfused, with no bias
    gradient either (`workload.layer`).

    The modern options (docs/scenario.md) default to the paper's GPT layer: MHA, GeLU,
    LayerNorm, learned absolute positions, the unfused attention core, and Megatron's
    default dropout 0.1 (`--hidden-dropout`, `--attention-dropout`), whose one-byte masks
    Table 2 counts; a probability of 0 keeps no mask (ATen's dropout returns its input).

    Raises ValueError, naming the class and field, for a size below 1 or a size the layout
    cannot split (`config.layer_shape.indivisible_sizes`; g | a and t | g as Megatron-core's
    attention.py asserts)."""

    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    ffn_hidden_size: int = 0
    tp: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    dtype: Dtype = Dtype.BF16
    num_query_groups: int | None = 0
    activation: Activation = Activation.GELU
    normalization: Normalization = Normalization.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    attention_backend: AttentionBackend = AttentionBackend.UNFUSED
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    attention_kernel: AttentionKernel = AttentionKernel.AUTO
    recompute_modules: frozenset[RecomputeModule] | None = None

    kv_channels: int | None = 0
    window_size: int | None = None
    softmax_type: SoftmaxType = SoftmaxType.VANILLA  # Megatron --softmax-type (gpt-oss: learnable sinks)
    qk_layernorm: bool = False
    add_bias_linear: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "ffn_hidden_size", ffn_hidden_size_or_default(self.hidden_size, self.ffn_hidden_size)
        )
        groups = query_groups_or_default(self.num_attention_heads, self.num_query_groups)
        object.__setattr__(self, "num_query_groups", groups)
        object.__setattr__(self, "kv_channels", self.head_dim)
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        object.__setattr__(self, "dtype", Dtype(self.dtype))
        object.__setattr__(self, "activation", Activation(self.activation))
        object.__setattr__(self, "normalization", Normalization(self.normalization))
        object.__setattr__(self, "position_embedding", PositionEmbedding(self.position_embedding))
        object.__setattr__(self, "attention_backend", AttentionBackend(self.attention_backend))
        object.__setattr__(self, "fp8_recipe", Fp8Recipe(self.fp8_recipe))
        object.__setattr__(self, "attention_kernel", AttentionKernel(self.attention_kernel))
        object.__setattr__(
            self, "recompute_modules", _selective_modules(self.recompute, self.recompute_modules)
        )
        owner = type(self).__name__
        for name in (*_SIZES, "kv_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{owner}.{name} must be >= 1, got {getattr(self, name)}")
        if self.window_size is not None and self.window_size < 1:
            raise ValueError(f"{owner}.window_size must be >= 1 or None, got {self.window_size}")
        shape = indivisible_sizes(
            self.hidden_size,
            self.num_attention_heads,
            self.ffn_hidden_size,
            self.seq_length,
            self.tp,
            self.sequence_parallel,
        )
        for bad in shape + query_group_problems(self.num_attention_heads, self.query_groups, self.tp):
            raise ValueError(
                f"{owner}.{bad.field}={bad.value} must be divisible by {bad.divisor}={bad.divisor_value}"
            )
        if not isinstance(self.add_bias_linear, bool):
            raise ValueError(f"{owner}.add_bias_linear must be True or False, got {self.add_bias_linear!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{owner}.{name} must be in [0, 1), got {getattr(self, name)}")
        if not attention_kernel_allowed(self.attention_kernel, self.attention_backend):
            raise ValueError(
                f"{owner}.attention_kernel={self.attention_kernel.value} needs attention_backend=flash, "
                f"got {self.attention_backend.value}"
            )
        if not flash_precision_allowed(self.attention_backend, self.dtype):
            raise ValueError(
                f"{owner}.attention_backend=flash needs 16-bit activations, got dtype={self.dtype.value}"
            )

    def recomputes(self, module: RecomputeModule) -> bool:
        """`module` is checkpointed under selective recompute (Megatron-core
        `--recompute-modules`; never under none or full, where the layer is all or nothing)."""
        return self.recompute_modules is not None and module in self.recompute_modules

    @property
    def flash(self) -> bool:
        """The attention core is one fused flash-attention kernel per direction."""
        return self.attention_backend is AttentionBackend.FLASH

    @property
    def element_bytes(self) -> int:
        """Bytes per activation element."""
        return self.dtype.num_bytes

    @property
    def tokens(self) -> int:
        """s·b: rows of every GEMM input."""
        return self.seq_length * self.micro_batch_size

    @property
    def region_tokens(self) -> float:
        """Tokens a rank holds in the layer-norm / dropout regions (s·b/t with SP)."""
        return self.tokens / self.tp if self.sequence_parallel else float(self.tokens)

    @property
    def local_seq_length(self) -> int:
        """Sequence rows held outside the tensor-parallel regions: s/t with SP, else s."""
        return self.seq_length // self.tp if self.sequence_parallel else self.seq_length

    @property
    def head_dim(self) -> int:
        """d_h = `kv_channels` (h / a by default), the per-head size d of the 1/sqrt(d) scale."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def heads_per_rank(self) -> int:
        """a / t attention heads on each rank."""
        return self.num_attention_heads // self.tp

    @property
    def query_groups(self) -> int:
        """g: key/value heads (Megatron's num_query_groups); a without GQA."""
        return query_groups_or_default(self.num_attention_heads, self.num_query_groups)

    @property
    def kv_heads_per_rank(self) -> int:
        """g / t key/value heads on each rank (Megatron-core never replicates KV heads)."""
        return self.query_groups // self.tp

    @property
    def query_width(self) -> int:
        """q = a·d_h, the query projection's output width (h at d_h = h / a) before the t
        split; also linear_proj's input width (Megatron-core attention.py
        `query_projection_size`)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """k = g·d_h, the width of K (and of V) before the t split (`kv_projection_size`)."""
        return self.query_groups * self.head_dim

    @property
    def qkv_width(self) -> int:
        """q + 2k, the fused QKV GEMM's output width before the t split (3h without GQA;
        Megatron-core linear_qkv: query_projection_size + 2 * kv_projection_size)."""
        return self.query_width + 2 * self.kv_width

    @property
    def fc1_width(self) -> int:
        """fc1's output width before the t split: 2·ffn when gated (SwiGLU's gate and up in
        one GEMM, Megatron-core MLP `ffn_hidden_size * 2` if gated_linear_unit), else ffn."""
        return 2 * self.ffn_hidden_size if self.activation.gated else self.ffn_hidden_size

    @property
    def score_elements(self) -> float:
        """Elements of the attention-score tensor on a rank: a·s²·b / t."""
        return float(self.micro_batch_size * self.heads_per_rank * self.seq_length**2)


def _selective_modules(
    recompute: Recompute, modules: frozenset[RecomputeModule] | None
) -> frozenset[RecomputeModule] | None:
    """The modules selective recompute checkpoints: `modules` as given (an empty set
    checkpoints nothing), Megatron-core's default [core_attn] when None
    (transformer_config.py `__post_init__`); None without selective recompute, where
    Megatron reads no `--recompute-modules`, so `replace(cfg, recompute=...)` never carries
    a stale set."""
    if Recompute(recompute) is not Recompute.SELECTIVE:
        return None
    return frozenset({RecomputeModule.CORE_ATTN}) if modules is None else frozenset(modules)
