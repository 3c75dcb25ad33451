"""Hardware profiles: one YAML file per GPU system, referred to by stem (found on the search
path of `simcluster.config.profiles`: `--hwprofiles`, $SIMCLUSTER_HWPROFILES, the shipped
`hwprofiles/`) or by path.

Files use human units (`_tflop_per_s`, `_gb_per_s`, `_gbit_per_s`, `_us`, `_gb`); this module
converts them once, into the SI properties the cost model reads. Every number in a profile
must carry a source (a `sources:` entry with the same key in its section) so a reader can
tell a datasheet value from a measurement from a fitted constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simcluster import units
from simcluster.config.choices import Dtype
from simcluster.config.errors import ConfigError, describe_validation_error, shorten
from simcluster.config.files import read_yaml
from simcluster.config.profiles import find_profile
from simcluster.config.profiles import known_profiles as known_profiles  # re-exported
from simcluster.config.profiles import profiles_dir as profiles_dir  # re-exported
from simcluster.config.strict import StrictModel

# Every non-zero number of a profile, in its file unit, lies between these: real ones span
# about 1e-2 (µs, efficiencies) to 1e11 (bytes of a measured kernel); 1e-300 GB/s is finite
# and positive but prices a message at 1e300 s.
MIN_MAGNITUDE, MAX_MAGNITUDE = 1e-6, 1e15
BUSBW_TIME_NOISE = 0.1  # accepted drop in all-reduce time between neighbouring table sizes


def _numbers(value: Any) -> list[float]:
    """Every number inside a field's value (tables, points, per-kind curves)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, BaseModel):
        return [n for name, item in value if name != "sources" for n in _numbers(item)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in _numbers(item)]
    return []


def _curve_problem(points: list[tuple[float, float]]) -> str | None:
    """A measured (size, rate) curve: sizes strictly increasing (the cost model interpolates
    in log size, which needs sorted, distinct sizes)."""
    sizes = [size for size, _ in points]
    if any(later <= earlier for earlier, later in zip(sizes, sizes[1:])):
        return f"sizes must be strictly increasing, got {shorten(sizes)}"
    return None


def _causal_ratio_problem(name: str, ratios: list[tuple[float, float]] | None) -> str | None:
    """A (length, causal / non-causal rate) table: a causal kernel is never the faster."""
    if any(ratio > 1 for _, ratio in ratios or []):
        return (
            f"{name}: value {shorten(ratios)}: a causal kernel is at most as fast as the "
            "non-causal one (ratio <= 1)"
        )
    return None


