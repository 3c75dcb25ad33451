"""The Blackwell Ultra profiles (issue 19): B300 SXM and GB300 NVL72, in the form of the
B200 / GB200 ones, with the H100 lessons carried as declared assumptions, and the capability
fields that say which profiles run NVFP4 and FP8 block scaling."""

import pytest

from simcluster.config.files import read_yaml
from simcluster.config.hardware import load_hardware
from tests.h100_measured import h100_measured
from tests.paths import ROOT

ULTRA = ["b300-sxm-288gb", "gb300-nvl72"]
RATIOS = h100_measured.sustained_ratios()
H100_KINDS = load_hardware("h100-sxm5-80gb").compute.memory_bound_efficiency_by_kind


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _sources(stem: str, section: str) -> dict:
    return read_yaml(ROOT / "hwprofiles" / f"{stem}.yaml")[section]["sources"]


def test_b300_datasheet_numbers():
    """DGX B300: dense BF16 / FP8 as B200 (2250 / 4500), FP4 raised (HGX B300 105 PF / 8),
    288 GB HBM3e at 8 TB/s, driver total 275,040 MiB, 8 GPUs and 8 ConnectX-8 at 800 Gb/s."""
    hw = load_hardware("b300-sxm-288gb")
    b200 = load_hardware("b200-sxm-180gb")
    assert (hw.gpu.peak_bf16_tflop_per_s, hw.gpu.peak_fp8_tflop_per_s) == (2250, 4500)
    assert hw.gpu.peak_fp8_tflop_per_s == b200.gpu.peak_fp8_tflop_per_s
    assert hw.gpu.peak_fp4_tflop_per_s == 105_000 / 8
    assert (hw.gpu.memory_gb, hw.gpu.memory_capacity_mib, hw.gpu.memory_bandwidth_gb_per_s) == (
        288,
        275040,
        8000,
    )
    assert (hw.network.gpus_per_node, hw.nvlink_domain_size, hw.network.nics_per_node) == (8, 8, 8)
    assert hw.network.nic_bandwidth_gbit_per_s == 800


def test_gb300_is_a_72_gpu_nvlink_domain_of_4_gpu_trays():
    """GB300 NVL72: 2500 / 5000 / 15000 dense per GPU, 284,208 MiB, one CX-8 per GPU, the
    rack one NVLink domain as gb200-nvl72."""
    hw = load_hardware("gb300-nvl72")
    gb200 = load_hardware("gb200-nvl72")
    gpu = hw.gpu
    assert (gpu.peak_bf16_tflop_per_s, gpu.peak_fp8_tflop_per_s, gpu.peak_fp4_tflop_per_s) == (
        2500,
        5000,
        15000,
    )
    assert gpu.memory_capacity_mib == 284208
    assert (hw.network.gpus_per_node, hw.nvlink_domain_size) == (4, 72)
    assert hw.network.nics_per_node == hw.network.gpus_per_node
    # Azure ND GB300 v6's 4-GPU ring sweep up to 256 MiB, GB200's 72-GPU NVLS sweep above
    assert dict(hw.network.nvlink_allreduce_busbw)[268.435456] == 593.70
    assert hw.network.nvlink_allreduce_busbw[-5:] == gb200.network.nvlink_allreduce_busbw[-5:]


@pytest.mark.parametrize("stem", ULTRA)
def test_fp4_peak_is_above_fp8_and_fp8_is_not(stem):
    """Blackwell Ultra raised dense FP4 only: FP8 stays at twice BF16, FP4 is 2.9-3× FP8."""
    hw = load_hardware(stem)
    assert hw.peak_fp8_flop_per_s == pytest.approx(2 * hw.peak_flop_per_s())
    assert 2.9 < hw.peak_fp4_flop_per_s / hw.peak_fp8_flop_per_s <= 3.0


