"""Modern-GPU profile fields: FP8 peaks, driver-reported capacity and its reserve, NVLink
domains larger than a node, separate all-reduce and all-gather busbw tables."""

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.hardware import known_profiles, load_hardware, parse_hardware, profiles_dir

MODERN = ["h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72"]
MIB = 1024**2
SOURCED_TABLES = {"network": ["nvlink_allreduce_busbw", "nvlink_allgather_busbw"]}


def _data(stem: str) -> dict:
    return yaml.safe_load((profiles_dir() / f"{stem}.yaml").read_text())


@pytest.mark.parametrize("stem", MODERN)
def test_modern_profiles_load_with_fp8_and_capacity(stem):
    """Each new profile loads, has FP8 tensor cores at twice the BF16 peak, an FP8 GEMM
    ceiling, and a driver-reported capacity with a reserve below it."""
    hw = load_hardware(stem)
    assert stem in known_profiles()
    assert hw.peak_fp8_flop_per_s == pytest.approx(2 * hw.peak_flop_per_s(), rel=1e-3)  # 1979 vs 2·989
    assert 0 < hw.compute.fp8_gemm_max_efficiency < 1
    assert hw.gpu.memory_capacity_mib is not None
    assert hw.memory_reserved_bytes > 0
    assert 0 < hw.usable_memory_bytes < hw.memory_capacity_bytes


@pytest.mark.parametrize("stem", known_profiles())
def test_every_number_and_table_has_a_source(stem):
    """The loader enforces a source per number; the busbw tables (lists) need one too, and
    every new optional number that is set has its own entry."""
    data = _data(stem)
    for section, keys in SOURCED_TABLES.items():
        for key in keys:
            if key in data[section]:
                assert key in data[section]["sources"], f"{stem}: {section}.{key} has no source"
    for section in ("gpu", "compute", "network"):
        for key, value in data[section].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert data[section]["sources"].get(key, "").strip(), f"{stem}: {section}.{key}"


def test_a100_has_no_fp8_and_its_memory_columns_do_not_move():
    """A100: no FP8 peak (a later change rejects fp8 there); the datasheet's `memory_bytes` is
    80 × 10⁹; the driver's 81,920 MiB less the reserve is what `fits` compares with."""
    a100 = load_hardware("a100-sxm4-80gb")
    assert a100.peak_fp8_flop_per_s is None
    assert a100.memory_bytes == 80e9
    assert a100.memory_capacity_bytes == 81920 * MIB
    assert a100.usable_memory_bytes == (81920 - 400 - 1011) * MIB


def test_usable_memory_is_capacity_minus_context_and_nccl():
    """H100: 81,559 MiB (nvidia-smi) − 400 MiB context − 1,011 MiB NCCL = 80,148 MiB."""
    h100 = load_hardware("h100-sxm5-80gb")
    assert h100.memory_capacity_bytes == 81559 * MIB
    assert h100.memory_reserved_bytes == 1411 * MIB
    assert h100.usable_memory_bytes == 80148 * MIB
    assert load_hardware("h200-sxm-141gb").usable_memory_bytes == (143771 - 1411) * MIB


def test_without_capacity_the_datasheet_figure_is_used():
    """A profile that names no capacity or reserve: capacity = memory_gb, nothing reserved."""
    data = _data("a100-sxm4-80gb-public")
    for key in ("memory_capacity_mib", "cuda_context_mib", "nccl_buffers_mib"):
        del data["gpu"][key]
    hw = parse_hardware(data, "edited.yaml")
    assert hw.memory_capacity_bytes == hw.usable_memory_bytes == 80e9


def test_nvlink_domain_defaults_to_the_node_and_must_hold_whole_nodes():
    """8-GPU nodes are their own domain; NVL72 is 72 GPUs over 4-GPU trays; 70 is rejected."""
    assert load_hardware("h100-sxm5-80gb").nvlink_domain_size == 8
    gb200 = load_hardware("gb200-nvl72")
    assert (gb200.network.gpus_per_node, gb200.nvlink_domain_size) == (4, 72)
    data = _data("gb200-nvl72")
    data["network"]["nvlink_domain_size"] = 70
    with pytest.raises(ConfigError, match="multiple of gpus_per_node"):
        parse_hardware(data, "edited.yaml")


def test_fp8_ceiling_without_fp8_peak_is_rejected():
    data = _data("h100-sxm5-80gb")
    del data["gpu"]["peak_fp8_tflop_per_s"]
    del data["gpu"]["sources"]["peak_fp8_tflop_per_s"]
    with pytest.raises(ConfigError, match="needs gpu.peak_fp8_tflop_per_s"):
        parse_hardware(data, "edited.yaml")


def test_a_new_number_without_source_is_rejected():
    data = _data("gb200-nvl72")
    del data["network"]["sources"]["nvlink_domain_size"]
    with pytest.raises(ConfigError, match="nvlink_domain_size"):
        parse_hardware(data, "edited.yaml")
