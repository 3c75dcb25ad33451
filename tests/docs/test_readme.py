"""The README keeps its word: every `simcluster` command it shows runs from the repository
root, and every figure of its worked example and accuracy table is what the commands print
today (so a re-derived profile or a changed model fails here until the README follows)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from tests.paths import ROOT

README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
# Options whose value is a file or folder the command writes: redirected into a temporary
# folder (the command itself is unchanged), and later commands that read it are pointed there.
OUTPUT_OPTIONS = ("--out", "-o", "--trace", "--out-dir", "--save-measurements")
# Lines of the README's code blocks not run here, and why.
SET_UP = "sets up the environment (the README's two commands): .ci/run runs them on a clean clone"
NOT_RUN = {
    "pip install": SET_UP,
    "python3 -m venv": SET_UP,
    "dist/": "needs a built wheel: tests/packaging/ builds one and runs commands from another folder",
}
runner = CliRunner()


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def shown_lines(text: str = TEXT) -> list[str]:
    """Every command line the README shows: `$ ...` lines of console blocks, and every
    non-comment line of bash blocks."""
    lines = []
    for language, body in code_blocks(text):
        for line in body.splitlines():
            if language == "console" and line.startswith("$ "):
                lines.append(line[2:].strip())
            elif language == "bash" and line.strip() and not line.lstrip().startswith("#"):
                lines.append(line.strip())
    return lines


def not_run_reason(line: str) -> str | None:
    return next((reason for key, reason in NOT_RUN.items() if key in line), None)


COMMANDS = [line for line in shown_lines() if not_run_reason(line) is None]


def test_every_shown_line_runs_here_or_says_why_not():
    """A shown line is a `simcluster` command (run below) or has a reason in NOT_RUN."""
    assert len(COMMANDS) >= 10
    for line in shown_lines():
        words = shlex.split(line, comments=True)
        assert words[0] == "simcluster" or not_run_reason(line), line


def _redirect(words: list[str], written: dict[str, str], folder: Path) -> list[str]:
    out = []
    for i, word in enumerate(words):
        if i > 0 and words[i - 1] in OUTPUT_OPTIONS:
            written[word] = str(folder / Path(word).name)
        out.append(written.get(word, word))
    return out


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each shown command, in the README's order (a later one may read an earlier one's
    output), from the repository root; its outputs go to a temporary folder."""
    folder, written, results = tmp_path_factory.mktemp("readme"), {}, {}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for line in COMMANDS:
            words = _redirect(shlex.split(line, comments=True), written, folder)
            results[line] = runner.invoke(app, words[1:])
    finally:
        os.chdir(cwd)
    return results


@pytest.mark.parametrize("line", COMMANDS)
def test_shown_command_exits_zero(ran: dict[str, Any], line: str):
    result = ran[line]
    assert result.exit_code == 0, f"{line}\n{result.output[-2000:]}\n{result.exception!r}"


def _section(title: str) -> str:
    start = TEXT.index(f"\n## {title}")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start : end if end > 0 else None]


def _number(cell: str) -> tuple[str, str]:
    """'13.168 s' -> ('13.168', 's'); '53.7 %' -> ('53.7', '%')."""
    match = re.fullmatch(r"\s*([-+]?[\d,]*\.?\d+)\s*(\S*)\s*", cell.replace("−", "-"))
    assert match, cell
    return match.group(1).replace(",", ""), match.group(2)


def _as_shown(value: float, shown: str) -> str:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return f"{value:.{decimals}f}"


UNIT_SCALE = {"s": 1.0, "ms": 1e3, "µs": 1e6, "us": 1e6, "%": 100.0, "": 1.0}
METRICS = {  # label at the start of a run-table row -> `run --json` key
    "GPUs": "num_gpus",
    "iteration time": "iteration_time_s",
    "MFU": "mfu",
    "HFU": "hfu",
    "model TFLOP/s per GPU": "tflops_per_gpu",
    "tokens/s per GPU": "tokens_per_s_per_gpu",
}


def _worked_example() -> tuple[str, list[str]]:
    block = next(body for language, body in code_blocks(_section("Worked example")) if language == "console")
    lines = block.splitlines()
    assert lines[0].startswith("$ simcluster run ")
    return lines[0][2:], lines[1:]


