"""calibration.moe_block: the torch MoE block measured on an H100 (docs/calibration/
h100-2026-11-27-script, host_graph.json `moe_cases`, followup.json `moe_sweep`) priced with the
simulator's op graph, host model and profile, and the host costs fitted from the sweep."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simcluster.calibration.moe_block import (
    DATA_DIR,
    BlockRun,
    HostFit,
    block_kernels,
    default_runs,
    fit_host,
    load_runs,
    main,
    predict,
    scenario_host,
)
from simcluster.config.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]
DECLARED_S = 42.3e-6  # h100-sxm5-80gb compute.host_issue_us_per_op


def _run(g: int, host_s: float, eager_s: float | None = None, t: int = 1024) -> BlockRun:
    return BlockRun("sweep", "moe_sweep", 2048, g, t, 768, 0, host_s if eager_s is None else eager_s, host_s)


@pytest.fixture(scope="module")
def runs() -> tuple[tuple[BlockRun, ...], tuple[BlockRun, ...]]:
    return default_runs()


def test_the_committed_files_hold_five_cases_and_eleven_sweep_runs(runs) -> None:
    """host_graph.json: the five shipped layouts; followup.json: G 1-32 at T 1024, 1-16 at 4096."""
    cases, sweep = runs
    assert [r.name for r in cases] == [
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "gpt-oss-120b",
        "deepseek-v3",
        "mixtral-8x7b",
    ]
    assert [(r.local_experts, r.tokens_per_expert) for r in sweep] == [
        (1, 1024), (2, 1024), (4, 1024), (8, 1024), (16, 1024), (32, 1024),
        (1, 4096), (2, 4096), (4, 4096), (8, 4096), (16, 4096),
    ]  # fmt: skip


def test_launches_of_the_block_follow_the_megatron_counts() -> None:
    """docs/moe_host.md's table at ep = tp = 1, BF16, unfused: G = 1 forward router 1, top-k
    3 + 6, preprocess 2 + copies 4 + permute 6, fc1 1, GLU 4, fc2 1, unpermute 2; backward
    unpermute 1, fc2 2, GLU 7, fc1 2, permute 5, top-k 5, router 1 + 2, the block input's
    gradient add 1 (router and permute read it): 50 other, 6 expert.
    G = 8 adds the per-expert copy, the chunk sorts (2 + 1 each way) and 6 launches per expert."""
    one, eight = block_kernels(_run(1, 1.0)), block_kernels(_run(8, 1.0))
    assert (one.other, one.expert) == (50, 6)
    assert (eight.other, eight.expert) == (50 + 1 + 6, 6 * 8)


def test_the_fit_recovers_known_costs_and_skips_gpu_bound_runs() -> None:
    """Runs built from 50 µs per other launch and 30 µs per expert launch give those back; a
    GPU-bound run (eager far above host) with a wrong host time is left out."""
    built = []
    for g in (1, 2, 8, 32):
        k = block_kernels(_run(g, 1.0))
        built.append(_run(g, k.other * 50e-6 + k.expert * 30e-6))
    fit = fit_host([*built, _run(4, 1.0, eager_s=9.0)])
    assert fit.per_op_s == pytest.approx(50e-6, rel=1e-9)
    assert fit.per_expert_launch_s == pytest.approx(30e-6, rel=1e-9)
    assert fit.per_local_expert_s == pytest.approx(6 * 30e-6)
    assert len(fit.runs) == 4 and max(abs(r) for r in fit.residuals) < 1e-9


def test_the_fit_needs_two_distinct_runs() -> None:
    with pytest.raises(ValueError, match="need two or more"):
        fit_host([_run(8, 5e-3), _run(8, 5.1e-3)])


def test_the_h100_sweep_fit_splits_the_declared_cost(runs) -> None:
    """On the committed sweep (8 host-bound runs): 56.3 µs per other launch, above the declared
    42.3, and 28.6 µs per expert GEMM launch, below it (172 µs per local expert); the fit is
    within 10 % of every T 1024 run."""
    fit = fit_host(runs[1])
    assert len(fit.runs) == 8
    assert fit.per_op_s == pytest.approx(56.3e-6, abs=0.1e-6)
    assert fit.per_expert_launch_s == pytest.approx(28.6e-6, abs=0.1e-6)
    assert fit.per_op_s > DECLARED_S > fit.per_expert_launch_s
    t1024 = [e for r, e in zip(fit.runs, fit.residuals) if r.tokens_per_expert == 1024]
    assert len(t1024) == 6 and max(abs(e) for e in t1024) < 0.10


def test_prediction_prices_launches_at_the_profile_cost_and_never_beats_host_or_gpu(runs) -> None:
    """declared: launches × 42.3 µs; the profile's: other launches × moe_host_us_per_op +
    expert launches × expert_gemm_host_us_per_launch (BF16: no casts; DeepSeek-V3's shared
    experts, TE linears outside the MoE block, stay at 42.3); the eager prediction (forward
    cut at its sync, then the backward's max) is at least the host's and the GPU's."""
    hw = load_hardware("h100-sxm5-80gb")
    other_s, expert_s = 56.3e-6, 28.6e-6  # the profile's keys
    for run in (*runs[0], *runs[1]):
        p = predict(run, hw)
        assert p.host_declared_s == pytest.approx((p.kernels.other + p.kernels.expert) * DECLARED_S)
        shared = 8 if run.shared_expert_ffn_hidden_size else 0  # fc1, fc2: 1 + 2 each, SwiGLU 1 + 1
        routed = (p.kernels.other - shared) * other_s + p.kernels.expert * expert_s
        assert p.host_s == pytest.approx(routed + shared * DECLARED_S)
        assert p.eager_s >= max(p.host_s, p.gpu_forward_s + p.gpu_backward_s) * (1 - 1e-12)


def test_the_h100_profile_holds_the_sweep_fit(runs) -> None:
    """compute.moe_host_us_per_op and expert_gemm_host_us_per_launch are this fit, rounded to
    0.1 µs (their source in hwprofiles/h100-sxm5-80gb.yaml names the command)."""
    compute, fit = load_hardware("h100-sxm5-80gb").compute, fit_host(runs[1])
    assert compute.moe_host_us_per_op == round(fit.per_op_s * 1e6, 1)
    assert compute.expert_gemm_host_us_per_launch == round(fit.per_expert_launch_s * 1e6, 1)


def test_device_price_grows_with_the_expert_flops(runs) -> None:
    """More local experts at the same T: more expert GEMM FLOPs, a longer priced GPU time, and
    at least the extra FLOPs (fc1 2f + fc2 f wide, forward + two backward GEMMs) at the GPU's
    bf16 peak more (no price may run the extra experts faster than the tensor cores can)."""
    hw = load_hardware("h100-sxm5-80gb")
    sweep = [r for r in runs[1] if r.tokens_per_expert == 1024]
    gpu = [predict(r, hw).gpu_forward_s + predict(r, hw).gpu_backward_s for r in sweep]
    first, last = sweep[0], sweep[-1]
    extra_experts = last.local_experts - first.local_experts
    extra_flops = 3 * 2 * extra_experts * 1024 * first.hidden_size * 3 * first.ffn_hidden_size
    assert gpu == sorted(gpu) and last.local_experts > first.local_experts
    assert gpu[-1] - gpu[0] >= extra_flops / (hw.gpu.peak_bf16_tflop_per_s * 1e12)


def test_load_runs_names_the_file_field_and_row(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"moe_sweep": [{"name": "x", "error": "CUDA out of memory"}]}))
    with pytest.raises(ValueError, match=r"f\.json: moe_sweep\[0\]: field\(s\) hidden_size"):
        load_runs(path, "moe_sweep")
    with pytest.raises(ValueError, match="no list 'moe_cases'"):
        load_runs(path, "moe_cases")


