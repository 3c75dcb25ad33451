"""Results as data: the numbers a run produces, and their JSON form (a public contract).

The core (`simulation`, `memory_plan`) builds them; `report`, `sweep` and the CLI only read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of one pipeline stage's most loaded rank (bytes)."""

    stage: int
    weight_bytes: float
    gradient_bytes: float
    optimizer_bytes: float
    activation_bytes: float  # peak activations stored for backward
    transient_bytes: float  # recomputed activations alive during one backward
    peak_memory_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One transformer layer on one rank, one microbatch (Table 4's quantities)."""

    forward_s: float
    backward_s: float  # includes recompute

    @property
    def combined_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True, slots=True)
class SimulationResult:
    scenario: str
    hardware: str
    num_gpus: int
    iteration_time_s: float
    model_flops: float
    hardware_flops: float
    mfu: float
    hfu: float
    tflops_per_gpu: float
    bubble_fraction: float
    time_breakdown_s: dict[str, float]  # keyed by `engine.plan.TimeCategory` values, in its order
    stages: tuple[StageMemory, ...]
    layer: LayerTimes
    num_events: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    paper_hardware_flops: float = 0.0  # Korthikanti Eq. 8 for selective (Table 5's HFU column)
    paper_hfu: float = 0.0
    tokens_per_s_per_gpu: float = 0.0  # global_batch_size · seq_length / iteration time / GPUs
    # MFU's denominator per GPU: the dense 16-bit tensor-core peak (the fp32 peak for fp32
    # runs), for FP8 runs too, so that MFU compares with a BF16 run of the same GPU; an FP8
    # run's MFU of the FP8 peak is `fp8_peak_mfu`.
    mfu_peak_flop_per_s: float = 0.0
    mfu_peak_dtype: str = ""
    fp8_peak_flop_per_s: float | None = None  # set for FP8 runs: the dense FP8 peak
    fp4_peak_flop_per_s: float | None = None  # set for FP4 (NVFP4) runs: the dense FP4 peak
    # Where the time goes (`costs.breakdown.TimeKind` values, in its order): the mean stage's
    # iteration (sums to iteration_time_s) and one layer's forward + backward per microbatch
    # (sums to layer.combined_s).
    time_by_kind_s: dict[str, float] = field(default_factory=dict)
    layer_time_by_kind_s: dict[str, float] = field(default_factory=dict)
    # the host's issue seconds over the GPU's for one microbatch's forward + backward of the
    # chunk where that is largest (`costs.stage_pricing.host_issue_share`): >= 1 host-bound,
    # near 1 sensitive to the host CPU; None where the profile does not price the host
    host_issue_share: float | None = None

    @property
    def fp8_peak_mfu(self) -> float | None:
        """An FP8 run's MFU of the FP8 dense peak (half its MFU of the BF16 peak on Hopper);
        None for other runs."""
        if not self.fp8_peak_flop_per_s or not self.mfu_peak_flop_per_s:
            return None
        return self.mfu * self.mfu_peak_flop_per_s / self.fp8_peak_flop_per_s

    @property
    def fp4_peak_mfu(self) -> float | None:
        """An FP4 run's MFU of the FP4 dense peak (its MFU of the BF16 peak passes 100 % on
        Blackwell, whose FP4 peak is 6x its BF16 one); None for other runs."""
        if not self.fp4_peak_flop_per_s or not self.mfu_peak_flop_per_s:
            return None
        return self.mfu * self.mfu_peak_flop_per_s / self.fp4_peak_flop_per_s

    @property
    def fullest_stage(self) -> StageMemory:
        """The stage with the highest peak (the first of equals)."""
        return max(self.stages, key=lambda stage: stage.peak_memory_bytes)

    @property
    def stages_not_fitting(self) -> tuple[int, ...]:
        return tuple(stage.stage for stage in self.stages if not stage.fits)

    @property
    def fits_in_memory(self) -> bool:
        return all(stage.fits for stage in self.stages)

    @property
    def bubble_to_busy_ratio(self) -> float:
        """Pipeline idle stage-time over busy stage-time until the last backward ends:
        Narayanan et al. 2021's "bubble time fraction" t_pb / t_id, (p − 1)/(m·v) for
        uniform tasks. A ratio, not a share: 7.0 for p = 8, m = 1 (`bubble_fraction` is
        the same number under its first, misleading name)."""
        return self.bubble_fraction

    @property
    def pipeline_idle_fraction(self) -> float:
        """Share of the stages' time until the last backward spent idle (in [0, 1)):
        idle / (idle + busy) = r / (1 + r) for r = `bubble_to_busy_ratio`."""
        ratio = self.bubble_fraction
        return ratio / (1 + ratio)

    def to_json_dict(self) -> dict[str, Any]:
        """The `simcluster run --json` object. Keys are a public contract: add, never rename."""
        return {
            "scenario": self.scenario,
            "hardware": self.hardware,
            "iteration_time_s": self.iteration_time_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "bubble_fraction": self.bubble_fraction,
            "bubble_to_busy_ratio": self.bubble_to_busy_ratio,
            "pipeline_idle_fraction": self.pipeline_idle_fraction,
            "num_gpus": self.num_gpus,
            "fits_in_memory": self.fits_in_memory,
            "time_breakdown_s": dict(self.time_breakdown_s),
            "stages": [{**asdict(stage), "fits": stage.fits} for stage in self.stages],
            "layer_forward_s": self.layer.forward_s,
            "layer_backward_s": self.layer.backward_s,
            "num_events": self.num_events,
            "paper_hardware_flops": self.paper_hardware_flops,
            "paper_hfu": self.paper_hfu,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu_peak_dtype": self.mfu_peak_dtype or None,
            "mfu_peak_flop_per_s": self.mfu_peak_flop_per_s or None,
            "fp8_peak_flop_per_s": self.fp8_peak_flop_per_s,
            "fp8_peak_mfu": self.fp8_peak_mfu,
            "fp4_peak_flop_per_s": self.fp4_peak_flop_per_s,
            "fp4_peak_mfu": self.fp4_peak_mfu,
            "fullest_stage": self.fullest_stage.stage,
            "max_stage_peak_memory_bytes": self.fullest_stage.peak_memory_bytes,
            "stages_not_fitting": list(self.stages_not_fitting),
            "time_by_kind_s": dict(self.time_by_kind_s),
            "layer_time_by_kind_s": dict(self.layer_time_by_kind_s),
            "host_issue_share": self.host_issue_share,
            **self.extras,
        }