def test_b300_ceilings_are_its_mamf_times_the_h100_sustained_ratios():
    """MAMF on B300: BF16 1769.0 / 2250, FP8 3353.3 / 4500 (ml-engineering), each × the H100's
    sustained / burst ratio."""
    compute = load_hardware("b300-sxm-288gb").compute
    assert compute.gemm_max_efficiency == _sig(1769.0 / 2250 * RATIOS["mamf_bf16"])
    assert compute.fp8_gemm_max_efficiency == _sig(3353.3 / 4500 * RATIOS["mamf_fp8"])


def test_gb300_fp8_gemms_are_azures_sweep_and_bf16_gains_what_fp8_gains():
    """Azure ND GB300 v6 cuBLASLt FP8: 3286.3 TFLOP/s at 8192³, × the H100's 0.9324; BF16 is
    GB200's × 1.144, GB300's measured FP8 gain over GB200 in the same sweep (shapes >= 4096)."""
    compute = load_hardware("gb300-nvl72").compute
    gb200 = load_hardware("gb200-nvl72").compute
    cube = next(p for p in compute.fp8_gemm_points if p.m == p.n == p.k == 8192)
    assert cube.tflop_per_s == pytest.approx(3286.3 * RATIOS["cublaslt_fp8"], abs=0.06)
    gb300_burst = {4096: 3257.0, 8192: 3286.3, 16384: 3308.5, 32768: 3271.3}
    gains = [
        gb300_burst[p.m] / (p.tflop_per_s / RATIOS["cublaslt_fp8"])
        for p in gb200.fp8_gemm_points
        if p.m == p.n == p.k and p.m in gb300_burst
    ]
    assert 1.13 < min(gains) and max(gains) < 1.16
    bf16 = {(p.m, p.n, p.k): p.tflop_per_s for p in compute.gemm_points}
    for point in gb200.gemm_points:
        assert bf16[(point.m, point.n, point.k)] == pytest.approx(point.tflop_per_s * 1.144, abs=0.06)
    assert compute.gemm_max_efficiency == _sig(1822.0 * 1.144 / 2500 * RATIOS["mamf_bf16"])
    assert compute.fp8_gemm_max_efficiency == pytest.approx(3308.5 * RATIOS["cublaslt_fp8"] / 5000, abs=5e-4)


def test_b300_measured_gemm_points_are_the_te_tutorial_times_the_sustained_ratio():
    """TE gemm_profiling.rst on a B300: QKV 15872×4096×12288 BF16 in 1.071 ms."""
    points = load_hardware("b300-sxm-288gb").compute.gemm_points
    qkv = next(p for p in points if (p.m, p.n, p.k) == (15872, 12288, 4096))
    measured_tflop_per_s = 2 * 15872 * 4096 * 12288 / 1.071e-3 / 1e12
    assert qkv.tflop_per_s == pytest.approx(measured_tflop_per_s * RATIOS["mamf_bf16"], abs=0.1)


@pytest.mark.parametrize("stem", ULTRA)
def test_kernel_ratios_are_the_b300_tutorial_times(stem):
    """Kernel-only per-layer times on a B300: FP8 current 6.812, MXFP8 7.161, NVFP4 3.764 ms;
    block scaling runs as MXFP8 on Blackwell."""
    compute = load_hardware(stem).compute
    assert compute.mxfp8_gemm_rate_ratio == round(6.812 / 7.161, 3)
    assert compute.nvfp4_gemm_rate_ratio == round(6.812 / 3.764, 2)
    assert compute.fp8_block_scaling and compute.fp8_block_gemm_rate_ratio == compute.mxfp8_gemm_rate_ratio


@pytest.mark.parametrize("stem", ULTRA)
def test_h100_lessons_are_carried_and_declared(stem):
    hw = load_hardware(stem)
    assert hw.compute.memory_bound_efficiency_by_kind == H100_KINDS
    sources = _sources(stem, "compute")
    for key in ("gemm_max_efficiency", "fp8_gemm_max_efficiency", "memory_bound_efficiency_by_kind"):
        assert sources[key].startswith("ASSUMED"), key
        assert "h100" in sources[key].lower(), key