def test_worked_example_figures_are_what_run_json_prints():
    """Each headline metric, each time category and each stage's peak and verdict in the
    worked example equal `simcluster run ... --json` rounded as shown."""
    command, output = _worked_example()
    result = runner.invoke(app, [*shlex.split(command)[1:], "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    checked = set()
    for line in output:
        cells = re.split(r"\s{2,}", line.strip())
        label = next((key for key in METRICS if cells[0].startswith(key)), None)
        if len(cells) == 2 and label is not None:  # a headline metric: label, value with its unit
            shown, unit = _number(cells[1])
            assert _as_shown(data[METRICS[label]] * UNIT_SCALE[unit], shown) == shown, line
            checked.add(label)
        words = line.split()
        if len(words) >= 2 and words[0] in data["time_breakdown_s"]:  # "recompute  307.2 ms  2.3 %"
            unit = words[2] if len(words) > 2 and words[2] in ("s", "ms", "µs") else "s"
            seconds = data["time_breakdown_s"][words[0]]
            assert _as_shown(seconds * UNIT_SCALE[unit], words[1]) == words[1], line
            checked.add(words[0])
    header = next(re.split(r"\s{2,}", line.strip()) for line in output if line.startswith("stage "))
    peak, fits = header.index("peak GB"), header.index("fits")
    rows = [line.split() for line in output if re.match(r"\d+\s", line)]
    stages = {stage["stage"]: stage for stage in data["stages"]}
    assert rows, "no stage rows"
    for row in rows:  # the table may leave out stages; each one shown is checked
        stage = stages[int(row[0])]
        assert _as_shown(stage["peak_memory_bytes"] / 1e9, row[peak]) == row[peak], row
        assert row[fits] == ("yes" if stage["fits"] else "NO"), row
    assert {"iteration time", "MFU", "HFU", "compute", "idle"} <= checked
    usable = re.search(r"usable memory \(([\d.]+) GB", _section("Worked example"))
    assert usable and _as_shown(data["stages"][0]["capacity_bytes"] / 1e9, usable[1]) == usable[1]


@functools.cache
def _validate() -> list[dict[str, Any]]:
    result = runner.invoke(app, ["validate", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_worked_example_text_quotes_table_5():
    """'The paper measured X s for this run (Table 5); the prediction is Y % fast.'"""
    command, _ = _worked_example()
    assert Path(shlex.split(command)[2]).stem == "gpt3-175b-sp-selective", "update the Table 5 row below"
    pattern = r"measured ([\d.]+) s for this run \(Table 5\); the prediction is ([\d.]+) % fast"
    match = re.search(pattern, _section("Worked example"))
    assert match, pattern
    row = next(
        row
        for row in _validate()
        if (row["table"], row["row"], row["quantity"]) == ("Table 5", "175B SP + selective", "iteration s")
    )
    assert f"{row['measured']:.2f}" == match.group(1)
    assert row["error"] < 0 and f"{-100 * row['error']:.1f}" == match.group(2)


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return sys.modules[name]


def _stats(errors: list[float], unit: str, faster_is_negative: bool = True) -> list[str]:
    """The accuracy table's cells for errors in percent (or points): runs, mean |error|,
    signed range, predicted faster / slower."""
    faster = sum((e < 0) if faster_is_negative else (e > 0) for e in errors)
    slower = sum((e > 0) if faster_is_negative else (e < 0) for e in errors)
    return [
        str(len(errors)),
        f"{sum(map(abs, errors)) / len(errors):.1f} {unit}",
        f"{min(errors):+.1f} {unit} … {max(errors):+.1f} {unit}",
        f"{faster} / {slower}",
    ]


def _expected_accuracy() -> dict[str, list[str]]:
    rows = _validate()

    def errors(table: str, quantities: tuple[str, ...], scale: float) -> list[float]:
        return [scale * r["error"] for r in rows if r["table"] == table and r["quantity"] in quantities]

    rows_all = _script("public_runs").rows()
    public = [r for r in rows_all if not r["moe"]]
    moe = [r for r in rows_all if r["moe"]]  # docs/public_runs_moe.md
    family = {
        "H100": [r["error_pct"] for r in public if r["hardware"].startswith("h100")],
        "Blackwell": [r["error_pct"] for r in public if not r["hardware"].startswith("h100")],
        "MoE H100": [r["error_pct"] for r in moe if r["hardware"].startswith("h100")],
        "MoE Blackwell": [r["error_pct"] for r in moe if not r["hardware"].startswith("h100")],
    }
    return {
        "paper Table 4": _stats(errors("Table 4", ("forward ms", "backward ms"), 100), "%"),
        "paper Table 5, iteration": _stats(errors("Table 5", ("iteration s",), 100), "%"),
        "paper Table 5, MFU": _stats(errors("Table 5", ("MFU", "HFU"), 1), "pt", faster_is_negative=False),
        "development set": _stats([r["error_pct"] for r in _script("dev_runs").rows()], "%"),
        "published runs, H100": _stats(family["H100"], "%"),
        "published runs, Blackwell": _stats(family["Blackwell"], "%"),
        "published MoE runs, H100": _stats(family["MoE H100"], "%"),
        "published MoE runs, Blackwell": _stats(family["MoE Blackwell"], "%"),
    }


def test_accuracy_table_is_what_the_commands_print():
    """Every row of the README's accuracy table, recomputed from `simcluster validate --json`,
    `benchmarks/dev_runs.py` and `benchmarks/public_runs.py`."""
    table = [
        [cell.strip().replace("−", "-") for cell in line.strip("|").split("|")]
        for line in _section("Accuracy").splitlines()
        if line.startswith("| ") and not line.startswith("| check")
    ]
    expected = _expected_accuracy()
    for label, cells in expected.items():
        row = next((row for row in table if row[0].startswith(label)), None)
        assert row is not None, f"no accuracy row starts with {label!r}"
        assert row[1:] == [cell.replace("−", "-") for cell in cells], label
    assert len(table) == len(expected)


def _console_output(text: str, command: str) -> str:
    """The output shown under `$ command` in a console block of `text`."""
    for language, body in code_blocks(text):
        lines = body.splitlines()
        if language == "console" and lines and lines[0] == f"$ {command}":
            return "\n".join(lines[1:])
    raise AssertionError(f"no console block shows `$ {command}`")


def test_accuracy_doc_shows_what_validate_and_the_development_set_print():
    """docs/accuracy.md's `simcluster validate` and `python benchmarks/dev_runs.py` blocks are
    those commands' output, line for line (both run on the A100 profiles only)."""
    doc = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 0, result.output
    assert _console_output(doc, "simcluster validate") == result.output.rstrip("\n")
    dev = subprocess.run(
        [sys.executable, "benchmarks/dev_runs.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert _console_output(doc, "python benchmarks/dev_runs.py") == dev.stdout.rstrip("\n")
