"""The closed sets of choices a scenario can name. Shared by every layer of the package."""

from __future__ import annotations

import enum


class Recompute(str, enum.Enum):
    """Activation recomputation (Korthikanti et al. §5): none, selective (re-run the
    attention core in backward), or full (store only each layer's input, re-run the layer)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class ScheduleKind(str, enum.Enum):
    """Pipeline schedules. ONE_F_ONE_B becomes interleaved 1F1B when vpp > 1."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"


class Dtype(str, enum.Enum):
    """Activation / weight precision of the run."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def num_bytes(self) -> int:
        return 4 if self is Dtype.FP32 else 2
