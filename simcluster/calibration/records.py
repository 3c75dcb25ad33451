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
from simcluster.config.choices import LayerMode, Recompute
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
    # the host CPU's model (/proc/cpuinfo "model name"): a profile's host issue costs are this
    # CPU's, and hosts differ (an x86 DGX against an Arm Grace); "" in files written before
    host_cpu: str = ""

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
    sm_clock_mhz: float | None = None  # NVML SM clock / power right after the timed repeats;
    power_w: float | None = None  # None where not measured (CPU, no NVML, older files)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class ElementwiseRecord:
    """A timed memory-bound site with the op graph's bytes for it, and the op graph's op it
    was planned for (e.g. "attn.softmax.bwd"; the fit keys per-kind curves by
    `recorded_op_kind` of it). "" in measurements written before ops were recorded: such a
    record fits the generic curve only."""

    name: str
    dims: tuple[int, ...]
    bytes_moved: float
    seconds: float
    spread: float
    op: str = ""
    sm_clock_mhz: float | None = None  # NVML SM clock / power right after the timed repeats;
    power_w: float | None = None  # None where not measured (CPU, no NVML, older files)


def recorded_op_kind(op_name: str) -> str:
    """The kernel kind (`costs.compute.elementwise_kind`) of the op an `ElementwiseRecord`
    names. Measurement files are a format: they key each site by the op's name (`Op.name`,
    e.g. "attn.softmax.bwd"), so reading one back reads that key: its last component without
    the block and GEMM prefix, a norm as "layernorm", ".bwd" kept ("attn.softmax.bwd" ->
    "softmax.bwd", "ln1" -> "layernorm", "mlp.fc2.bias_dropout_add.bwd" ->
    "bias_dropout_add.bwd", "ln2.residual_grad_add" -> "residual_grad_add"). The simulator
    never classifies its own ops so; a test holds this equal to `elementwise_kind` of every
    element-wise op the workload builds."""
    backward = op_name.endswith(".bwd")
    last = op_name.removesuffix(".bwd").rsplit(".", 1)[-1]
    kind = "layernorm" if last in ("ln1", "ln2", "ln") else last  # the norms' ops
    return f"{kind}.bwd" if backward else kind


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
    sm_clock_mhz: float | None = None  # NVML SM clock / power right after the timed repeats;
    power_w: float | None = None  # None where not measured (CPU, no NVML, older files)

    @property
    def forward_flops(self) -> float:
        dense = 4.0 * self.batch * self.heads * self.seq_length**2 * self.head_dim
        return dense * (0.5 if self.causal else 1.0)

    @property
    def backward_flops(self) -> float:
        return FLASH_BACKWARD_FLOP_RATIO * self.forward_flops


@dataclass(frozen=True)
class ModernKernelRecord:
    """One kernel of the modern layers, timed as Megatron-core / TE run it (`layer_mode`
    "fused": torch.compile'd regions, `torch._scaled_mm`, SDPA, fused AdamW).

    kind: "memory_bound" (RMSNorm, RoPE, SwiGLU: `bytes_moved` is the ideal HBM traffic, one
    read of each input and one write of each output), "gemm_fp8" and "attention" (`flops`,
    flash counting as in `AttentionRecord`), "optimizer" (AdamW: `bytes_moved` of params,
    grads, two moments, read and written). dims: the shape, as `detail` names it."""

    name: str
    kind: str
    dims: tuple[int, ...]
    flops: float
    bytes_moved: float
    seconds: float
    spread: float
    layer_mode: str
    detail: str = ""
    sm_clock_mhz: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class GroupedGemmRecord:
    """One timed grouped expert GEMM (`profiler.bench.grouped_gemm`): `groups` local experts,
    each C[m, n] = A[m, k] B[k, n] in the op graph's coordinates for `kind` (fc1 / fc2
    forward, ".dgrad", ".wgrad": `workload.moe_layer`; tokens per expert is m, or k for a
    wgrad), in one call. `impl`: "grouped_mm" (`torch._grouped_mm`, one kernel over the
    groups, as TE's GroupedLinear runs them) or "loop" (one `torch.matmul` per group, as
    Megatron's SequentialMLP does), whichever ran; `model` names the MoE shape it was planned
    for. FLOPs 2·groups·m·n·k."""

    kind: str
    groups: int
    m: int
    n: int
    k: int
    seconds: float
    spread: float
    impl: str
    model: str = ""
    sm_clock_mhz: float | None = None
    power_w: float | None = None

    @property
    def flops(self) -> float:
        return 2.0 * self.groups * self.m * self.n * self.k