class _Section(StrictModel):
    """A profile section whose every numeric field must have a `sources` entry, and whose
    every number is a physical quantity: not negative anywhere, and positive inside tables
    (sizes, rates, tile shapes), sorted where the cost model interpolates. The checks walk
    the fields, so a numeric field added later is covered without naming it."""

    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> _Section:
        numeric = [
            name
            for name, value in self
            if name != "sources" and isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        missing = [name for name in numeric if name not in self.sources]
        if missing:
            raise ValueError(f"no entry in `sources` for {', '.join(missing)} (every number needs one)")
        return self

    @model_validator(mode="after")
    def _numbers_are_physical(self) -> _Section:
        problems = []
        for name, value in self:
            if name == "sources":
                continue
            numbers = _numbers(value)
            table = isinstance(value, (list, tuple, dict, BaseModel))
            if any(n < 0 for n in numbers):
                problems.append(f"{name}: no number in a profile may be negative, got {shorten(value)}")
            elif any(n != 0 and not MIN_MAGNITUDE <= n <= MAX_MAGNITUDE for n in numbers):
                problems.append(
                    f"{name}: value {shorten(value)}: a number is outside {MIN_MAGNITUDE:g} to "
                    f"{MAX_MAGNITUDE:g} in the file's units (GB/s, µs, TFLOP/s, MB, bytes); check its unit"
                )
            elif table and any(n == 0 for n in numbers):
                problems.append(
                    f"{name}: every entry must be positive (no zero size or rate): {shorten(value)}"
                )
            curves = value.values() if isinstance(value, dict) else [value]
            for curve in curves:
                if _is_curve(curve) and (reason := _curve_problem(curve)):
                    problems.append(f"{name}: {reason}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _is_curve(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(point, tuple) and len(point) == 2 for point in value)
    )


class GemmPoint(StrictModel):
    """One measured GEMM: (batch × M × N × K) at an achieved rate."""

    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    batch: int = Field(default=1, gt=0)
    tflop_per_s: float = Field(gt=0)


GroupedGemmKind = Literal["fc1", "fc2", "fc1.dgrad", "fc2.dgrad", "fc1.wgrad", "fc2.wgrad"]
"""The routed experts' grouped GEMMs (TE `GroupedLinear`, one call over the local experts):
fc1 / fc2 forward, their input gradient (dgrad) and weight gradient (wgrad)."""


class GroupedGemmPoint(StrictModel):
    """One measured grouped expert GEMM: `groups` local experts, each C[m, n] = A[m, k] B[k, n]
    in the op graph's coordinates (`workload.moe_layer`; tokens per expert is m, or k for a
    wgrad), at an achieved rate over all groups."""

    kind: GroupedGemmKind
    groups: int = Field(gt=0)
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    tflop_per_s: float = Field(gt=0)


class AttentionRates(_Section):
    """Achieved rates of one family of fused-attention kernels (head dim 128, BF16), FLOPs
    counted as flash-attention's benchmarks count them (docs/cost_model.md): the same three tables
    as `compute.flash_attention_*`, for kernels other than the profile's default ones."""

    fwd_tflop_per_s: list[tuple[float, float]] = Field(
        description="(sequence length, achieved TFLOP/s) of the forward, not causal"
    )
    bwd_tflop_per_s: list[tuple[float, float]] = Field(
        description="(sequence length, achieved TFLOP/s) of the backward, not causal, FLOPs = 2.5 × forward"
    )
    causal_efficiency: list[tuple[float, float]] = Field(
        description="(sequence length, causal TFLOP/s over non-causal TFLOP/s) at the same length"
    )

    @model_validator(mode="after")
    def _causal_is_a_fraction(self) -> AttentionRates:
        if problem := _causal_ratio_problem("causal_efficiency", self.causal_efficiency):
            raise ValueError(problem)
        return self


class GpuSpec(_Section):
    name: str
    peak_bf16_tflop_per_s: float = Field(gt=0)
    peak_fp32_tflop_per_s: float = Field(gt=0)
    memory_gb: float = Field(gt=0)
    memory_bandwidth_gb_per_s: float = Field(gt=0)
    num_sms: int = Field(gt=0)
    # Optional (absent = not stated; existing profiles load unchanged).
    peak_fp8_tflop_per_s: float | None = Field(
        default=None, gt=0, description="dense FP8 tensor-core peak; absent = no FP8 tensor cores"
    )
    peak_fp4_tflop_per_s: float | None = Field(
        default=None, gt=0, description="dense NVFP4 tensor-core peak; absent = no FP4 tensor cores"
    )
    memory_capacity_mib: float | None = Field(
        default=None, gt=0, description="device memory as the driver reports it (nvidia-smi memory.total)"
    )
    cuda_context_mib: float | None = Field(default=None, ge=0, description="held by the CUDA context")
    nccl_buffers_mib: float | None = Field(default=None, ge=0, description="held by NCCL communicators")

    @model_validator(mode="after")
    def _reserve_leaves_memory(self) -> GpuSpec:
        """The CUDA context and NCCL buffers must leave some of the device to the model."""
        if self.memory_capacity_mib is None:
            return self
        reserve = (self.cuda_context_mib or 0.0) + (self.nccl_buffers_mib or 0.0)
        if reserve >= self.memory_capacity_mib:
            raise ValueError(
                f"cuda_context_mib + nccl_buffers_mib ({reserve:g}) must be below memory_capacity_mib "
                f"({self.memory_capacity_mib:g})"
            )
        return self


# --- Host issue time (`costs.host`), kept apart from the kernel-rate fields below. ---
class HostIssueModel(_Section):
    """The host's side of a kernel: CPU seconds to issue it (PyTorch dispatch, autograd,
    the launch itself). Optional: absent = the host is not priced and the GPU never waits
    for it (every profile without the key gives the results it gave before)."""

    host_issue_us_per_op: float | None = Field(
        default=None,
        gt=0,
        description="host seconds (µs in the file) to issue one kernel or collective of the "
        "workload's op graph; absent = not priced",
    )

    moe_host_us_per_op: float | None = Field(
        default=None,
        gt=0,
        description="host µs to issue one launch of a MoE block's router, token dispatcher and "
        "permutation ops (`costs.moe_host` counts; not its expert GEMMs); absent = "
        "host_issue_us_per_op",
    )
    expert_gemm_host_us_per_launch: float | None = Field(
        default=None,
        gt=0,
        description="host µs per routed-expert GEMM launch (one per local expert and GEMM); "
        "absent = host_issue_us_per_op",
    )

    @property
    def host_issue_s_per_op(self) -> float | None:
        us = self.host_issue_us_per_op
        return None if us is None else units.us_to_s(us)

    def moe_host_weights(self) -> tuple[float, float]:
        """(MoE block launch, expert GEMM launch) host cost over `host_issue_us_per_op`: 1.0
        each where a key is absent, and where the host is not priced or free (no base cost: the
        launches then cost nothing, `costs.host`)."""
        base = self.host_issue_us_per_op
        if not base:
            return 1.0, 1.0
        other, expert = self.moe_host_us_per_op, self.expert_gemm_host_us_per_launch
        return (1.0 if other is None else other / base), (1.0 if expert is None else expert / base)


class ComputeModel(HostIssueModel):
    """How kernels reach (or miss) the peak: see `simcluster.costs.compute`."""

    gemm_max_efficiency: float = Field(gt=0, le=1)
    fp8_gemm_max_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="large FP8 GEMM ceiling as a fraction of the FP8 peak"
    )
    fp8_weight_transpose_copy: bool = Field(
        default=False,
        description="FP8 GEMMs take only the TN layout (Hopper), so Transformer Engine caches a "
        "transposed (column-wise) FP8 copy of each weight beside the row-wise one",
    )
    mxfp8_block_scaling: bool = Field(
        default=False,
        description="the tensor cores run MXFP8 GEMMs (E8M0 scales per 32 elements, Blackwell), "
        "so training.fp8_recipe mxfp8 can run",
    )
    mxfp8_gemm_rate_ratio: float | None = Field(
        default=None,
        gt=0,
        le=2,
        description="an MXFP8 GEMM's rate over the per-tensor FP8 GEMM's at the same shape "
        "(kernel only, operands already quantized); absent = the same rate",
    )
    fp8_block_scaling: bool = Field(
        default=False,
        description="Transformer Engine runs FP8 block-scaled GEMMs here (cuBLAS, compute capability "
        ">= 9.0 and CUDA >= 12.9; emulated with MXFP8 on Blackwell), so training.fp8_recipe blockwise "
        "can run",
    )
    fp8_block_gemm_rate_ratio: float | None = Field(
        default=None,
        gt=0,
        le=2,
        description="a block-scaled FP8 GEMM's rate over the per-tensor FP8 GEMM's at the same shape "
        "(kernel only); absent = the same rate",
    )
    nvfp4_gemm_rate_ratio: float | None = Field(
        default=None,
        gt=0,
        le=8,
        description="an NVFP4 GEMM's rate over the per-tensor FP8 GEMM's at the same shape (kernel "
        "only, operands already quantized); needs gpu.peak_fp4_tflop_per_s; absent = the ratio of "
        "the two peaks",
    )
    memory_bound_efficiency: float = Field(gt=0, le=1)
    kernel_launch_us: float = Field(ge=0)
    gemm_tiles: list[tuple[int, int, float]] = Field(
        default=[(256, 128, 1.0), (128, 128, 0.95), (128, 64, 0.85), (64, 64, 0.7)],
        min_length=1,
        description="candidate CTA tiles (M, N, relative efficiency) for wave quantization",
    )
    gemm_points: list[GemmPoint] = Field(
        default_factory=list,
        description="measured GEMMs; when present they override the analytical efficiency",
    )
    fp8_gemm_points: list[GemmPoint] = Field(
        default_factory=list,
        description="measured FP8 GEMMs (e4m3 operands, 16-bit output, as Transformer Engine runs "
        "them); when present they set the FP8 rate at each shape (`costs.compute.fp8_gemm_time_s`), "
        "absent = the FP8 ceiling with wave quantization",
    )
    grouped_gemm_points: list[GroupedGemmPoint] = Field(
        default_factory=list,
        description="measured grouped expert GEMMs (`calibration.grouped_fit`); when a kind is "
        "listed, the routed experts' 16-bit GEMMs of that kind are priced from them "
        "(`costs.grouped_gemm`), absent = as any GEMM (`gemm_points` or the wave model)",
    )
    grouped_ratio_for_quantized: bool = Field(
        default=False,
        description="an FP8 / FP4 routed-expert GEMM of a kind with grouped_gemm_points is priced as "
        "the quantized GEMM model's time times the measured 16-bit grouped time over the 16-bit GEMM "
        "model's time at the same shape (`costs.grouped_gemm.quantized_expert_gemm_time_s`), a declared "
        "carry-over; absent = the quantized GEMM model alone",
    )
    grouped_ratio_from: str | None = Field(
        default=None,
        description="a profile without grouped_gemm_points prices its routed-expert GEMMs as its own "
        "GEMM model's time times the grouped time over the GEMM-model time that this named profile's "
        "measured grouped_gemm_points give at the same shape (`costs.grouped_gemm`), a declared "
        "carry-over; absent = its own GEMM model alone",
    )
    elementwise_points: list[tuple[float, float]] = Field(
        default_factory=list,
        description="measured (bytes moved, achieved GB/s) for memory-bound kernels",
    )
    elementwise_points_by_op: dict[str, list[tuple[float, float]]] = Field(
        default_factory=dict,
        description="measured (bytes moved, achieved GB/s) per kernel kind "
        "(`costs.compute.elementwise_kind`, e.g. 'softmax.bwd'); a kind not listed uses "
        "`elementwise_points`",
    )
    memory_bound_efficiency_by_kind: dict[str, float] = Field(
        default_factory=dict,
        description="fraction of the HBM bandwidth a memory-bound kernel of one kind reaches "
        "(`costs.compute.elementwise_kind`: 'layernorm', 'swiglu', 'rope', 'cross_entropy', "
        "'optimizer', ...); a backward kind not listed ('swiglu.bwd') takes its forward's, any "
        "other kind `memory_bound_efficiency`. Measured per-kind curves "
        "(`elementwise_points_by_op`) come first",
    )
    flash_attention_fwd_tflop_per_s: list[tuple[float, float]] | None = Field(
        default=None,
        description="(sequence length, achieved TFLOP/s) of the fused flash-attention forward, "
        "not causal, head dim 128, FLOPs counted as flash-attention's benchmarks do "
        "(4·b·heads·s²·d); absent = flash attention cannot be priced on this profile",
    )
    flash_attention_bwd_tflop_per_s: list[tuple[float, float]] | None = Field(
        default=None,
        description="(sequence length, achieved TFLOP/s) of the flash-attention backward, not "
        "causal, FLOPs = 2.5 × the forward's (flash-attention's convention)",
    )
    flash_attention_causal_efficiency: list[tuple[float, float]] | None = Field(
        default=None,
        description="(sequence length, causal TFLOP/s over non-causal TFLOP/s) at the same "
        "length: a causal kernel does half the FLOPs but not at the same rate",
    )
    flash_attention_head_dim_ratio: dict[int, list[tuple[float, float, float, float]]] | None = Field(
        default=None,
        description="per head dim, (sequence length, forward, causal forward, backward) rate of "
        "cuDNN's fused attention at that head dim over its rate at head dim 128, applied to the "
        "flash_attention_* rates of a layer with a non-vanilla model.softmax_type (TE's cuDNN-only "
        "path); absent = the head-dim-128 rates at every head dim",
    )
    flash_attn_2: AttentionRates | None = Field(
        default=None,
        description="Dao's FlashAttention-2 kernels' rates (scenario `training.attention_kernel: "
        "flash_attn_2`); absent = that kernel cannot be priced on this profile",
    )

    @model_validator(mode="after")
    def _flash_attention_is_whole(self) -> ComputeModel:
        tables = {
            "flash_attention_fwd_tflop_per_s": self.flash_attention_fwd_tflop_per_s,
            "flash_attention_bwd_tflop_per_s": self.flash_attention_bwd_tflop_per_s,
            "flash_attention_causal_efficiency": self.flash_attention_causal_efficiency,
        }
        given = [name for name, table in tables.items() if table is not None]
        if given and len(given) != len(tables):
            missing = [name for name in tables if name not in given]
            raise ValueError(
                f"{', '.join(given)} given without {', '.join(missing)}: flash attention needs all three"
            )
        causal = self.flash_attention_causal_efficiency
        if problem := _causal_ratio_problem("flash_attention_causal_efficiency", causal):
            raise ValueError(problem)
        return self

    @property
    def has_flash_attention(self) -> bool:
        """The profile can price a fused flash-attention kernel."""
        return self.flash_attention_fwd_tflop_per_s is not None

    @model_validator(mode="after")
    def _kind_efficiencies_are_fractions(self) -> ComputeModel:
        above = {kind: value for kind, value in self.memory_bound_efficiency_by_kind.items() if value > 1}
        if above:
            raise ValueError(
                f"memory_bound_efficiency_by_kind: value {shorten(above)}: an efficiency is a fraction "
                "of the HBM bandwidth (at most 1)"
            )
        return self

    @model_validator(mode="after")
    def _tiles_are_fractions(self) -> ComputeModel:
        if any(relative > 1 for _, _, relative in self.gemm_tiles):
            raise ValueError(
                f"gemm_tiles: value {shorten(self.gemm_tiles)}: a tile's relative efficiency is at most 1 "
                "(the ceiling is gemm_max_efficiency)"
            )
        return self