@pytest.mark.parametrize(
    "stem", ["h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72", *ULTRA]
)
def test_fp8_block_scaling_where_te_has_the_kernels(stem):
    """TE `_compute_fp8_block_scaling_support`: compute capability 9.0+ (Hopper natively,
    Blackwell through MXFP8)."""
    hw = load_hardware(stem)
    assert hw.compute.fp8_block_scaling
    assert 0 < hw.compute.fp8_block_gemm_rate_ratio < 1


@pytest.mark.parametrize(
    "stem", ["a100-sxm4-80gb", "a100-sxm4-80gb-public", "h100-sxm5-80gb", "h200-sxm-141gb"]
)
def test_no_fp4_peak_before_blackwell(stem):
    """A100 and Hopper have no FP4 tensor cores: their profiles state no FP4 peak."""
    assert load_hardware(stem).peak_fp4_flop_per_s is None


@pytest.mark.parametrize("stem", ["b200-sxm-180gb", "gb200-nvl72"])
def test_blackwell_nvfp4_ratio_is_derived_from_the_b200_nvfp4_matmuls(stem):
    """B200 / GB200: FP4 = 2 × FP8 peak; pytorch/ao #2427 on a B200 ran NVFP4 3.78× its BF16
    matmul at 8192³ (5.37e15 / 1.42e15), where the B200 profile's FP8 runs 2546.0 / 1229.0 of
    its BF16: NVFP4 / FP8 = 1.83 (GB200: the same die, assumed)."""
    hw = load_hardware(stem)
    b200 = load_hardware("b200-sxm-180gb").compute
    fp8 = next(p.tflop_per_s for p in b200.fp8_gemm_points if p.m == p.n == p.k == 8192)
    bf16 = next(p.tflop_per_s for p in b200.gemm_points if p.m == p.n == p.k == 8192)
    assert hw.peak_fp4_flop_per_s == 2 * hw.peak_fp8_flop_per_s
    assert hw.compute.nvfp4_gemm_rate_ratio == round((5.37 / 1.42) / (fp8 / bf16), 2)
    assert _sources(stem, "compute")["nvfp4_gemm_rate_ratio"].startswith("DERIVED")


def test_fp4_peak_without_an_fp8_ceiling_is_rejected():
    from simcluster.config import ConfigError
    from simcluster.config.hardware import parse_hardware

    data = read_yaml(ROOT / "hwprofiles" / "b300-sxm-288gb.yaml")
    del data["compute"]["fp8_gemm_max_efficiency"], data["compute"]["fp8_gemm_points"]
    with pytest.raises(ConfigError, match="peak_fp4_tflop_per_s needs compute.fp8_gemm_max_efficiency"):
        parse_hardware(data, "x.yaml")


def test_gb300_llama31_405b_scenario_is_the_published_nvfp4_recipe():
    """Megatron-Bridge llama31_405b_pretrain_256gpu_gb300_nvfp4_config: 256 GPUs, TP 4, PP 8,
    CP 1, VP 4, GBS 1536, MBS 1, seq 8192, NVFP4 with FP4 parameters; (126 + 2) layers over 32
    chunks; it fits and runs."""
    from simcluster.config.scenario import load_scenario_and_hardware
    from simcluster.simulation import run_simulation

    scenario, hw = load_scenario_and_hardware(
        ROOT / "scenarios" / "blackwell" / "llama31-405b-gb300-nvfp4.yaml"
    )
    par, tr = scenario.parallel, scenario.training
    assert (scenario.num_gpus, par.tp, par.pp, par.cp, par.vpp) == (256, 4, 8, 1, 4)
    assert (tr.global_batch_size, tr.micro_batch_size, scenario.model.seq_length) == (1536, 1, 8192)
    assert tr.dtype.value == "fp4" and tr.fp4_param_gather and not tr.tp_comm_overlap
    assert (scenario.model.num_layers + 2) % (par.pp * par.vpp) == 0
    assert hw.name == "gb300-nvl72"
    assert run_simulation(scenario, hw).result.fits_in_memory
