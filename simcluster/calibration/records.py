"""What the profiler measures, as plain data: standard library only, no torch.

The measuring modules (`microbench`, `layer_timing`, `device_info`) fill these in on the
device; `simcluster.calibration` reads them (in the same process, or from the JSON the
measuring modules write on a bare GPU machine) on any machine, with or without torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from simcluster.atomic_files import write_text_atomically  # noqa: F401  (the entry points write through it)
from simcluster.calibration.shapes import LayerShape
from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import FLASH_BACKWARD_FLOP_RATIO


@dataclass(frozen=True)
class DeviceInfo:
    """One device as torch (and, on a GPU, nvidia-smi) reports it."""

    device_type: str
    name: str
    memory_bytes: int
    num_sms: int  # streaming multiprocessors; CPU: os.cpu_count()
    l2_cache_bytes: int
    memory_clock_khz: int  # 0 where unknown (CPU)
    memory_bus_width_bits: int
    driver_version: str
    cuda_version: str
    torch_version: str
    num_threads: int
    platform: str
    date: str

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / 1e9


@dataclass(frozen=True)
class GemmRecord:
    """A timed GEMM under the op graph's name for its shape (C[m, n] += A[m, k] B[k, n])."""

    name: str
    m: int
    n: int
    k: int
    batch: int
    seconds: float
    spread: float  # interquartile range over median

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class ElementwiseRecord:
    """A timed memory-bound site with the op graph's bytes for it, and the op graph's op it
    was planned for (e.g. "attn.softmax.bwd"; the fit keys per-kind curves by
    `costs.compute.elementwise_kind` of it). "" in measurements written before ops were
    recorded: such a record fits the generic curve only."""

    name: str
    dims: tuple[int, ...]
    bytes_moved: float
    seconds: float
    spread: float
    op: str = ""


@dataclass(frozen=True)
class AttentionRecord:
    """One timed `torch.nn.functional.scaled_dot_product_attention` shape: median seconds
    of the forward alone and of forward + backward (inputs requiring grad, as in training),
    and the SDPA backend torch picked ("FlashAttention", "CudnnAttention", ...,
    `profiler.bench.attention.sdpa_backend`).

    FLOPs as the profile's flash tables count them (FlashAttention-3 figures, flash-attention
    `benchmarks/benchmark_flash_attention.py::flops`): forward 4·b·h·s²·d, half that under a
    causal mask; backward 2.5 × the forward (`FLASH_BACKWARD_FLOP_RATIO`)."""

    batch: int
    heads: int
    seq_length: int
    head_dim: int
    causal: bool
    forward_s: float
    total_s: float
    forward_spread: float  # interquartile range over median
    total_spread: float
    backend: str

    @property
    def forward_flops(self) -> float:
        dense = 4.0 * self.batch * self.heads * self.seq_length**2 * self.head_dim
        return dense * (0.5 if self.causal else 1.0)

    @property
    def backward_flops(self) -> float:
        return FLASH_BACKWARD_FLOP_RATIO * self.forward_flops


@dataclass(frozen=True)
class Measurements:
    """Everything one calibration run measured, with its provenance."""

    device: DeviceInfo
    command: str
    grid: str
    dtype: str
    dropout_prob: float
    shapes: list[dict[str, Any]]
    policy: dict[str, Any]
    launch_s: float
    copy_bytes: float
    copy_s: float
    peak_gemm: GemmRecord
    peak_gemm_fp32: GemmRecord
    layer_overhead_s: float  # eager framework seconds per op-graph op (tiny layer)
    gemms: list[GemmRecord] = field(default_factory=list)
    elementwise: list[ElementwiseRecord] = field(default_factory=list)
    attention: list[AttentionRecord] = field(default_factory=list)  # [] in older measurements

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> Measurements:
        data = json.loads(text)
        data["device"] = DeviceInfo(**data["device"])
        data["peak_gemm"] = GemmRecord(**data["peak_gemm"])
        data["peak_gemm_fp32"] = GemmRecord(**data["peak_gemm_fp32"])
        data["gemms"] = [GemmRecord(**g) for g in data["gemms"]]
        data["elementwise"] = [
            ElementwiseRecord(**{**e, "dims": tuple(e["dims"])}) for e in data["elementwise"]
        ]
        data["attention"] = [AttentionRecord(**a) for a in data.get("attention", [])]
        return Measurements(**data)


