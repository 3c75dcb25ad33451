"""What one real transformer layer run is: model shape, parallel layout, recompute, precision.

Field names follow Megatron (`hidden_size`, `num_attention_heads`, `ffn_hidden_size`,
`seq_length`, `micro_batch_size`, `tp`); symbols follow the paper's Table 1 (s, b, h, a, t).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from simcluster.config.choices import Dtype, Recompute
from simcluster.workload.layer import LayerConfig

TORCH_DTYPES: dict[Dtype, torch.dtype] = {
    Dtype.BF16: torch.bfloat16,
    Dtype.FP16: torch.float16,
    Dtype.FP32: torch.float32,
}


@dataclass(frozen=True)
class LayerSpec:
    """One GPT layer as run on one tensor-parallel rank (paper, Figures 2-5).

    `ffn_hidden_size` defaults to 4h. `dropout_prob` applies to the attention probabilities
    and to both block outputs; Table 2's mask terms assume it is > 0.
    """

    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    ffn_hidden_size: int = 0
    tp: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    dtype: Dtype = Dtype.BF16
    dropout_prob: float = 0.1
    layernorm_epsilon: float = field(default=1e-5, repr=False)

    def __post_init__(self) -> None:
        if self.ffn_hidden_size == 0:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        object.__setattr__(self, "dtype", Dtype(self.dtype))
        for name in ("hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                     "ffn_hidden_size", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"LayerSpec.{name} must be >= 1, got {getattr(self, name)}")
        self._check_divisible("hidden_size", "num_attention_heads")
        self._check_divisible("num_attention_heads", "tp")
        self._check_divisible("ffn_hidden_size", "tp")
        if self.sequence_parallel:
            self._check_divisible("seq_length", "tp")
        if not 0.0 <= self.dropout_prob < 1.0:
            raise ValueError(f"LayerSpec.dropout_prob must be in [0, 1), got {self.dropout_prob}")

    def _check_divisible(self, name: str, by: str) -> None:
        if getattr(self, name) % getattr(self, by):
            raise ValueError(f"LayerSpec.{name}={getattr(self, name)} must be divisible by "
                             f"{by}={getattr(self, by)}")

    @property
    def head_dim(self) -> int:
        """h / a, the per-head size d of the 1/sqrt(d) scale."""
        return self.hidden_size // self.num_attention_heads

    @property
    def local_heads(self) -> int:
        """a / t attention heads on each rank."""
        return self.num_attention_heads // self.tp

    @property
    def local_seq_length(self) -> int:
        """Sequence rows held outside the tensor-parallel regions: s/t with SP, else s."""
        return self.seq_length // self.tp if self.sequence_parallel else self.seq_length

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @classmethod
    def from_layer_config(cls, cfg: LayerConfig, **overrides: Any) -> LayerSpec:
        """The real layer for the simulator's layer config (4-byte elements run in fp32,
        others in bf16); `overrides` set the fields the config does not carry."""
        fields: dict[str, Any] = {
            "hidden_size": cfg.hidden_size,
            "num_attention_heads": cfg.num_attention_heads,
            "seq_length": cfg.seq_length,
            "micro_batch_size": cfg.micro_batch_size,
            "ffn_hidden_size": cfg.ffn_hidden_size,
            "tp": cfg.tp,
            "sequence_parallel": cfg.sequence_parallel,
            "recompute": cfg.recompute,
            "dtype": Dtype.FP32 if cfg.element_bytes == 4 else Dtype.BF16,
        }
        return cls(**{**fields, **overrides})

    def serial(self) -> LayerSpec:
        """The same layer with no parallelism (t = 1, no SP)."""
        return replace(self, tp=1, sequence_parallel=False)
