"""Output targets: a folder, a path under a file or a special file is one clear error (exit 2,
naming the path and the problem) before any work; a failed write leaves no temporary file."""

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.engine.trace import write_trace
from simcluster.output_files import OutputPathError, check_output_file, check_output_folder, write_atomically
from tests.cli.no_work import no_work

runner = CliRunner()
MINIMAL = "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --micro-batch-size 2"
TINY = {
    "hardware": "a100-sxm4-80gb",
    "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
              "vocab_size": 1024},
    "parallel": {"tp": 1, "pp": 2},
    "training": {"micro_batch_size": 1, "global_batch_size": 4},
}  # fmt: skip


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    """A plain file, to put output paths under (a path no user, root included, can create)."""
    path = tmp_path / "notes.txt"
    path.write_text("keep me\n")
    return path


def test_check_output_file_accepts_new_nested_paths_and_creates_nothing(tmp_path):
    """A file in folders that do not exist yet is fine (the writers create them); checking
    leaves the folder exactly as it was."""
    assert check_output_file(tmp_path / "a" / "b" / "out.json", "--out") == tmp_path / "a" / "b" / "out.json"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        (lambda tmp, f: tmp, "is a folder"),
        (lambda tmp, f: f / "out.json", "is a file, not a folder"),
        (lambda tmp, f: f / "deeper" / "out.json", "is a file, not a folder"),
        (lambda tmp, f: Path(os.devnull), "is not a regular file"),
    ],
)
def test_check_output_file_names_the_path_and_the_problem(tmp_path, a_file, target, problem):
    """Folder, path under a file, device: an OutputPathError naming path, option and problem."""
    path = target(tmp_path, a_file)
    with pytest.raises(OutputPathError, match=problem) as error:
        check_output_file(path, "--trace")
    assert str(error.value).startswith(f"{path}: --trace: ")


def test_check_output_folder_refuses_a_file(a_file):
    with pytest.raises(OutputPathError, match="is a file; give a folder"):
        check_output_folder(a_file, "--out-dir")
    with pytest.raises(OutputPathError, match="is under a file"):
        check_output_folder(a_file / "reports", "--out-dir")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_check_output_file_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match="cannot write in folder"):
            check_output_file(folder / "out.json", "--out")
    finally:
        folder.chmod(0o700)


def test_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    """The writer raises halfway: the target keeps its content, no temporary file is left."""
    target = tmp_path / "out.json"
    target.write_text("old")

    def half_then_fail(path: Path) -> None:
        path.write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_trace_onto_a_folder_leaves_no_temporary_file(tmp_path, scenario):
    """The rename onto a folder fails after the temporary file is written: it is removed."""
    from simcluster.config.hardware import load_hardware
    from simcluster.config.scenario import load_scenario
    from simcluster.simulation import run_simulation

    scenario = load_scenario(scenario)
    sim = run_simulation(scenario, load_hardware(scenario.hardware), record=True)
    (tmp_path / "trace.json").mkdir()
    with pytest.raises(OSError):
        write_trace(sim.engine, tmp_path / "trace.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    assert list((tmp_path / "trace.json").iterdir()) == []


def test_run_trace_to_a_folder_exits_2_before_simulating(tmp_path, scenario, monkeypatch):
    no_work(monkeypatch, "simcluster.simulation.run_simulation")
    result = runner.invoke(app, ["run", str(scenario), "--trace", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"error: {tmp_path}: --trace: is a folder" in result.output
    assert list(tmp_path.iterdir()) == []


def test_run_trace_under_a_file_exits_2(a_file, scenario):
    result = runner.invoke(app, ["run", str(scenario), "--trace", str(a_file / "t.json")])
    assert result.exit_code == 2
    assert f"error: {a_file / 't.json'}: --trace: {a_file} is a file, not a folder" in result.output
    assert a_file.read_text() == "keep me\n"


def test_run_trace_still_writes_a_trace(tmp_path, scenario):
    """The check lets a new nested path through, and the trace lands there."""
    path = tmp_path / "traces" / "t.json"
    result = runner.invoke(app, ["run", str(scenario), "--trace", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text())["traceEvents"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.json"]


def test_import_megatron_out_folder_exits_2(tmp_path):
    result = runner.invoke(app, ["import-megatron", MINIMAL, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path}: --out: is a folder" in result.output
    assert list(tmp_path.iterdir()) == []


def test_import_megatron_writes_out_atomically(tmp_path):
    out = tmp_path / "s.yaml"
    result = runner.invoke(app, ["import-megatron", MINIMAL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "num_layers: 8" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize("quote", ["'", '"'])
def test_import_megatron_unbalanced_quote_is_one_clear_error(quote):
    """shlex's ValueError becomes exit 2 naming the command line and the problem."""
    result = runner.invoke(app, ["import-megatron", f"{MINIMAL} --lr {quote}1e-4"])
    assert result.exit_code == 2, result.output
    assert "megatron arguments" in result.output and "No closing quotation" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["memory-ladder"], ["timeline", "SCENARIO"]])
def test_plot_out_folder_exits_2_before_drawing(tmp_path, monkeypatch, scenario, command):
    """A folder named like a figure: exit 2 before simulating or drawing anything."""
    no_work(monkeypatch, "simcluster.simulation.run_simulation")
    no_work(monkeypatch, "simcluster.report.plots.memory_ladder_frame")
    folder = tmp_path / "fig.png"
    folder.mkdir()
    command = [str(scenario) if word == "SCENARIO" else word for word in command]
    result = runner.invoke(app, ["plot", *command, "-o", str(folder)])
    assert result.exit_code == 2, result.output
    assert f"{folder}: --out: is a folder" in result.output
    assert list(folder.iterdir()) == []


def test_plot_writes_the_figure_without_stray_files(tmp_path):
    out = tmp_path / "ladder.svg"
    result = runner.invoke(app, ["plot", "memory-ladder", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().lstrip().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ladder.svg"]


@pytest.mark.parametrize("option", ["--out", "--save-measurements"])
def test_calibrate_checks_its_outputs_before_measuring(a_file, monkeypatch, option):
    """An output under a file: exit 2 naming it, before the device is even looked at."""
    no_work(monkeypatch, "simcluster.cli.calibrate.require_device")
    target = a_file / "x.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", option, str(target)])
    assert result.exit_code == 2, result.output
    assert f"{target}: {option}: " in result.output and "is a file, not a folder" in result.output


def test_check_profile_checks_out_dir_before_measuring(a_file, monkeypatch):
    no_work(monkeypatch, "simcluster.cli.check_profile.require_device")
    result = runner.invoke(
        app, ["check-profile", "a100-sxm4-80gb", "--device", "cpu", "--quick", "--out-dir", str(a_file)]
    )
    assert result.exit_code == 2, result.output
    assert f"{a_file}: --out-dir: is a file; give a folder" in result.output


@pytest.mark.parametrize("name", ["table.parquet", "table.csv"])
def test_plot_of_a_garbage_sweep_table_is_one_clear_error(tmp_path, name):
    """Not Parquet (or an empty CSV): exit 2 naming the file, no ArrowInvalid traceback."""
    table = tmp_path / name
    table.write_bytes(b"" if name.endswith(".csv") else b"not parquet\n")
    result = runner.invoke(app, ["plot", "sweep-heatmap", str(table), "-o", str(tmp_path / "h.png")])
    assert result.exit_code == 2, result.output
    assert f"{table}: not a readable sweep table" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
