"""Architecture rules of docs/layout.md, checked: import directions, and the linters."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "simcluster"
# Every top-level module and package of simcluster, lowest first: each may import only from
# itself and the ones before it (docs/layout.md's flow: config -> workload -> costs -> schedule ->
# engine -> results -> report / sweep / cli). calibration (torch-free: measurement records
# to a profile, priced with costs) comes before profiler (the torch layer and its benchmarks,
# which write calibration's records); the engine's steady-state extension (periodicity,
# steady_state) sits on the engine; the main job (simulation) and the paper's tables
# (validation) read results; report, sweep and cli only read what the core produced.
LAYERS = [
    "__init__",
    "units",
    "atomic_files",
    "config",
    "output_files",
    "headroom",
    "workload",
    "costs",
    "calibration",
    "profiler",
    "schedule",
    "engine",
    "results",
    "periodicity",
    "steady_state",
    "memory_plan",
    "simulation",
    "validation",
    "report",
    "sweep",
    "plan",
    "cli",
    "__main__",
]
ONLY_IN = {"simpy": "engine", "torch": "profiler", "matplotlib": "report"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _modules():
    for path in PACKAGE.rglob("*.py"):
        yield path, path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_heavy_dependencies_stay_in_their_package():
    """Only engine/ imports simpy, only profiler/ imports torch, only report/ matplotlib."""
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {lib}"
        for path, top in _modules()
        for name in _imports(path)
        for lib, home in ONLY_IN.items()
        if name.split(".")[0] == lib and top != home
    ]
    assert not offenders


def test_every_top_level_module_has_a_layer():
    """A new top-level module or package must take its place in LAYERS."""
    tops = {top for _, top in _modules()}
    assert tops <= set(LAYERS), sorted(tops - set(LAYERS))


def test_layers_import_downwards_only():
    """No module imports a top-level module or package above its own in LAYERS (no loops)."""
    offenders = []
    for path, top in _modules():
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "simcluster" and len(parts) > 1 and parts[1] in LAYERS:
                if LAYERS.index(parts[1]) > LAYERS.index(top):
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not offenders


def test_simulator_imports_without_torch():
    """The simulator runs without torch: importing the main job never loads it."""
    code = "import sys, simcluster.simulation, simcluster.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="ruff not installed",
)
def test_ruff_is_clean():
    """ruff check passes on the package and the tests."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    root = PACKAGE.parent
    done = subprocess.run(
        [ruff, "check", "simcluster", "tests", "benchmarks"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean():
    """mypy finds no type errors in the package."""
    mypy = pytest.importorskip("mypy.api")
    stdout, stderr, status = mypy.run(["--ignore-missing-imports", str(PACKAGE)])
    assert status == 0, stdout + stderr
