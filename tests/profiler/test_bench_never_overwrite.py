"""The profiler's entry points and the one-run GPU script follow the commands' output rule: an
existing file is refused unless --force, before anything is measured."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ("microbench", "layer_timing", "modern_layers", "host_graph")


@pytest.mark.parametrize("bench", BENCHES)
def test_an_existing_out_is_refused_without_force(bench: str, tmp_path: Path, capsys) -> None:
    main = importlib.import_module(f"simcluster.profiler.bench.{bench}").main
    out = tmp_path / "earlier.json"
    out.write_text("earlier run")
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", "--quick", "--out", str(out)])
    assert exit_.value.code == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "earlier run"


def test_the_gpu_script_refuses_an_earlier_run_in_its_folder(tmp_path: Path) -> None:
    (tmp_path / "layer_timing_fused.json").write_text("earlier run")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/gpu_calibrate.sh", "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--force" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer_timing_fused.json"]  # nothing started


def test_the_gpu_script_names_what_it_allows(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "o")}
    done = subprocess.run(
        ["bash", "scripts/gpu_calibrate.sh", "--smok"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--smoke, --force" in done.stderr
