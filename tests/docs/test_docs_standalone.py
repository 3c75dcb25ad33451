"""The repository stands alone: the README is short enough to read, nothing in it, in
docs/, in the package, its tests, its scripts, the hardware profiles, scenarios, sweeps,
notebooks or the packaging files cites a document that is not in the repository, and every
docs/ path they name exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.paths import ROOT

MAX_README_LINES = 300
# Documents of the project's private working folder, never shipped with the repository.
# Written in pieces so that this file does not cite them itself.
OUTSIDE = re.compile(
    r"\.\./" + r"shared|\bshared/" + r"reference\b"
    r"|\b(DESIGN|STYLE|modern|megatron|paper|hardware)\." + r"md\b"
)
SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".ipynb"}
FOLDERS = (
    "docs",
    "simcluster",
    "tests",
    "benchmarks",
    "scripts",
    "hwprofiles",
    "scenarios",
    "sweeps",
    "notebooks",
)
SINGLE_FILES = ("README.md", "pyproject.toml", "setup.py")
# `docs/...` paths of other repositories that the docs cite (NeMo, Transformer Engine, Megatron-LM).
EXTERNAL_DOCS = {
    "docs/performance-summary.md",
    "docs/performance-summary-archive.md",
    "docs/examples/gemm_profiling/gemm_profiling.rst",
    "docs/user-guide/features/context_parallel.md",
}


def _files() -> list[Path]:
    files = [ROOT / name for name in SINGLE_FILES]
    for folder in FOLDERS:
        files += [path for path in (ROOT / folder).rglob("*") if path.suffix in SUFFIXES and path.is_file()]
    return [path for path in files if path != Path(__file__).resolve()]


def test_readme_is_at_most_300_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_no_file_cites_a_document_outside_the_repository():
    """Cite the primary source (paper, Megatron-LM / Transformer Engine file) or a docs/ file."""
    offenders = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "\n".join(offenders)


def test_the_pattern_catches_each_kind_of_citation():
    """The check above can fail: each form of citation it exists for is caught."""
    cases = ("see ../shared/reference/x", "(modern.md §3.2)", "DESIGN.md:", "reference/paper.md")
    for text in cases:
        assert OUTSIDE.search(text), text
    assert not OUTSIDE.search("docs/memory.md, Megatron-core schedules.py")


def test_the_scan_covers_profiles_scenarios_sweeps_notebooks_and_packaging():
    """Each place a citation can hide is read: a folder with no matching file would pass unseen."""
    scanned = {path.relative_to(ROOT).parts[0] for path in _files()}
    for name in (*FOLDERS, *SINGLE_FILES):
        assert name in scanned, f"{name} is not scanned"
    assert (ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml") in _files()


def test_every_docs_path_named_in_readme_docs_and_package_exists():
    """A `docs/...` path in the README, docs/, a docstring, a profile or a notebook names a file or
    folder here."""
    missing = []
    for path in _files():
        if path.suffix not in {".md", ".py", ".yaml", ".ipynb"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in re.findall(r"(?<![\w/.])docs/[\w./-]*[\w/]", text):
            if name not in EXTERNAL_DOCS and not (ROOT / name).exists():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(missing)
