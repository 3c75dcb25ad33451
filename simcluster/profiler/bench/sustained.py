"""Sustained load: warm the GPU until its clock settles, keep it warm, read clock and power.

A training step is sustained load. On an H100 at its 700 W cap a dense GEMM runs 801 TFLOP/s
in its first burst after idle and 687 after 30 s, the SM clock falling to 1,350 MHz
(docs/calibration/h100-2026-11-26/README.md, finding 4b): a microbenchmark run from idle
measures the burst. So, with `--sustained`:

- `SustainedLoad.settle()` runs a heat GEMM (the Llama 3 8B fc1 shape, 8192 × 4096 × 28672,
  bf16, N(0, 1) data: the bit patterns set the power) in blocks of `block_calls`, until the
  median rate of the last `window` blocks differs from the `window` before by less than
  `tolerance` (1 %), after at least `min_s` and at most `max_s` seconds; it returns the log
  (blocks, seconds, first and last rates, whether it settled, clock and power).
- `SustainedLoad.maintain()`, called before each measurement, runs the heat GEMM again for
  `reheat_s` whenever `interval_s` have passed since it last ran, so short kernels do not
  let the GPU cool and clock up between them.
- `GpuSensors.read()` gives the SM clock (MHz) and board power (W) NVML reports for the last
  sample period (1/6 to 1 s): through `torch.cuda.clock_rate` / `power_draw` where the
  nvidia-ml-py package is installed, else through the driver's libnvidia-ml.so.1 by ctypes
  (the standard library), else (None, None), as on a CPU.

On a CPU the same code runs with a small GEMM and seconds-long bounds (a dry run).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from typing import Any

import torch

from simcluster.config.choices import LayerMode

NVML_CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM
HEAT_SHAPE = {"cuda": (8192, 4096, 28672)}  # m, k, n: Llama 3 8B fc1 at t 1
CPU_HEAT_SHAPE = (64, 64, 64)


class GpuSensors:
    """SM clock and power of one CUDA device via NVML; (None, None) where unavailable."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._nvml: Any = None
        self._handle: Any = None
        self._torch_ok = False
        if device.type == "cuda":
            self._torch_ok = self._try_torch()
            if not self._torch_ok:
                self._try_ctypes()

    def _try_torch(self) -> bool:
        try:
            torch.cuda.clock_rate(self.device)
            torch.cuda.power_draw(self.device)
            return True
        except Exception:  # no nvidia-ml-py, or NVML refused: fall back to ctypes
            return False

    def _try_ctypes(self) -> None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            handle = ctypes.c_void_p()
            index = self._nvml_index()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                return
            self._nvml, self._handle = lib, handle
        except (OSError, AttributeError):
            return

    def _nvml_index(self) -> int:
        """NVML counts all GPUs, CUDA the visible ones: map through torch where it can."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        mapper = getattr(torch.cuda, "_get_nvml_device_index", None)
        try:
            return int(mapper(index)) if mapper is not None else index
        except Exception:
            return index

    @property
    def available(self) -> bool:
        return self._torch_ok or self._nvml is not None

    def read(self) -> tuple[float | None, float | None]:
        """(SM clock MHz, power W) over NVML's last sample period, or (None, None)."""
        try:
            if self._torch_ok:
                return float(torch.cuda.clock_rate(self.device)), torch.cuda.power_draw(self.device) / 1e3
            if self._nvml is not None:
                clock, power = ctypes.c_uint(), ctypes.c_uint()
                ok = self._nvml.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(clock)) == 0
                ok = ok and self._nvml.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(power)) == 0
                return (float(clock.value), power.value / 1e3) if ok else (None, None)
        except Exception:  # a sensor read must never end a measurement
            return None, None
        return None, None


