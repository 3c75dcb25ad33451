"""Numbers that do not mislead at first glance (issue 17 §5): times in the unit that reads,
every stage that does not fit shown, MFU with its denominator named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.report.tables import format_duration, format_result, format_summary, stage_ranges
from simcluster.results import LayerTimes, SimulationResult, StageMemory

ROOT = Path(__file__).resolve().parents[2]
GB = 1e9
runner = CliRunner()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (4.61651, "4.617 s"),
        (13.0, "13.000 s"),
        (0.5, "500.0 ms"),
        (0.012345, "12.35 ms"),  # four significant digits below a second
        (0.0012345, "1.234 ms"),  # 1.2345 ms: float rounding gives 1.234
        (8.52e-5, "85.20 µs"),
        (4e-7, "0.400 µs"),  # below a microsecond stays in µs
        (0.99996, "1.000 s"),  # rounds up into the next unit, not "1000.0 ms"
        (0.00099996, "1.000 ms"),
        (0.0, "0 s"),
    ],
)
def test_format_duration_picks_the_unit_per_value(seconds, shown):
    assert format_duration(seconds) == shown


def test_stage_ranges_collapse_neighbours():
    assert stage_ranges([1, 2, 3, 7, 9, 10]) == "1–3, 7, 9–10"
    assert stage_ranges([4]) == "4"


def _stage(index: int, activation_gb: float, capacity_gb: float = 84.0) -> StageMemory:
    static = (6.4, 12.8, 0.3)
    return StageMemory(
        stage=index,
        weight_bytes=static[0] * GB,
        gradient_bytes=static[1] * GB,
        optimizer_bytes=static[2] * GB,
        activation_bytes=activation_gb * GB,
        transient_bytes=0.0,
        peak_memory_bytes=(sum(static) + activation_gb) * GB,
        capacity_bytes=capacity_gb * GB,
    )


def _result(stages: list[StageMemory], **changes) -> SimulationResult:
    result = SimulationResult(
        scenario="pp16",
        hardware="gpu",
        num_gpus=128,
        iteration_time_s=4.68,
        model_flops=1.0,
        hardware_flops=1.0,
        mfu=0.5,
        hfu=0.5,
        tflops_per_gpu=1.0,
        bubble_fraction=0.1,
        time_breakdown_s={"compute": 4.0, "idle": 0.68},
        stages=tuple(stages),
        layer=LayerTimes(0.01, 0.02),
    )
    return replace(result, **changes)


def _memory_lines(text: str) -> list[str]:
    return text.split("\n\n")[-1].splitlines()


def test_pp16_shows_every_stage_that_does_not_fit():
    """Stage 0 fits (78.3 GB), stages 1–14 do not (87.7), stage 15 is the fullest (87.9):
    the run table shows 0, the fourteen (as one "1–14" row, they read the same) and 15;
    before, it showed stages 0 and 15 only."""
    stages = [_stage(0, 58.8)] + [_stage(i, 68.2) for i in range(1, 15)] + [_stage(15, 68.4)]
    lines = _memory_lines(format_result(_result(stages)))
    rows = {line.split()[0]: line for line in lines[2:]}
    assert list(rows) == ["0", "1–14", "15"]
    assert rows["0"].endswith("yes") and rows["1–14"].endswith("NO (> 84.0)") and "87.7" in rows["1–14"]
    assert not any(line.startswith("not shown") for line in lines)


def test_long_pipeline_names_the_stages_it_leaves_out():
    """16 stages, only stage 7 over capacity and stage 9 the fullest that fits: rows 0, 7, 9
    and 15; the others are named as fitting and not fuller."""
    stages = [_stage(i, 50.0 + i / 10) for i in range(16)]
    stages[7] = _stage(7, 70.0)
    stages[9] = _stage(9, 64.0)
    stages[15] = _stage(15, 40.0)
    result = _result(stages)
    assert result.fullest_stage.stage == 7 and result.stages_not_fitting == (7,)
    lines = _memory_lines(format_result(result))
    assert [line.split()[0] for line in lines[2:-1]] == ["0", "7", "15"]
    assert lines[-1].startswith("not shown: stages 1–6, 8–14 (each fits")


def test_folder_summary_pairs_the_fullest_peak_with_the_failing_stages():
    """The folder table's memory column is the fullest stage's peak and says which stage;
    "fits" names the stages that do not (before: stage 0's peak beside "NO")."""
    stages = [_stage(0, 58.8)] + [_stage(i, 68.2) for i in range(1, 15)] + [_stage(15, 68.4)]
    header, _, row = format_summary([_result(stages)]).splitlines()
    assert "peak GB (fullest stage)" in header
    assert "87.9 (stage 15)" in row and row.endswith("NO: stages 1–15 of 16")
    assert "78.3" not in row


def test_json_names_the_fullest_stage_and_those_that_do_not_fit():
    stages = [_stage(0, 58.8)] + [_stage(i, 68.2) for i in range(1, 15)] + [_stage(15, 68.4)]
    data = _result(stages).to_json_dict()
    assert data["fullest_stage"] == 15 and data["stages_not_fitting"] == list(range(1, 16))
    assert data["max_stage_peak_memory_bytes"] == pytest.approx(87.9 * GB)


def test_fp8_mfu_names_its_bf16_denominator():
    """The FP8 GPT-3 scenario: MFU (96.6 % on the H100 profile on 2026-11-26) is of the BF16 peak; the table
    says so, adds the MFU of the FP8 peak (989/1979 of it) and a note; --json names the
    denominator and carries the FP8-peak MFU."""
    scenario = str(ROOT / "scenarios" / "modern" / "gpt3-175b-h100-fp8.yaml")
    data = json.loads(runner.invoke(app, ["run", scenario, "--json"]).stdout)
    assert data["mfu_peak_dtype"] == "bf16" and data["mfu_peak_flop_per_s"] == 989e12
    assert data["fp8_peak_flop_per_s"] == 1979e12
    assert data["fp8_peak_mfu"] == pytest.approx(data["mfu"] * 989 / 1979)
    text = runner.invoke(app, ["run", scenario]).stdout
    mfu_line = next(line for line in text.splitlines() if line.startswith("MFU (of BF16 peak 989 TFLOP/s)"))
    assert mfu_line.endswith(f"{100 * data['mfu']:.1f} %")
    assert "MFU of the FP8 peak (1,979 TFLOP/s)" in text and "compare tokens/s per GPU" in text


def test_bf16_run_has_no_fp8_mfu():
    data = json.loads(runner.invoke(app, ["run", "gpt3-175b-sp-selective", "--json"]).stdout)
    assert data["mfu_peak_dtype"] == "bf16" and data["fp8_peak_mfu"] is None
    assert "FP8" not in runner.invoke(app, ["run", "gpt3-175b-sp-selective"]).stdout


def test_tiny_model_times_read_as_numbers(tmp_path):
    """A 2-layer model runs in about a millisecond: no time prints as "0.000 s"."""
    tiny = {
        "name": "tiny",
        "hardware": "a100-sxm4-80gb",
        "model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256,
                  "vocab_size": 1024},
        "parallel": {"tp": 1, "pp": 1},
        "training": {"micro_batch_size": 1, "global_batch_size": 1},
    }  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny))
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert "0.000 s" not in result.stdout and "µs" in result.stdout
    iteration = next(line for line in result.stdout.splitlines() if line.startswith("iteration time"))
    assert iteration.endswith((" ms", " µs"))
    seconds = json.loads(runner.invoke(app, ["run", str(path), "--json"]).stdout)["iteration_time_s"]
    assert seconds < 0.1 and iteration.split()[-2] == format_duration(seconds).split()[0]


