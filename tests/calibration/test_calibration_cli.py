"""`calibrate` and `check-profile` end to end on the CPU (CI), and on CUDA where one exists."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import simcluster.profiler.bench.microbench as microbench
from simcluster.calibration.attention_fit import TABLES
from simcluster.calibration.records import Measurements
from simcluster.calibration.shapes import attention_grid
from simcluster.cli import app
from simcluster.config.choices import Recompute
from simcluster.config.hardware import load_hardware

runner = CliRunner()


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One quick CPU calibration shared by the tests below: (profile, raw measurements)."""
    folder = tmp_path_factory.mktemp("calibrate")
    profile, raw = folder / "cpu.yaml", folder / "microbench.json"
    result = runner.invoke(
        app,
        ["calibrate", "--device", "cpu", "--quick", "--out", str(profile), "--save-measurements", str(raw)],
    )
    assert result.exit_code == 0, result.output
    return profile, raw


def test_quick_cpu_calibration_writes_a_profile_that_loads(cpu_profile: tuple[Path, Path]) -> None:
    """The YAML validates, says it was measured, and keeps the base profile's network."""
    profile = load_hardware(str(cpu_profile[0]))
    assert profile.provenance.kind == "measured"
    assert profile.compute.gemm_points and profile.compute.elementwise_points
    sizes = [size for size, _ in profile.compute.elementwise_points]
    assert sizes == sorted(sizes)
    assert profile.network.measured == "datasheet"
    assert profile.calibration["network_from"] == "a100-sxm4-80gb-public"
    extra = profile.provenance.model_extra or {}
    assert extra["torch"] == torch.__version__ and extra["shapes"]
    # a CPU runs nothing ahead: its per-op framework cost is kernel_launch_us, no host term
    assert profile.compute.host_issue_us_per_op is None


def test_quick_cpu_profile_has_a_curve_per_kernel_kind(cpu_profile: tuple[Path, Path]) -> None:
    """Every element-wise kind of the layer (and the stand-in's two copies) gets its own
    bandwidth curve in the written YAML, sorted by bytes."""
    assert "\n  elementwise_points_by_op:\n" in cpu_profile[0].read_text()
    by_op = load_hardware(str(cpu_profile[0])).compute.elementwise_points_by_op
    forward = {"layernorm", "softmax", "dropout", "context_copy", "bias_gelu", "bias_dropout_add"}
    copies = {"standin_all_gather", "standin_reduce_scatter"}
    assert set(by_op) == forward | {f"{k}.bwd" for k in forward} | {"residual_grad_add"} | copies
    for points in by_op.values():
        sizes = [size for size, _ in points]
        assert sizes == sorted(sizes) and all(rate > 0 for _, rate in points)


def test_fitting_saved_measurements_gives_the_same_profile(
    cpu_profile: tuple[Path, Path], tmp_path: Path
) -> None:
    """`--measurements` (the bare-GPU-machine path) refits the saved JSON to the same tables."""
    refit = tmp_path / "refit.yaml"
    result = runner.invoke(
        app, ["calibrate", "--device", "cpu", "--measurements", str(cpu_profile[1]), "--out", str(refit)]
    )
    assert result.exit_code == 0, result.output
    first, second = load_hardware(str(cpu_profile[0])), load_hardware(str(refit))
    assert first.compute == second.compute and first.gpu == second.gpu