class SustainedLoad:
    """Bring the device to sustained load and keep it there (see the module docstring)."""

    def __init__(
        self,
        device: torch.device,
        min_s: float = 15.0,
        max_s: float = 60.0,
        tolerance: float = 0.01,
        window: int = 5,
        block_calls: int = 10,
        interval_s: float = 2.0,
        reheat_s: float = 0.3,
    ) -> None:
        self.device = device
        self.min_s, self.max_s, self.tolerance, self.window = min_s, max_s, tolerance, window
        self.block_calls, self.interval_s, self.reheat_s = block_calls, interval_s, reheat_s
        self.sensors = GpuSensors(device)
        m, k, n = HEAT_SHAPE.get(device.type, CPU_HEAT_SHAPE)
        gen = torch.Generator(device=device).manual_seed(1)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPUs: no fast bf16
        self._a = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
        self._b = torch.randn(k, n, generator=gen, device=device, dtype=dtype)
        self._flop = 2.0 * m * k * n
        self._last = -1e30

    @staticmethod
    def from_args(device: torch.device, args: argparse.Namespace) -> SustainedLoad | None:
        """The load `add_run_options`' flags ask for (None: burst, as before)."""
        return sustained_load(str(device), args.warmup_max_s) if args.sustained else None

    def _block_s(self) -> float:
        """Seconds per heat GEMM over one block (CUDA events on a GPU)."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.block_calls):
                torch.matmul(self._a, self._b)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / self.block_calls
        begin = time.perf_counter()
        for _ in range(self.block_calls):
            torch.matmul(self._a, self._b)
        return (time.perf_counter() - begin) / self.block_calls

    def settle(self) -> dict[str, Any]:
        """Run the heat GEMM until its rate settles (or `max_s`); the log of it."""
        rates: list[float] = []
        begin = time.perf_counter()
        settled = False
        while True:
            rates.append(self._flop / self._block_s())
            elapsed = time.perf_counter() - begin
            w = self.window
            if len(rates) >= 2 * w:
                last, before = statistics.median(rates[-w:]), statistics.median(rates[-2 * w : -w])
                settled = abs(last - before) / before < self.tolerance
                if settled and elapsed >= self.min_s:
                    break
            if elapsed >= self.max_s:
                break
        self._last = time.perf_counter()
        clock, power = self.sensors.read()
        tail = rates[-self.window :]
        return {
            "heat_gemm_mkn": list(HEAT_SHAPE.get(self.device.type, CPU_HEAT_SHAPE)),
            "seconds": round(time.perf_counter() - begin, 3),
            "blocks": len(rates),
            "first_tflop_per_s": float(f"{rates[0] / 1e12:.4g}"),
            "settled_tflop_per_s": float(f"{statistics.median(tail) / 1e12:.4g}"),
            "settled": settled,
            "tolerance": self.tolerance,
            "sm_clock_mhz": clock,
            "power_w": power,
            "interval_s": self.interval_s,
            "reheat_s": self.reheat_s,
        }

    def maintain(self) -> None:
        """Re-run the heat GEMM for `reheat_s` if `interval_s` passed since it last ran."""
        now = time.perf_counter()
        if now - self._last < self.interval_s:
            return
        while time.perf_counter() - now < self.reheat_s:
            self._block_s()
        self._last = time.perf_counter()


def sustained_load(device: str, max_s: float = 60.0) -> SustainedLoad:
    """The load on `device` ("cuda" or "cpu"): settle for 15 s to `max_s` on a GPU; on a CPU
    (a dry run) bounds of a second."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return SustainedLoad(dev, min_s=0.0, max_s=min(max_s, 1.0), interval_s=0.5, reheat_s=0.01)
    return SustainedLoad(dev, min_s=min(15.0, max_s), max_s=max_s)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--layer-mode, --sustained and --warmup-max-s for the bench entry points."""
    parser.add_argument(
        "--layer-mode",
        type=LayerMode,
        choices=list(LayerMode),
        default=None,
        help="eager or fused (torch.compile'd memory-bound regions); default fused on cuda, eager on cpu",
    )
    parser.add_argument(
        "--sustained", action="store_true", help="warm the GPU until its clock settles, keep it warm"
    )
    parser.add_argument("--warmup-max-s", type=float, default=60.0, help="bound on the settling loop")
