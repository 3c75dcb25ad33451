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
from simcluster.config.errors import ConfigError, describe_validation_error
from simcluster.config.files import read_yaml
from simcluster.config.profiles import find_profile
from simcluster.config.profiles import known_profiles as known_profiles  # re-exported
from simcluster.config.profiles import profiles_dir as profiles_dir  # re-exported


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


class ComputeModel(_Section):
    """How kernels reach (or miss) the peak: see `simcluster.costs.compute`."""

    gemm_max_efficiency: float = Field(gt=0, le=1)
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
        min_length=1, description="(message MB, measured all-reduce busbw GB/s) in one node"
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

    # SI views, converted once here.
    def peak_flop_per_s(self, dtype: Dtype = Dtype.BF16) -> float:
        tflop = self.gpu.peak_fp32_tflop_per_s if dtype is Dtype.FP32 else self.gpu.peak_bf16_tflop_per_s
        return units.tflop_per_s_to_flop_per_s(tflop)

    @property
    def memory_bytes(self) -> float:
        return units.gb_to_bytes(self.gpu.memory_gb)

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
        raise ConfigError(source, describe_validation_error(error)) from None
