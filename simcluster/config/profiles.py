"""Finding a hardware profile by name: the search path, the shipped folders, did-you-mean.

A scenario's `hardware:` is either a profile *name* (the file stem, a plain name such as
`a100-sxm4-80gb`) looked up in the profile folders, or a *path* to a `.yaml`/`.yml` file
(absolute, or relative to the scenario's folder, then to the working directory). The
profile folders, first match wins:

1. folders given on the command line (`--hwprofiles DIR`; the CLI puts them in front of
   the environment variable for the rest of the process),
2. the folders in `$SIMCLUSTER_HWPROFILES` (separated by `os.pathsep`, `:` on POSIX),
3. the shipped profiles: package data `simcluster/hwprofiles/` in an installed wheel, the
   repository's top-level `hwprofiles/` in a source checkout (`simcluster.config.shipped`).

A name is never a path: `../x` or `a/b` is refused before any file is opened, so a
scenario cannot make the loader read (or echo) a file outside the profile folders by stem.
What a profile *contains* is validated by `simcluster.config.hardware`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from simcluster.config.errors import ConfigError
from simcluster.config.shipped import did_you_mean, is_installed_copy, shipped_dir

ENV_VAR = "SIMCLUSTER_HWPROFILES"
PROFILE_SUFFIX = ".yaml"
PATH_SUFFIXES = (".yaml", ".yml")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_ECHO = 80  # characters of a bad reference repeated in an error


def profiles_dir() -> Path:
    """The shipped hardware profiles."""
    return shipped_dir("hwprofiles")


def user_profiles_dir() -> Path:
    """Where a newly calibrated profile goes: the first $SIMCLUSTER_HWPROFILES folder; else
    the checkout's `hwprofiles/` in a source checkout; else `./hwprofiles` (never into an
    installed package)."""
    if folders := env_dirs():
        return folders[0]
    return Path("hwprofiles") if is_installed_copy("hwprofiles") else profiles_dir()


def env_dirs() -> list[Path]:
    """The folders named in $SIMCLUSTER_HWPROFILES, in order (empty entries skipped)."""
    return [Path(entry) for entry in os.environ.get(ENV_VAR, "").split(os.pathsep) if entry]


def search_path(extra: Sequence[Path] = ()) -> list[Path]:
    """Profile folders in lookup order: `extra`, then $SIMCLUSTER_HWPROFILES, then shipped."""
    return [*extra, *env_dirs(), profiles_dir()]


def missing_dirs(extra: Sequence[Path] = ()) -> list[str]:
    """Problems for user folders on the search path that are not folders."""
    named = [(str(d), "--hwprofiles") for d in extra] + [(str(d), ENV_VAR) for d in env_dirs()]
    return [
        f"{where}: value {folder!r}: not a folder; allowed: an existing folder of <name>.yaml profiles"
        for folder, where in named
        if not Path(folder).is_dir()
    ]


def known_profiles(folders: Sequence[Path] | None = None) -> list[str]:
    """Every profile name on the search path, sorted, each once."""
    names = set()
    for folder in search_path() if folders is None else folders:
        if folder.is_dir():
            names |= {path.stem for path in folder.glob(f"*{PROFILE_SUFFIX}")}
    return sorted(names)


def is_path_reference(reference: str) -> bool:
    return reference.lower().endswith(PATH_SUFFIXES)


def find_profile(
    reference: str,
    relative_to: Path | None = None,
    field: str = "hardware",
    extra: Sequence[Path] = (),
) -> Path:
    """The file `reference` names. `relative_to`: the scenario file that names it (errors
    name that file; relative paths start from its folder) or a folder. Raises ConfigError."""
    source, base = _source_and_base(reference, relative_to)
    if is_path_reference(reference):
        candidates = (
            [Path(reference)] if Path(reference).is_absolute() else [base / reference, Path(reference)]
        )
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise ConfigError(source, [f"{field}: value {_cut(reference)}: no profile file at {candidates[0]}"])
    if not _PLAIN_NAME.fullmatch(reference):
        raise ConfigError(
            source,
            [
                f"{field}: value {_cut(reference)}: not a profile name; allowed: a plain name "
                "(letters, digits, '.', '_', '-'; e.g. a100-sxm4-80gb) or a path ending in .yaml"
            ],
        )
    folders = search_path(extra)
    if problems := missing_dirs(extra):
        raise ConfigError(source, problems)
    for folder in folders:
        if (candidate := folder / f"{reference}{PROFILE_SUFFIX}").is_file():
            return candidate
    raise ConfigError(source, [_unknown(reference, field, folders)])


def _source_and_base(reference: str, relative_to: Path | None) -> tuple[str, Path]:
    if relative_to is None:
        return _cut(reference).strip("'"), Path.cwd()
    relative_to = Path(relative_to)
    if relative_to.is_dir():
        return str(relative_to), relative_to
    return str(relative_to), relative_to.parent


def _unknown(reference: str, field: str, folders: Sequence[Path]) -> str:
    known = known_profiles(folders)
    hint = did_you_mean(reference, known)
    return (
        f"{field}: value {reference!r}: unknown hardware profile{hint}; known profiles: "
        f"{', '.join(known) or '(none found)'} (searched {', '.join(str(f) for f in folders)}; "
        f"add a folder with --hwprofiles DIR or ${ENV_VAR}, or give a path to a .yaml profile)"
    )


def _cut(value: str) -> str:
    """`value` quoted, cut to a readable length (a reference may be hostile)."""
    return repr(value if len(value) <= _MAX_ECHO else value[:_MAX_ECHO] + "…")
