"""What one real transformer layer run is: model shape, parallel layout, recompute, precision.

Field names follow Megatron (`hidden_size`, `num_attention_heads`, `ffn_hidden_size`,
`seq_length`, `micro_batch_size`, `tp`); symbols follow the paper's Table 1 (s, b, h, a, t).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from simcluster.config.choices import Dtype
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
    needs. `dropout_prob` applies to the attention probabilities and to both block outputs;
    Table 2's mask terms assume it is > 0.
    """

    dropout_prob: float = 0.1
    layernorm_epsilon: float = field(default=1e-5, repr=False)

    def __post_init__(self) -> None:
        LayerConfig.__post_init__(self)
        if not 0.0 <= self.dropout_prob < 1.0:
            raise ValueError(f"LayerSpec.dropout_prob must be in [0, 1), got {self.dropout_prob}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @classmethod
    def from_layer_config(cls, cfg: LayerConfig, **overrides: Any) -> LayerSpec:
        """The real layer for the simulator's layer config; `overrides` set the fields the
        config does not carry. 2-byte elements run in bf16 (what calibration measures)."""
        fields: dict[str, Any] = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(LayerConfig)}
        fields["dtype"] = Dtype.FP32 if cfg.element_bytes == 4 else Dtype.BF16
        return cls(**{**fields, **overrides})

    def config(self) -> LayerConfig:
        """The simulator's description of the same layer on the same rank."""
        return LayerConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LayerConfig)})

    def serial(self) -> LayerSpec:
        """The same layer with no parallelism (t = 1, no SP)."""
        return replace(self, tp=1, sequence_parallel=False)