class NetworkModel(_Section):
    gpus_per_node: int = Field(gt=0)
    nvlink_bandwidth_gb_per_s: float = Field(gt=0)
    nvlink_allreduce_busbw: list[tuple[float, float]] = Field(
        min_length=1, description="(message MB, measured all-reduce busbw GB/s) in one NVLink domain"
    )
    nvlink_allgather_busbw: list[tuple[float, float]] | None = Field(
        default=None,
        min_length=1,
        description="(message MB, ring all-gather / reduce-scatter busbw GB/s) in one NVLink domain; "
        "absent = the all-reduce table (differs where NVLS speeds up all-reduce only)",
    )
    nvlink_domain_size: int | None = Field(
        default=None, gt=0, description="GPUs sharing one NVLink fabric; absent = gpus_per_node (NVL72: 72)"
    )
    nvlink_latency_us: float = Field(ge=0)
    nvlink_p2p_efficiency: float = Field(gt=0, le=1)
    nics_per_node: int = Field(gt=0)
    nic_bandwidth_gbit_per_s: float = Field(gt=0)
    nic_achieved_gb_per_s: float = Field(gt=0)
    ib_latency_per_step_us: float = Field(ge=0)
    collective_base_latency_us: float = Field(ge=0)
    tp_overlap_fraction: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="share of an asynchronous TP collective hidden behind the GEMM it overlaps",
    )
    measured: Literal["datasheet", "measured"] = "datasheet"

    @model_validator(mode="after")
    def _bigger_messages_take_longer(self) -> NetworkModel:
        """An all-reduce of more bytes never finishes sooner: size / busbw must not decrease
        (busbw itself may dip, as the measured A100 sweep does at 16 MB). Measurements are
        noisy where latency dominates (that sweep's 4 MB point is 0.4 % faster than its 1 MB
        one), so a drop within `BUSBW_TIME_NOISE` is accepted."""
        tables = {"nvlink_allreduce_busbw": self.nvlink_allreduce_busbw}
        if self.nvlink_allgather_busbw is not None:
            tables["nvlink_allgather_busbw"] = self.nvlink_allgather_busbw
        for name, table in tables.items():
            times = [size / rate for size, rate in table if size > 0 and rate > 0]
            if any(later < earlier * (1 - BUSBW_TIME_NOISE) for earlier, later in zip(times, times[1:])):
                raise ValueError(
                    f"{name}: value {shorten(table)}: message size / busbw "
                    "(the time) must not decrease as messages grow"
                )
        return self

    @model_validator(mode="after")
    def _domain_holds_whole_nodes(self) -> NetworkModel:
        domain = self.nvlink_domain_size
        if domain is not None and domain % self.gpus_per_node:
            raise ValueError(
                f"nvlink_domain_size {domain} must be a multiple of gpus_per_node {self.gpus_per_node}"
            )
        return self


