"""Notebooks: committed executed, importing only simcluster (plus pandas, matplotlib and the
standard library), and running top to bottom without error in their small mode."""

import ast
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL_MODE = "SIMCLUSTER_NOTEBOOK_SMALL"
ALLOWED_IMPORTS = {"simcluster", "pandas", "matplotlib"} | set(sys.stdlib_module_names)


def _code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _python(source: str) -> str:
    """A cell's source without IPython magics (`%…`), which are not Python."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_committed_executed_and_imports_only_simcluster(path):
    notebook = nbformat.read(path, as_version=4)
    cells = _code_cells(notebook)
    assert SMALL_MODE in cells[0].source, "the first code cell must read the small-mode switch"
    assert all(cell.execution_count is not None for cell in cells), "commit the notebook executed"
    for cell in cells:
        for node in ast.walk(ast.parse(_python(cell.source))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert {name.split(".")[0] for name in names} <= ALLOWED_IMPORTS, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_in_small_mode(path, tmp_path, monkeypatch):
    """Executed in a temporary copy, so the committed outputs stay as they are."""
    monkeypatch.setenv(SMALL_MODE, "1")
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    notebook = nbformat.read(copy, as_version=4)
    client = NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [out for cell in _code_cells(notebook) for out in cell.outputs if out.output_type == "error"]
    assert errors == []


def execute_in_place(path: Path) -> None:
    """Run a notebook in full mode and save it with its outputs (what gets committed)."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        record_timing=False,  # no timestamps in the committed file
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    nbformat.write(notebook, path)


if __name__ == "__main__":
    # python tests/notebooks/test_notebooks_execute.py [NOTEBOOK ...]: refresh committed outputs
    import os

    os.environ.pop(SMALL_MODE, None)
    for target in [Path(arg) for arg in sys.argv[1:]] or NOTEBOOKS:
        execute_in_place(target)
        print(f"executed {target}")
