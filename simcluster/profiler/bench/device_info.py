"""What a measurement ran on: device name, memory, SMs or cores, driver, CUDA, torch.

Recorded with every calibration and check so that a profile says where its numbers came
from (docs/hardware_profiles.md: "measured on which device, date, torch/CUDA versions").
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess

import torch

from simcluster.calibration.records import DeviceInfo


def describe_device(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        return _cuda_info(device)
    return DeviceInfo(
        device_type=device.type,
        name=_cpu_name(),
        memory_bytes=_host_memory_bytes(),
        num_sms=os.cpu_count() or 1,
        l2_cache_bytes=0,
        memory_clock_khz=0,
        memory_bus_width_bits=0,
        driver_version="n/a",
        cuda_version="n/a",
        torch_version=str(torch.__version__),
        num_threads=torch.get_num_threads(),
        platform=platform.platform(),
        date=datetime.date.today().isoformat(),
        host_cpu=_cpu_name(),
    )


def _cuda_info(device: torch.device) -> DeviceInfo:
    props = torch.cuda.get_device_properties(device)
    return DeviceInfo(
        device_type="cuda",
        name=props.name,
        memory_bytes=int(props.total_memory),
        num_sms=int(props.multi_processor_count),
        l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)),
        memory_clock_khz=int(getattr(props, "memory_clock_rate", 0)),
        memory_bus_width_bits=int(getattr(props, "memory_bus_width", 0)),
        driver_version=_nvidia_driver_version(),
        cuda_version=str(torch.version.cuda),
        torch_version=str(torch.__version__),
        num_threads=torch.get_num_threads(),
        platform=platform.platform(),
        date=datetime.date.today().isoformat(),
        host_cpu=_cpu_name(),
    )


def _nvidia_driver_version() -> str:
    """The NVIDIA driver (nvidia-smi), else the CUDA driver API version torch sees."""
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            return done.stdout.strip().splitlines()[0]
        except (subprocess.SubprocessError, OSError, IndexError):
            pass
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    return f"CUDA driver API {get()}" if get is not None else "unknown"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1


def cuda_device_count() -> int:
    """GPUs torch can use here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def release_cached_memory() -> None:
    """Return the caching allocator's free blocks to the driver (before NCCL allocates)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
