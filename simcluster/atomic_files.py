"""Atomic writes: a temporary file beside the target, renamed over it, removed on failure.

Standard library only: the profiler's entry points write through it on a GPU machine that
has torch and nothing else of ours (`calibration.records`), and every layer may import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def temporary_path(path: Path) -> Path:
    """The hidden temporary file an atomic write of `path` uses (same folder, so the rename
    is atomic; the pid keeps two processes apart)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> None:
    """`write(temporary)`, then rename it over `path`; on any failure the temporary file is
    removed and `path` keeps its old content (or stays absent)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write `text` via a temporary file and a rename (see `write_atomically`)."""
    write_atomically(path, lambda temporary: temporary.write_text(text))
