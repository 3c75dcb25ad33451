"""Output files: check a target before the work that fills it, then write it atomically.

Every command that writes a file (`run --trace`, `sweep --out`, `plot -o`, `import-megatron
--out`, `calibrate --out`, `check-profile --out-dir`, `--save-measurements`) calls
`check_output_file` (or `check_output_folder`) first, so a folder, a path under a file or an
unwritable folder is one clear error before minutes of simulating or measuring, not a
traceback after. The same check holds the one rule of what may be replaced:
- an existing file is refused unless the command was given `--force` (the error names it);
- an input of the same command (a scenario, a profile, a spec, a table, measurements) is
  never an output, `--force` or not: paths are compared resolved (links, `..`), and a hard
  link to an input is the input.
Writes go through `write_atomically`: a
temporary file beside the target, renamed over it, and removed if anything fails, so an
interrupted or failed write leaves neither a partial target nor a stray temporary file.

Standard library and `config.errors`; the writers themselves live in `atomic_files` (standard
library only, so the profiler's entry points can use them on a machine with torch alone).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from simcluster.atomic_files import temporary_path as temporary_path  # re-exported
from simcluster.atomic_files import write_atomically as write_atomically  # re-exported
from simcluster.atomic_files import write_text_atomically as write_text_atomically  # re-exported
from simcluster.config.errors import ConfigError


class OutputPathError(ConfigError):
    """An output path that cannot be written: names the path, the option and the problem.

    A `ConfigError` (exit 2 in the CLI, like any input that cannot be used as written),
    worded for a path rather than a file's contents."""

    def __init__(self, path: str | Path, option: str, problem: str) -> None:
        self.source = str(path)
        self.problems = [f"{option}: {problem}"]
        ValueError.__init__(self, f"{path}: {option}: {problem}")


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest ancestor that exists (the writers create the rest),
    spelt as the user gave it (a relative path ends at ".", which exists)."""
    return next((candidate for candidate in (path, *path.parents) if os.path.lexists(candidate)), path)


def _probe_folder(folder: Path, target: Path, option: str) -> None:
    """Create and delete a file in `folder`: the only check that holds for root, read-only
    mounts and ACLs alike (os.access answers for permission bits only)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".simcluster-probe-"):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise OutputPathError(target, option, f"cannot write in folder {folder} ({reason})") from None


def check_output_folder(folder: str | Path, option: str) -> Path:
    """`folder` exists as a writable folder or can be created; nothing is created here."""
    folder = Path(folder)
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        what = "is a file" if existing == folder else f"is under a file ({existing})"
        raise OutputPathError(folder, option, f"{what}; give a folder")
    _probe_folder(existing, folder, option)
    return folder


FORCE_OPTION = "--force"


def _same_file(path: Path, other: Path) -> bool:
    if path.resolve() == other.resolve():
        return True
    try:
        return path.exists() and other.exists() and os.path.samefile(path, other)
    except OSError:
        return False


def refuse_inputs(path: str | Path, option: str, inputs: Iterable[str | Path]) -> None:
    """Raise `OutputPathError` if `path` is one of the command's `inputs` (resolved)."""
    path = Path(path)
    for source in inputs:
        if _same_file(path, Path(source)):
            raise OutputPathError(
                path, option, f"is an input of this command ({source}); an output never replaces an "
                f"input, even with {FORCE_OPTION}: give another file name",
            )  # fmt: skip


def refuse_existing(
    path: str | Path, option: str, force: bool, what: str = "exists", other: str = ""
) -> None:
    """Raise `OutputPathError` if a file is at `path` and `force` is off; `what` says what
    is there, `other` offers another way out (", or ...")."""
    if not force and os.path.lexists(path):
        raise OutputPathError(
            path, option, f"{what}; refusing to overwrite it: give a new file name{other}, or add "
            f"{FORCE_OPTION} to replace it",
        )  # fmt: skip


def check_output_file(
    path: str | Path, option: str, force: bool = False, inputs: Iterable[str | Path] = ()
) -> Path:
    """`path` can be created, or replaced by an atomic write: not a folder, not a device or
    other special file, not under a file, and its folder (or the nearest one that exists)
    is writable; not one of the command's `inputs`; and, unless `force`, no file yet.
    Raises `OutputPathError`; creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(path, option, "is a folder; give a file name inside it")
    if os.path.lexists(path) and not path.is_file():
        raise OutputPathError(path, option, "is not a regular file (a device, pipe or broken link)")
    if path.name in ("", ".", ".."):
        raise OutputPathError(path, option, "names no file; give a file name")
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise OutputPathError(path, option, f"{existing} is a file, not a folder")
    _probe_folder(existing, path, option)
    refuse_inputs(path, option, inputs)
    refuse_existing(path, option, force)
    return path