class Provenance(StrictModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    kind: Literal["datasheet", "public-measurements", "measured", "fitted"]
    summary: str


class HardwareProfile(StrictModel):
    """A GPU system: one GPU's compute model and the node / cluster network."""

    name: str
    description: str = ""
    provenance: Provenance
    gpu: GpuSpec
    compute: ComputeModel
    network: NetworkModel
    calibration: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fp8_ceiling_needs_fp8_peak(self) -> HardwareProfile:
        if self.compute.fp8_gemm_max_efficiency is not None and self.gpu.peak_fp8_tflop_per_s is None:
            raise ValueError("compute.fp8_gemm_max_efficiency needs gpu.peak_fp8_tflop_per_s")
        if self.compute.fp8_gemm_points and self.compute.fp8_gemm_max_efficiency is None:
            raise ValueError(
                "compute.fp8_gemm_points needs compute.fp8_gemm_max_efficiency (the ceiling that caps "
                "the rates interpolated between the points)"
            )
        if self.gpu.peak_fp4_tflop_per_s is not None and self.compute.fp8_gemm_max_efficiency is None:
            raise ValueError(
                "gpu.peak_fp4_tflop_per_s needs compute.fp8_gemm_max_efficiency (NVFP4 GEMMs are priced "
                "from the FP8 GEMM rate times compute.nvfp4_gemm_rate_ratio)"
            )
        if self.compute.grouped_ratio_for_quantized and not (
            self.compute.grouped_gemm_points or self.compute.grouped_ratio_from
        ):
            raise ValueError(
                "compute.grouped_ratio_for_quantized needs compute.grouped_gemm_points or "
                "compute.grouped_ratio_from (the measured grouped GEMMs whose ratio to the GEMM model "
                "it carries to FP8 / FP4 experts)"
            )
        if self.compute.grouped_ratio_from is not None and self.compute.grouped_gemm_points:
            raise ValueError(
                "compute.grouped_ratio_from is for a profile without grouped_gemm_points: this one "
                "measured its own (remove one of the two)"
            )
        if self.compute.nvfp4_gemm_rate_ratio is not None and self.gpu.peak_fp4_tflop_per_s is None:
            raise ValueError("compute.nvfp4_gemm_rate_ratio needs gpu.peak_fp4_tflop_per_s")
        return self

    # SI views, converted once here.
    def peak_flop_per_s(self, dtype: Dtype = Dtype.BF16) -> float:
        tflop = self.gpu.peak_fp32_tflop_per_s if dtype is Dtype.FP32 else self.gpu.peak_bf16_tflop_per_s
        return units.tflop_per_s_to_flop_per_s(tflop)

    @property
    def memory_bytes(self) -> float:
        return units.gb_to_bytes(self.gpu.memory_gb)

    @property
    def fp8_weight_copies(self) -> int:
        """FP8 weight copies Transformer Engine keeps per TE-linear parameter under FP8: the
        row-wise one, and on a GPU whose FP8 GEMMs need the TN layout (TE
        `utils.is_non_tn_fp8_gemm_supported` is false before compute capability 10.0) the
        column-wise (transposed) one its dgrad/wgrad GEMMs read."""
        return 2 if self.compute.fp8_weight_transpose_copy else 1

    @property
    def peak_fp8_flop_per_s(self) -> float | None:
        """Dense FP8 tensor-core peak; None on a GPU without FP8 tensor cores (A100)."""
        tflop = self.gpu.peak_fp8_tflop_per_s
        return None if tflop is None else units.tflop_per_s_to_flop_per_s(tflop)

    @property
    def peak_fp4_flop_per_s(self) -> float | None:
        """Dense NVFP4 tensor-core peak; None on a GPU without FP4 tensor cores (before Blackwell)."""
        tflop = self.gpu.peak_fp4_tflop_per_s
        return None if tflop is None else units.tflop_per_s_to_flop_per_s(tflop)

    @property
    def memory_capacity_bytes(self) -> float:
        """Device memory as the driver reports it; the datasheet `memory_gb` where not given."""
        mib = self.gpu.memory_capacity_mib
        return self.memory_bytes if mib is None else units.mib_to_bytes(mib)

    @property
    def memory_reserved_bytes(self) -> float:
        """What the CUDA context and NCCL's buffers hold before the model allocates."""
        return units.mib_to_bytes((self.gpu.cuda_context_mib or 0.0) + (self.gpu.nccl_buffers_mib or 0.0))

    @property
    def usable_memory_bytes(self) -> float:
        """Capacity left to the framework: driver-reported capacity minus the reserve. Every
        `fits` decision (run, memory, sweep, plan) compares with this."""
        return self.memory_capacity_bytes - self.memory_reserved_bytes

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs that reach each other over NVLink: a node, or a larger fabric (GB200 NVL72)."""
        return self.network.nvlink_domain_size or self.network.gpus_per_node

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.gpu.memory_bandwidth_gb_per_s)

    @property
    def kernel_launch_s(self) -> float:
        return units.us_to_s(self.compute.kernel_launch_us)

    @property
    def nvlink_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.network.nvlink_bandwidth_gb_per_s)

    @property
    def nic_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.network.nic_achieved_gb_per_s)


def load_hardware(
    reference: str, relative_to: Path | None = None, field: str = "hardware", extra: Sequence[Path] = ()
) -> HardwareProfile:
    """The profile `reference` names (a name on the search path or a .yaml path: see
    `simcluster.config.profiles`); `relative_to` is the scenario file that names it."""
    path = find_profile(reference, relative_to, field, extra)
    return parse_hardware(read_yaml(path), path)


def parse_hardware(data: Any, source: str | Path) -> HardwareProfile:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): a hardware profile must be a mapping"])
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error, HardwareProfile)) from None
