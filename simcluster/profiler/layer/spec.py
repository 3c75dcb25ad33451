"""What one real transformer layer run is: model shape, parallel layout, recompute, precision.

Field names follow Megatron (`hidden_size`, `num_attention_heads`, `ffn_hidden_size`,
`seq_length`, `micro_batch_size`, `tp`); symbols follow the paper's Table 1 (s, b, h, a, t).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from simcluster.config.choices import AttentionBackend, Dtype, PositionEmbedding
from simcluster.config.layer_rules import ContextParallelRule, context_parallel_problems
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
    needs. `dropout_prob`, when given, sets both `hidden_dropout` (after each block) and
    `attention_dropout` (on the attention probabilities); Table 2's mask terms assume > 0.
    The flash path applies no attention dropout (Megatron's Llama recipes set
    --attention-dropout 0; a flash kernel keeps no mask either way, only an RNG seed).

    `cp` > 1 makes the rank one of a context-parallel ring (docs/cost_model.md): like the
    simulator's layer config (`workload.model.layer_config`), `seq_length` is then the s/cp
    tokens this rank holds, chunks r and 2cp − 1 − r of the 2·cp chunks of the sequence;
    `full_seq_length` is s. Needs flash attention and an even `seq_length`.
    """

    dropout_prob: float | None = None
    layernorm_epsilon: float = field(default=1e-5, repr=False)
    rotary_base: float = field(default=10000.0, repr=False)
    cp: int = 1

    def __post_init__(self) -> None:
        if self.dropout_prob is not None:  # one knob for both dropout sites
            object.__setattr__(self, "hidden_dropout", self.dropout_prob)
            object.__setattr__(self, "attention_dropout", self.dropout_prob)
        # LayerConfig refuses flash outside 16 bit: the GPU kernels the simulator prices
        # are fp16/bf16 only. torch's scaled_dot_product_attention also runs fp32 (its CPU
        # flash kernel), which the fp32 exactness checks against the serial layer need, so
        # the real layer checks the rest of the rules with the backend set aside.
        backend = AttentionBackend(self.attention_backend)
        object.__setattr__(self, "attention_backend", AttentionBackend.UNFUSED)
        LayerConfig.__post_init__(self)
        object.__setattr__(self, "attention_backend", backend)
        if self.window_size is not None:
            raise ValueError(
                f"LayerSpec.window_size={self.window_size}: the torch layer has no sliding-window "
                "attention (the simulator prices it, docs/moe.md); leave it None"
            )
        if self.position_embedding is PositionEmbedding.ROPE and self.head_dim % 2:
            raise ValueError(f"LayerSpec: RoPE rotates head-dim halves; head_dim={self.head_dim} is odd")
        self._check_context_parallel()

    def _check_context_parallel(self) -> None:
        """Megatron-core's rules for --context-parallel-size (docs/scenario.md)."""
        if self.cp < 1:
            raise ValueError(f"LayerSpec.cp must be >= 1, got {self.cp}")
        # over the whole sequence; LayerConfig has checked SP's split of this rank's s/cp
        broken = context_parallel_problems(
            self.cp, self.full_seq_length, self.tp, False, self.attention_backend
        )
        if ContextParallelRule.FLASH_BACKEND in broken:
            raise ValueError(
                f"LayerSpec.cp={self.cp} needs attention_backend=flash, got "
                f"{self.attention_backend.value}: context parallelism runs the attention core as "
                "TE's flash-attention K/V ring (AttnFuncWithCPAndKVP2P)"
            )
        if ContextParallelRule.SEQUENCE_CHUNKS in broken:
            raise ValueError(
                f"LayerSpec.seq_length={self.seq_length} (tokens per cp rank, s/cp) must be even "
                f"with cp={self.cp}: the sequence is split into 2·cp chunks, two per rank"
            )

    @property
    def full_seq_length(self) -> int:
        """s: the whole sequence, over the cp ranks (seq_length · cp)."""
        return self.seq_length * self.cp

    @property
    def heads_per_group(self) -> int:
        """a / g query heads sharing one key/value head."""
        return self.num_attention_heads // self.query_groups

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
        """The simulator's description of the same layer on the same rank (raises for a
        flash layer in fp32, which the simulator does not price)."""
        return LayerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LayerConfig)})

    def serial(self) -> LayerSpec:
        """The same layer with no parallelism (t = 1, no SP, cp = 1 on the whole sequence)."""
        return replace(self, tp=1, sequence_parallel=False, cp=1, seq_length=self.full_seq_length)
