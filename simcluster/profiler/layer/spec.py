"""What one real transformer layer run is: model shape, parallel layout, recompute, precision.

Field names follow Megatron (`hidden_size`, `num_attention_heads`, `ffn_hidden_size`,
`seq_length`, `micro_batch_size`, `tp`); symbols follow the paper's Table 1 (s, b, h, a, t).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Dtype,
    Normalization,
    PositionEmbedding,
)
from simcluster.workload.layer_config import LayerConfig

TORCH_DTYPES: dict[Dtype, torch.dtype] = {
    Dtype.BF16: torch.bfloat16,
    Dtype.FP16: torch.float16,
    Dtype.FP32: torch.float32,
}


@dataclass(frozen=True)
class LayerSpec(LayerConfig):
    """One GPT layer as run on one tensor-parallel rank (paper, Figures 2-5): the simulator's
    `LayerConfig` (shape, layout, recompute, dtype, and their rules) plus what only a run
    needs. `dropout_prob` applies to the attention probabilities (unfused attention only:
    the flash path runs without attention dropout, as Megatron's Llama recipes set
    --attention-dropout 0) and to both block outputs; Table 2's mask terms assume it is > 0.

    The modern options (modern.md §3.8) carry the scenario's names: `num_query_groups` g
    (0 means a, i.e. no GQA), `activation`, `normalization`, `position_embedding`,
    `attention_backend`.
    """

    dropout_prob: float = 0.1
    layernorm_epsilon: float = field(default=1e-5, repr=False)
    num_query_groups: int = 0
    activation: Activation = Activation.GELU
    normalization: Normalization = Normalization.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    attention_backend: AttentionBackend = AttentionBackend.UNFUSED
    rotary_base: float = field(default=10000.0, repr=False)

    def __post_init__(self) -> None:
        LayerConfig.__post_init__(self)
        if not 0.0 <= self.dropout_prob < 1.0:
            raise ValueError(f"LayerSpec.dropout_prob must be in [0, 1), got {self.dropout_prob}")
        object.__setattr__(self, "num_query_groups", self.num_query_groups or self.num_attention_heads)
        for name, kind in (("activation", Activation), ("normalization", Normalization),
                           ("position_embedding", PositionEmbedding),
                           ("attention_backend", AttentionBackend)):
            object.__setattr__(self, name, kind(getattr(self, name)))
        g = self.num_query_groups
        if g < 1 or self.num_attention_heads % g:
            raise ValueError(f"LayerSpec.num_query_groups={g} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if g % self.tp:  # Megatron-core's attention.py: divide(num_query_groups, tp) asserts
            raise ValueError(f"LayerSpec.num_query_groups={g} must be divisible by tp={self.tp}")
        if self.position_embedding is PositionEmbedding.ROPE and self.head_dim % 2:
            raise ValueError(f"LayerSpec: RoPE rotates head-dim halves; head_dim={self.head_dim} is odd")

    @property
    def groups_per_rank(self) -> int:
        """g / t key/value heads on each rank."""
        return self.num_query_groups // self.tp

    @property
    def heads_per_group(self) -> int:
        """a / g query heads sharing one key/value head."""
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_width(self) -> int:
        """q + 2k output features of the serial QKV GEMM, q = a·d, k = g·d."""
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.head_dim

    @property
    def fc1_width(self) -> int:
        """fc1 output features (serial): 2f for SwiGLU (gate and up in one GEMM), else f."""
        return 2 * self.ffn_hidden_size if self.activation.gated else self.ffn_hidden_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @classmethod
    def from_layer_config(cls, cfg: LayerConfig, **overrides: Any) -> LayerSpec:
        """The real layer for the simulator's layer config; `overrides` set the fields the
        config does not carry. 2-byte elements run in bf16 (what calibration measures)."""
        fields: dict[str, Any] = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(type(cfg))}
        fields["dtype"] = Dtype.FP32 if cfg.element_bytes == 4 else Dtype.BF16
        return cls(**{**fields, **overrides})

    def config(self) -> LayerConfig:
        """The simulator's description of the same layer on the same rank."""
        return LayerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LayerConfig)})

    def serial(self) -> LayerSpec:
        """The same layer with no parallelism (t = 1, no SP)."""
        return replace(self, tp=1, sequence_parallel=False)