@dataclass(frozen=True)
class TinyLayerRecord:
    """One tiny layer the microbench timed for the host's cost (`microbench.layer_overhead_s`):
    its layout, recompute, the stand-in ops it prices (all, and those its recompute replays),
    the torch.utils.checkpoint regions it runs (`host_fit.checkpoint_regions`) and its median
    forward + backward seconds."""

    tp: int
    sequence_parallel: bool
    recompute: str
    priced_ops: int
    replayed_ops: int
    checkpoints: int
    total_s: float


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
    # Added with issue 20; older files read as an eager layer measured in a burst:
    layer_mode: str = "eager"  # how the memory-bound sites and the tiny layer ran (LayerMode)
    load: str = "burst"  # "sustained": after `warmup` settled the clock, kept warm between kernels
    warmup: dict[str, Any] | None = None  # the settling loop: seconds, block medians, clock, power
    modern: list[ModernKernelRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # modern kernels this device cannot run, why
    grouped_gemms: list[GroupedGemmRecord] = field(default_factory=list)  # issue 18; [] in older files
    tiny_layers: list[TinyLayerRecord] = field(default_factory=list)  # [] in older files (median only)

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
        data["modern"] = [
            ModernKernelRecord(**{**k, "dims": tuple(k["dims"])}) for k in data.get("modern", [])
        ]
        data["grouped_gemms"] = [GroupedGemmRecord(**g) for g in data.get("grouped_gemms", [])]
        data["tiny_layers"] = [TinyLayerRecord(**r) for r in data.get("tiny_layers", [])]
        return Measurements(**data)


LAYER_CONFIG_FIELDS = (
    "num_query_groups",
    "ffn_hidden_size",
    "activation",
    "normalization",
    "position_embedding",
    "attention_backend",
    "attention_kernel",
    "hidden_dropout",
    "attention_dropout",
)
"""The `LayerTiming.layer` keys that are `workload.LayerConfig` fields beyond the shape, in the
order records write them (`calibration.measured_layers`)."""
LAYER_DROPOUTS = ("hidden_dropout", "attention_dropout")


@dataclass(frozen=True)
class LayerTiming:
    """Median seconds of one layer's forward and forward + backward on rank 0 of t.

    `layer` names a modern layer (`bench.modern_layers`, `calibration.measured_layers`): its
    "name" and its `workload.LayerConfig` fields beyond the shape (GQA groups, MLP width,
    activation, norm, positions, attention backend, dropouts); None is the paper's GPT layer
    (MHA, GeLU with f = 4h, LayerNorm, learned positions, unfused attention) with the run's
    dropout. `layer_mode` (a `config.choices.LayerMode` value) overrides the run's for this
    timing, so one file can hold a layer eager and fused. `forward_s` and `spread` are None
    where only forward + backward was timed."""

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
    sm_clock_mhz: float | None = None  # NVML SM clock / power right after the timed repeats;
    power_w: float | None = None  # None where not measured (CPU, no NVML, older files)
    # a modern layer (`bench.modern_layers`): its name and the LayerConfig fields beyond
    # the shape (num_query_groups, ffn_hidden_size, activation, ...); None for the paper grid
    layer: dict[str, Any] | None = None
    layer_mode: str | None = None  # None: the run's layer_mode
    # a few repeats each started on an idle device (`profiler.bench.timing.Timer.issue_times_s`,
    # layers short enough for the host to matter): the host's perf_counter seconds to issue the
    # forward and forward + backward, and the device seconds of such a repeat; None where not
    # measured (larger layers, older files)
    host_forward_s: float | None = None
    host_total_s: float | None = None
    idle_start_total_s: float | None = None

    def __post_init__(self) -> None:
        if self.layer_mode is not None:
            LayerMode(self.layer_mode)  # ValueError naming the value for anything else

    @property
    def name(self) -> str:
        """The modern layer's name ("llama3-8b"), "" for the paper grid."""
        return str((self.layer or {}).get("name", ""))

    @property
    def backward_s(self) -> float | None:
        return None if self.forward_s is None else self.total_s - self.forward_s

    @property
    def shape(self) -> LayerShape:
        return LayerShape(self.hidden_size, self.num_attention_heads, self.seq_length, self.micro_batch_size)

    @property
    def is_paper_layer(self) -> bool:
        """The paper's GPT layer (MHA, GeLU, LayerNorm, learned positions, unfused attention)."""
        cfg = self.layer_config(0.1)
        paper = LayerConfig(
            self.hidden_size, self.num_attention_heads, self.seq_length, self.micro_batch_size
        )
        return all(
            getattr(cfg, key) == getattr(paper, key)
            for key in LAYER_CONFIG_FIELDS
            if key not in LAYER_DROPOUTS
        )

    def layer_config(self, dropout_prob: float) -> LayerConfig:
        """The simulator's description of this layer on rank 0 of t (`dropout_prob`: the run's,
        for dropouts `layer` does not name). Raises ValueError for a `layer` key that is not a
        LayerConfig field."""
        fields = dict(self.layer or {})
        fields.pop("name", None)
        fields.pop("hidden_size", None)  # the shape's own fields, repeated by bench.modern_layers
        fields.pop("num_attention_heads", None)
        unknown = sorted(set(fields).difference(LAYER_CONFIG_FIELDS))
        if unknown:
            allowed = ", ".join(sorted(LAYER_CONFIG_FIELDS))
            raise ValueError(f"layer timing layer: keys {unknown}: allowed: name, {allowed}")
        fields.setdefault("hidden_dropout", dropout_prob)
        fields.setdefault("attention_dropout", dropout_prob)
        return LayerConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            recompute=Recompute(self.recompute),
            **fields,
        )


ISSUE_FIELDS = ("host_forward_s", "host_total_s", "idle_start_total_s")  # LayerTiming, optional


@dataclass(frozen=True)
class LayerRun:
    """A check run: where, how, and the timings."""

    device: DeviceInfo
    command: str
    grid: str
    dtype: str
    dropout_prob: float
    timings: list[LayerTiming] = field(default_factory=list)
    layer_mode: str = "eager"  # LayerMode the layer ran in (older files: eager)
    load: str = "burst"  # "sustained" after a settled warm-up (see Measurements.load)
    warmup: dict[str, Any] | None = None

    def to_json(self) -> str:
        data = asdict(self)
        for timing in data["timings"]:  # files without the issue times stay as they were
            for key in ISSUE_FIELDS:
                if timing[key] is None:
                    del timing[key]
        return json.dumps(data, indent=1)

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
