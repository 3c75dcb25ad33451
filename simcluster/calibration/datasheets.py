"""Datasheet peaks of the GPUs this project meets, matched by the name CUDA reports.

A calibrated profile measures how close kernels come to the peak; the peak itself is the
datasheet's (dense, no sparsity). A GPU not listed here gets its measured best GEMM as the
peak, declared as measured, and its bandwidth from the device's memory clock and bus width.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    """Dense 16-bit and fp32 peaks, HBM bandwidth, and where they are printed."""

    marker: str  # a substring of torch.cuda.get_device_name()
    peak_bf16_tflop_per_s: float
    peak_fp32_tflop_per_s: float
    memory_bandwidth_gb_per_s: float
    source: str


# More specific markers first: "H100 PCIe" before "H100".
DATASHEETS = (
    Datasheet("H100 PCIe", 756, 51, 2000, "NVIDIA H100 PCIe datasheet (dense BF16 756 TFLOP/s, 2.0 TB/s)"),
    Datasheet("H100 NVL", 835, 60, 3900, "NVIDIA H100 NVL datasheet (dense BF16 835 TFLOP/s, 3.9 TB/s)"),
    Datasheet("H100", 989, 67, 3350, "NVIDIA H100 SXM datasheet (dense BF16 989 TFLOP/s, 3.35 TB/s)"),
    Datasheet("H200", 989, 67, 4800, "NVIDIA H200 SXM datasheet (dense BF16 989 TFLOP/s, 4.8 TB/s)"),
    Datasheet("A100-SXM4-80GB", 312, 19.5, 2039, "NVIDIA A100 80GB SXM datasheet (312 TFLOP/s, 2,039 GB/s)"),
    Datasheet("A100-SXM4-40GB", 312, 19.5, 1555, "NVIDIA A100 40GB SXM datasheet (312 TFLOP/s, 1,555 GB/s)"),
)


def datasheet_for(device_name: str) -> Datasheet | None:
    for sheet in DATASHEETS:
        if sheet.marker in device_name:
            return sheet
    return None


def base_profile_for(device_type: str, device_name: str) -> str:
    """The shipped profile whose network section a calibrated profile starts from."""
    if device_type == "cuda" and ("H100" in device_name or "H200" in device_name):
        return "h100-sxm5-80gb"
    return "a100-sxm4-80gb-public"
