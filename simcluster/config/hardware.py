"""Hardware profiles: one YAML file per GPU system under `hwprofiles/`, referred to by stem.

Files use human units (`_tflop_per_s`, `_gb_per_s`, `_gbit_per_s`, `_us`, `_gb`); this module
converts them once, into the SI properties the cost model reads. Every number in a profile
must carry a source (a `sources:` entry with the same key in its section) so a reader can
tell a datasheet value from a measurement from a fitted constant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simcluster import units
from simcluster.config.choices import Dtype
from simcluster.config.errors import ConfigError, describe_validation_error
from simcluster.config.files import read_yaml

PROFILE_SUFFIX = ".yaml"


class _Section(BaseModel):
    """A profile section whose every numeric field must have a `sources` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)
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


class GemmPoint(BaseModel):
    """One measured GEMM: (batch × M × N × K) at an achieved rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    batch: int = Field(default=1, gt=0)
    tflop_per_s: float = Field(gt=0)


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
    memory_capacity_mib: float | None = Field(
        default=None, gt=0, description="device memory as the driver reports it (nvidia-smi memory.total)"
    )
    cuda_context_mib: float | None = Field(default=None, ge=0, description="held by the CUDA context")
    nccl_buffers_mib: float | None = Field(default=None, ge=0, description="held by NCCL communicators")


class ComputeModel(_Section):
    """How kernels reach (or miss) the peak: see `simcluster.costs.compute`."""

    gemm_max_efficiency: float = Field(gt=0, le=1)
    fp8_gemm_max_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="large FP8 GEMM ceiling as a fraction of the FP8 peak"
    )
    memory_bound_efficiency: float = Field(gt=0, le=1)
    kernel_launch_us: float = Field(ge=0)
    gemm_tiles: list[tuple[int, int, float]] = Field(
        default=[(256, 128, 1.0), (128, 128, 0.95), (128, 64, 0.85), (64, 64, 0.7)],
        description="candidate CTA tiles (M, N, relative efficiency) for wave quantization",
    )
    gemm_points: list[GemmPoint] = Field(
        default_factory=list,
        description="measured GEMMs; when present they override the analytical efficiency",
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
    def _domain_holds_whole_nodes(self) -> NetworkModel:
        domain = self.nvlink_domain_size
        if domain is not None and domain % self.gpus_per_node:
            raise ValueError(
                f"nvlink_domain_size {domain} must be a multiple of gpus_per_node {self.gpus_per_node}"
            )
        return self


class Provenance(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    kind: Literal["datasheet", "public-measurements", "measured", "fitted"]
    summary: str


class HardwareProfile(BaseModel):
    """A GPU system: one GPU's compute model and the node / cluster network."""

    model_config = ConfigDict(extra="forbid", frozen=True)
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
        return self

    # SI views, converted once here.
    def peak_flop_per_s(self, dtype: Dtype = Dtype.BF16) -> float:
        tflop = self.gpu.peak_fp32_tflop_per_s if dtype is Dtype.FP32 else self.gpu.peak_bf16_tflop_per_s
        return units.tflop_per_s_to_flop_per_s(tflop)

    @property
    def memory_bytes(self) -> float:
        return units.gb_to_bytes(self.gpu.memory_gb)

    @property
    def peak_fp8_flop_per_s(self) -> float | None:
        """Dense FP8 tensor-core peak; None on a GPU without FP8 tensor cores (A100)."""
        tflop = self.gpu.peak_fp8_tflop_per_s
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
        """Capacity left to the framework: driver-reported capacity minus the reserve. (Today's
        `fits` and memory columns still use `memory_bytes`.)"""
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


def profiles_dir() -> Path:
    """`hwprofiles/` at the repository root (beside the package)."""
    return Path(__file__).resolve().parents[2] / "hwprofiles"


def known_profiles(directory: Path | None = None) -> list[str]:
    directory = directory or profiles_dir()
    return sorted(path.stem for path in directory.glob(f"*{PROFILE_SUFFIX}"))


def resolve_profile_path(reference: str, relative_to: Path | None = None) -> Path:
    """A profile stem in `hwprofiles/`, or a path (absolute, or relative to a scenario file)."""
    candidates = [profiles_dir() / f"{reference}{PROFILE_SUFFIX}"]
    as_path = Path(reference)
    if as_path.suffix in (".yaml", ".yml"):
        candidates.insert(0, as_path if as_path.is_absolute() else (relative_to or Path.cwd()) / as_path)
        candidates.append(Path.cwd() / as_path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(reference)


def load_hardware(
    reference: str, relative_to: Path | None = None, field: str = "hardware"
) -> HardwareProfile:
    try:
        path = resolve_profile_path(reference, relative_to)
    except FileNotFoundError:
        known = ", ".join(known_profiles()) or "(none found)"
        raise ConfigError(
            relative_to or reference,
            [
                f"{field}: value {reference!r}: unknown hardware profile; known profiles: {known} "
                "(or give a path to a .yaml profile)"
            ],
        ) from None
    return parse_hardware(read_yaml(path), path)


def parse_hardware(data: Any, source: str | Path) -> HardwareProfile:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): a hardware profile must be a mapping"])
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error)) from None