def test_check_profile_on_cpu_reports_the_error(cpu_profile: tuple[Path, Path], tmp_path: Path) -> None:
    """24 held-out runs (t × SP × recompute): CSV + markdown written, every row with its
    provenance and a finite error. Mechanics only: how close a CPU gets is measured by
    benchmarks/bench_calibration_cpu.py, never asserted (it depends on the CPU)."""
    result = runner.invoke(
        app, ["check-profile", str(cpu_profile[0]), "--device", "cpu", "--quick", "--out-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "median" in result.output
    with (tmp_path / "cpu-cpu.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 2 * 3
    assert {(r["tp"], r["sequence_parallel"], r["recompute"]) for r in rows} == {
        (str(t), str(sp), recompute.value)
        for t in (1, 2, 4, 8)
        for sp in (False, True)
        for recompute in Recompute
    }
    assert {r["torch_version"] for r in rows} == {torch.__version__}
    assert {r["profile"] for r in rows} == {"cpu"} and all(r["device_name"] and r["date"] for r in rows)
    for row in rows:
        measured, predicted = float(row["measured_total_ms"]), float(row["predicted_total_ms"])
        assert measured > 0 and predicted > 0 and float(row["measured_forward_ms"]) < measured
        assert math.isclose(float(row["total_error"]), predicted / measured - 1, abs_tol=1e-3)
    assert (tmp_path / "cpu-cpu.md").read_text().count("\n| paper eager | 96 |") == 24


def test_interrupted_calibration_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the middle of the benchmarks: no profile, no temporary file."""
    calls = []

    def interrupt(*args: object) -> tuple[float, float]:
        calls.append(args)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return 1e-3, 0.0

    monkeypatch.setattr(microbench, "_time_benchmark", interrupt)
    out = tmp_path / "never.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out)])
    assert result.exit_code != 0
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_no_file(
    cpu_profile: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C between writing the temporary file and renaming it: nothing is left."""

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("simcluster.calibration.profile.os.replace", interrupt)
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--device",
            "cpu",
            "--measurements",
            str(cpu_profile[1]),
            "--out",
            str(tmp_path / "x.yaml"),
        ],
    )
    assert result.exit_code != 0
    assert list(tmp_path.iterdir()) == []


def test_network_needs_two_gpus() -> None:
    """`--network` without two CUDA devices says so and exits 2 before measuring anything."""
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs")
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--network"])
    assert result.exit_code == 2
    assert "needs ≥ 2 GPUs" in result.output


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    """`--device cuda` on a machine without CUDA exits 2 with a hint."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = runner.invoke(app, ["calibrate", "--device", "cuda", "--quick"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quick_cuda_calibration_and_check(tmp_path: Path) -> None:
    """On a GPU: the quick grid calibrates, loads, and check-profile writes its report."""
    profile = tmp_path / "gpu.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "cuda", "--quick", "--out", str(profile)])
    assert result.exit_code == 0, result.output
    assert load_hardware(str(profile)).gpu.name == torch.cuda.get_device_name()
    result = runner.invoke(
        app, ["check-profile", str(profile), "--device", "cuda", "--quick", "--out-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "gpu-cuda.csv").exists()


def test_run_accepts_the_measured_profile_for_every_shipped_scenario(cpu_profile: tuple[Path, Path]) -> None:
    """`simcluster run scenarios/paper/ --hardware <measured profile>` simulates every scenario."""
    paper = Path(__file__).resolve().parents[2] / "scenarios" / "paper"
    result = runner.invoke(app, ["run", str(paper), "--hardware", str(cpu_profile[0])])
    assert result.exit_code == 0, result.output
    assert all(path.stem in result.output for path in paper.glob("*.yaml"))


def test_quick_cpu_profile_has_flash_attention_tables(cpu_profile: tuple[Path, Path]) -> None:
    """The SDPA grid of --quick fills the three flash tables: every length, sorted, positive,
    with the device, torch version and SDPA backend in their sources."""
    profile = load_hardware(str(cpu_profile[0]))
    c = profile.compute
    lengths = list(attention_grid("cpu", quick=True).seq_lengths)
    for table in (c.flash_attention_fwd_tflop_per_s, c.flash_attention_bwd_tflop_per_s):
        assert table is not None and [s for s, _ in table] == lengths and all(r > 0 for _, r in table)
    efficiency = c.flash_attention_causal_efficiency or []
    assert [s for s, _ in efficiency] == lengths and all(0 < r <= 1 for _, r in efficiency)
    source = c.sources["flash_attention_fwd_tflop_per_s"]
    assert f"torch {torch.__version__}" in source and profile.gpu.name in source
    assert "SDPA backend: " in source


def test_saved_measurements_keep_the_attention_records(
    cpu_profile: tuple[Path, Path], tmp_path: Path
) -> None:
    """--save-measurements writes one record per (length, mask); --measurements refits the
    same flash tables from them."""
    meas = Measurements.from_json(cpu_profile[1].read_text())
    grid = attention_grid("cpu", quick=True)
    assert {(r.seq_length, r.causal) for r in meas.attention} == {
        (s, causal) for s in grid.seq_lengths for causal in (False, True)
    }
    refit = tmp_path / "refit.yaml"
    result = runner.invoke(
        app, ["calibrate", "--device", "cpu", "--measurements", str(cpu_profile[1]), "--out", str(refit)]
    )
    assert result.exit_code == 0, result.output
    first, second = load_hardware(str(cpu_profile[0])).compute, load_hardware(str(refit)).compute
    assert first.flash_attention_fwd_tflop_per_s == second.flash_attention_fwd_tflop_per_s
    assert first.flash_attention_bwd_tflop_per_s == second.flash_attention_bwd_tflop_per_s
    assert first.flash_attention_causal_efficiency == second.flash_attention_causal_efficiency


def test_a_calibrated_cpu_profile_runs_a_flash_scenario(
    cpu_profile: tuple[Path, Path], tmp_path: Path
) -> None:
    """A tiny `attention_backend: flash` scenario naming the calibrated profile runs end to
    end with `--hwprofiles` (without flash tables it is refused)."""
    profile = load_hardware(str(cpu_profile[0]))
    folder = tmp_path / "profiles"
    folder.mkdir()
    shutil.copy(cpu_profile[0], folder / f"{profile.name}.yaml")
    scenario = tmp_path / "tiny-flash.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-flash",
                "hardware": profile.name,
                "model": {
                    "num_layers": 2,
                    "hidden_size": 128,
                    "num_attention_heads": 8,
                    "seq_length": 64,
                    "vocab_size": 256,
                },
                "parallel": {"tp": 2, "pp": 1},
                "training": {"micro_batch_size": 1, "global_batch_size": 2, "attention_backend": "flash"},
            }
        )
    )
    result = runner.invoke(app, ["run", str(scenario), "--hwprofiles", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["iteration_time_s"] > 0
    data = yaml.safe_load(cpu_profile[0].read_text())
    for key in TABLES:
        del data["compute"][key], data["compute"]["sources"][key]
    (folder / f"{profile.name}.yaml").write_text(yaml.safe_dump(data))
    refused = runner.invoke(app, ["run", str(scenario), "--hwprofiles", str(folder)])
    assert refused.exit_code != 0 and "flash" in refused.output