def test_folder_summary_notes_the_fp8_denominator():
    """A folder with an FP8 run: one line under the table names it and says what compares."""
    stages = [_stage(0, 10.0)]
    bf16 = _result(stages, mfu_peak_flop_per_s=989e12, mfu_peak_dtype="bf16")
    fp8 = replace(bf16, scenario="fp8-run", fp8_peak_flop_per_s=1979e12)
    assert fp8.fp8_peak_mfu == pytest.approx(0.5 * 989 / 1979)
    assert format_summary([bf16]).splitlines()[-1].startswith("pp16")
    note = format_summary([bf16, fp8]).splitlines()[-1]
    assert note.startswith("fp8-run: FP8 run: MFU and HFU divide by the BF16 peak")


def test_fp4_mfu_names_its_bf16_denominator_and_adds_the_fp4_peak():
    """The GB300 NVFP4 scenario: MFU of the BF16 peak passes 100 % (the FP4 peak is 6x it), so
    the table adds the MFU of the FP4 peak and a note; --json carries both."""
    scenario = str(ROOT / "scenarios" / "blackwell" / "llama31-405b-gb300-nvfp4.yaml")
    data = json.loads(runner.invoke(app, ["run", scenario, "--json"]).stdout)
    assert data["mfu_peak_dtype"] == "bf16" and data["fp8_peak_mfu"] is None
    assert data["fp4_peak_flop_per_s"] == 15000e12
    assert data["fp4_peak_mfu"] == pytest.approx(data["mfu"] * 2500 / 15000)
    assert data["mfu"] > 1 > data["fp4_peak_mfu"]
    text = runner.invoke(app, ["run", scenario]).stdout
    assert "MFU of the FP4 peak (15,000 TFLOP/s)" in text and "FP4 run: MFU and HFU divide" in text
    assert "FP8" not in text.split("time (mean stage)")[0]


def test_folder_summary_notes_the_fp4_denominator():
    bf16 = _result([_stage(0, 10.0)], mfu_peak_flop_per_s=2500e12, mfu_peak_dtype="bf16")
    fp4 = replace(bf16, scenario="fp4-run", fp4_peak_flop_per_s=15000e12)
    assert fp4.fp4_peak_mfu == pytest.approx(bf16.mfu / 6) and bf16.fp4_peak_mfu is None
    assert format_summary([bf16, fp4]).splitlines()[-1].startswith("fp4-run: FP4 run: MFU and HFU")
