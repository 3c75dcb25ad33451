"""Files shipped with simcluster: the hardware profiles and the paper's scenarios.

They live once, in the repository's top-level `hwprofiles/` and `scenarios/` folders; the
build maps those folders into the package (`setup.py`), so an installed wheel carries them
as package data `simcluster/hwprofiles/` and `simcluster/scenarios/`, read through
`importlib.resources`. A source checkout (editable install, PYTHONPATH) reads the top-level
folders themselves.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path

from simcluster.config.errors import ConfigError

SCENARIO_SUFFIX = ".yaml"
# a shipped scenario's name: "gpt3-175b-sp-selective", "paper", "paper/gpt3-175b-sp-selective"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def shipped_dir(name: str) -> Path:
    """The shipped folder `name` (`hwprofiles`, `scenarios`): package data in an install,
    the top-level folder in a source checkout."""
    packaged = _packaged(name)
    return packaged if packaged is not None else Path(__file__).resolve().parents[2] / name


def is_installed_copy(name: str) -> bool:
    """True when `name` is read from an installed package (not from a source checkout)."""
    return _packaged(name) is not None


def _packaged(name: str) -> Path | None:
    packaged = resources.files("simcluster") / name
    # pip unpacks wheels, so package data are real files (a zip import is not supported)
    return packaged if isinstance(packaged, Path) and packaged.is_dir() else None


def shipped_scenario(name: str) -> Path | None:
    """The shipped scenario file or folder `name` names (its stem, a folder such as `paper`,
    or `folder/stem`), or None. Only plain names: never a path out of the shipped folder."""
    if not _NAME.fullmatch(name):
        return None
    root = shipped_dir("scenarios")
    if (root / name).is_dir():
        return root / name
    if (root / f"{name}{SCENARIO_SUFFIX}").is_file():
        return root / f"{name}{SCENARIO_SUFFIX}"
    matches = sorted(root.glob(f"*/{name}{SCENARIO_SUFFIX}")) if "/" not in name else []
    return matches[0] if matches else None


def shipped_scenario_names() -> list[str]:
    """Every name `shipped_scenario` accepts: each folder, each stem and each `folder/stem`."""
    root = shipped_dir("scenarios")
    files = sorted(root.rglob(f"*{SCENARIO_SUFFIX}"))
    folders = {path.parent.relative_to(root).as_posix() for path in files} - {"."}
    stems = {path.stem for path in files}
    nested = {path.relative_to(root).with_suffix("").as_posix() for path in files}
    return sorted(folders | stems | nested)


def close_matches(word: str, known: list[str], n: int = 3) -> list[str]:
    """The names in `known` a person may have meant by `word`: difflib's closest match, else
    the names `word` starts (`h100` -> `h100-sxm5-80gb`; `a100` -> both A100 profiles), at
    most `n`."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    if not close and word:
        lowered = word.lower()
        close = [name for name in known if name.lower().startswith(lowered)][:n]
    return close


def did_you_mean(word: str, known: list[str]) -> str:
    """' (did you mean 'x'?)', ' (did you mean 'x' or 'y'?)', or '' when nothing is close."""
    close = close_matches(word, known)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def resolve_scenario(target: str | Path, folders: bool = False) -> Path:
    """What a command's SCENARIO argument names: an existing file (or, with `folders`, a
    folder of scenarios), else a shipped scenario's name (`gpt3-175b-sp-selective`,
    `paper/gpt-22b-sp-selective`, or with `folders` a shipped folder such as `paper`).
    Every command that reads a scenario resolves it here, so each accepts what `run`
    accepts. Raises ConfigError naming the argument, with a did-you-mean over the shipped
    names."""
    path = Path(target)
    if path.is_file() or (folders and path.is_dir()):
        return path
    if path.is_dir():
        raise ConfigError(path, ["is a folder; give a scenario file (.yaml)"])
    shipped = shipped_scenario(str(target))
    if shipped is not None and (folders or shipped.is_file()):
        return shipped
    if shipped is not None:
        example = next(iter(sorted(shipped.glob(f"*{SCENARIO_SUFFIX}"))), None)
        sample = f", e.g. {target}/{example.stem}" if example else ""
        raise ConfigError(path, [f"names a folder of shipped scenarios; give one of them{sample}"])
    what = "file or folder" if folders else "file"
    hint = did_you_mean(str(target), shipped_scenario_names()) or " (e.g. paper, gpt3-175b-sp-selective)"
    raise ConfigError(path, [f"no such scenario {what}, nor a shipped scenario{hint}"])
