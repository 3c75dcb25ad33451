"""FLOPs formulas (Appendix A) and static / pipeline memory."""

import pytest

from simcluster.config.choices import Recompute
from simcluster.config.scenario import load_scenario
from simcluster.workload.flops import (
    LayerWidths,
    hardware_flops,
    model_flops,
    paper_hardware_flops,
    utilization,
)
from simcluster.workload.memory import first_stage_activation_bytes, interleave_factor
from simcluster.workload.model import build_workload, layer_params_per_rank
from tests.paths import ROOT


def test_paper_mfu_check_22b():
    """Korthikanti Eq. 7, Table 5's 22B row: 22B, 8 GPUs, B = 4, 1.10 s gives 41.7% MFU at 312 TFLOP/s."""
    flops = model_flops(B=4, s=2048, L=48, v=51200, widths=LayerWidths(6144, 4 * 6144))
    assert utilization(flops, 1.10, 8, 312e12) == pytest.approx(0.417, abs=0.001)


def test_hardware_flops_ratios():
    """Eq. 8 adds s/(6h) relative (Eq. 9); full is 4/3 of model FLOPs without logits."""
    widths = LayerWidths(12288, 4 * 12288)
    m = model_flops(64, 2048, 96, 0, widths)
    assert paper_hardware_flops(64, 2048, 96, 0, widths, Recompute.SELECTIVE) / m == pytest.approx(
        (1 + 2048 / (3 * 12288)) / (1 + 2048 / (6 * 12288))
    )
    assert hardware_flops(64, 2048, 96, 0, widths, Recompute.FULL) / m == pytest.approx(4 / 3)


def test_layer_params_are_12h2_plus_13h():
    """12h² + 13h parameters per layer (Narayanan Eq. 2) at t = 1."""
    assert layer_params_per_rank(1024, 4096, 1) == 12 * 1024**2 + 13 * 1024


def test_175b_parameter_count():
    """The 175B scenario's ranks hold ~175e9 parameters in total."""
    scenario = load_scenario(ROOT / "scenarios/paper/gpt3-175b-sp-selective.yaml")
    work = build_workload(scenario)
    shared_embedding = 51200 * 12288 / 8  # the last stage's tied copy
    total = sum(stage.num_params for stage in work.stages) * 8 - shared_embedding * 8
    assert total == pytest.approx(174.6e9, rel=0.01)


def test_interleave_factor():
    """1 + (p − 1)/(p·m) (§4.2.3); 1 without interleaving."""
    assert interleave_factor(8, 3) == pytest.approx(1 + 7 / 24)
    assert interleave_factor(8, 1) == 1.0
    assert first_stage_activation_bytes(10.0, 96, 8, 1, 64) == 960.0
    assert first_stage_activation_bytes(10.0, 96, 8, 1, 4) == 480.0