LAYER_MODES = ("eager", "compiled")
"""How the layer ran: eager torch, or its forward + backward under torch.compile (fused
memory-bound regions, as Megatron-core / Transformer Engine fuse them)."""


@dataclass(frozen=True)
class LayerTiming:
    """Median seconds of one layer's forward and forward + backward on rank 0 of t.

    The model fields after `repeats` default to the paper's GPT layer (MHA, GeLU with f = 4h,
    LayerNorm, learned positions, the unfused attention core) with the run's dropout, so
    files written before they existed read unchanged; a modern layer names its GQA groups,
    MLP width, activation, norm, positions and attention backend as `workload.LayerConfig`
    does. `forward_s` (and `spread`) are None where only forward + backward was timed."""

    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    tp: int
    sequence_parallel: bool
    recompute: str
    forward_s: float | None
    total_s: float
    spread: float | None  # interquartile range of total over its median (None: not recorded)
    repeats: int
    name: str = ""  # e.g. "llama3-8b"; "" for the paper grid
    mode: str = "eager"  # one of LAYER_MODES
    num_query_groups: int = 0  # 0: one key/value head per query head
    ffn_hidden_size: int = 0  # 0: 4h
    activation: str = "gelu"
    normalization: str = "layernorm"
    position_embedding: str = "learned"
    attention_backend: str = "unfused"
    hidden_dropout: float | None = None  # None: the run's dropout_prob
    attention_dropout: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in LAYER_MODES:
            raise ValueError(f"layer timing mode: value {self.mode!r}: allowed: {', '.join(LAYER_MODES)}")

    @property
    def backward_s(self) -> float | None:
        return None if self.forward_s is None else self.total_s - self.forward_s

    @property
    def shape(self) -> LayerShape:
        return LayerShape(self.hidden_size, self.num_attention_heads, self.seq_length, self.micro_batch_size)

    @property
    def is_paper_layer(self) -> bool:
        """The paper's GPT layer (the grid `check-profile` measures), not a modern one."""
        return (self.num_query_groups, self.ffn_hidden_size, self.activation, self.normalization) == (
            0,
            0,
            "gelu",
            "layernorm",
        ) and (self.position_embedding, self.attention_backend) == ("learned", "unfused")

    def layer_config(self, dropout_prob: float) -> LayerConfig:
        """The simulator's description of this layer on rank 0 of t (`dropout_prob`: the run's,
        for dropouts the timing does not name)."""
        return LayerConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            ffn_hidden_size=self.ffn_hidden_size,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            recompute=Recompute(self.recompute),
            num_query_groups=self.num_query_groups,
            activation=Activation(self.activation),
            normalization=Normalization(self.normalization),
            position_embedding=PositionEmbedding(self.position_embedding),
            attention_backend=AttentionBackend(self.attention_backend),
            hidden_dropout=dropout_prob if self.hidden_dropout is None else self.hidden_dropout,
            attention_dropout=dropout_prob if self.attention_dropout is None else self.attention_dropout,
        )


@dataclass(frozen=True)
class LayerRun:
    """A check run: where, how, and the timings."""

    device: DeviceInfo
    command: str
    grid: str
    dtype: str
    dropout_prob: float
    timings: list[LayerTiming] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> LayerRun:
        data = json.loads(text)
        data["device"] = DeviceInfo(**data["device"])
        data["timings"] = [LayerTiming(**t) for t in data["timings"]]
        return LayerRun(**data)


@dataclass(frozen=True)
class AllReducePoint:
    message_bytes: int
    seconds: float
    num_ranks: int

    @property
    def busbw_bytes_per_s(self) -> float:
        return 2 * (self.num_ranks - 1) / self.num_ranks * self.message_bytes / self.seconds