def test_what_if_at_the_declared_cost_is_the_declared_host(runs) -> None:
    """A fit equal to the declared cost prices the scenario's MoE layer as the simulator does;
    the measured fit moves only the MoE block's launches."""
    path = ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml"
    same = HostFit(DECLARED_S, DECLARED_S, 6, (), ())
    layer = scenario_host(path, same)
    assert layer.measured_split_s == pytest.approx(layer.declared_s)
    assert layer.declared_s == pytest.approx((layer.dense + layer.moe_other + layer.expert) * DECLARED_S)
    assert layer.expert == 48  # 8 local experts: 2 forward + 4 backward launches each
    fit = fit_host(runs[1])
    measured = scenario_host(path, fit)
    moved = layer.moe_other * (fit.per_op_s - DECLARED_S) + layer.expert * (
        fit.per_expert_launch_s - DECLARED_S
    )
    assert measured.measured_split_s - layer.declared_s == pytest.approx(moved)
    with pytest.raises(ValueError, match="no MoE layer"):
        scenario_host(ROOT / "benchmarks" / "public_runs" / "bridge25.11-llama3-8b-b200-fp8cs.yaml", fit)


def test_command_prints_json_and_fails_clearly(capsys, tmp_path: Path) -> None:
    assert main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 16 and out["fit"]["per_op_s"] > 0 and out["profile"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["--followup", str(bad)]) == 2
    assert "no list 'moe_sweep'" in capsys.readouterr().err


def test_data_dir_is_the_committed_folder() -> None:
    assert DATA_DIR == ROOT / "docs" / "calibration" / "h100-2026-11-27-script"
    assert replace(_run(1, 1.0), eager_s=1.06).host_bound is False
