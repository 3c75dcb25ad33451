"""A launch command line as Megatron flags: shell words, flags with their values, typed reads."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from simcluster.config.errors import ConfigError
from simcluster.config.megatron_flags import SOURCE


def split_command_line(command: str | Sequence[str]) -> list[str]:
    """Shell words of a command line (backslash-newline continuations joined). A sequence
    is taken as already split, except that items holding spaces are split again. A quote
    left open (shlex's ValueError) is a ConfigError."""
    try:
        if isinstance(command, str):
            return shlex.split(command.replace("\\\n", " "), comments=True)
        return [word for item in command for word in (shlex.split(item) if " " in item else [item])]
    except ValueError as error:  # "No closing quotation", "No escaped character"
        problem = f"command line: {error}; allowed: balanced single and double quotes, no trailing backslash"
        raise ConfigError(SOURCE, [problem]) from None


def _is_flag(word: str) -> bool:
    return word.startswith("--") and len(word) > 2


def collect_flags(words: Sequence[str]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """(flags, repeated flags, other words). A flag's values are the words up to the next
    `--flag`; names are normalised to Megatron's dashed lower case. Words before the first
    flag, a `*.py` script and `$VARIABLES` (python, torchrun, env vars) are not values."""
    flags: dict[str, list[str]] = {}
    repeated: list[str] = []
    launcher: list[str] = []
    current: list[str] | None = None
    for word in words:
        if _is_flag(word):
            name, _, value = word[2:].partition("=")
            name = name.replace("_", "-").lower()
            if name in flags:
                repeated.append(name)
            current = flags[name] = [value] if value else []
        elif word.endswith(".py") or word.startswith("$") or current is None:
            launcher.append(word)
            current = None
        else:
            current.append(word)
    return flags, repeated, launcher


def shown(name: str, values: list[str]) -> str:
    """A flag as it was written."""
    return shlex.join([f"--{name}", *values])


class FlagReader:
    """Typed access to the collected flags, gathering every problem before failing."""

    def __init__(self, flags: dict[str, list[str]]) -> None:
        self.flags = flags
        self.problems: list[str] = []

    def has(self, name: str) -> bool:
        return name in self.flags

    def switch(self, name: str) -> bool:
        if name in self.flags and self.flags[name]:
            self.problems.append(f"--{name}: takes no value, got {' '.join(self.flags[name])!r}")
        return name in self.flags

    def values(self, name: str) -> list[str] | None:
        return self.flags.get(name)

    def text(self, name: str) -> str | None:
        values = self.flags.get(name)
        if values is None:
            return None
        if len(values) != 1:
            self.problems.append(f"--{name}: expected one value, got {len(values)}: {values}")
            return None
        return values[0]

    def choice(self, name: str, allowed: dict[str, str]) -> str | None:
        """The value mapped through `allowed` (Megatron's spelling -> the scenario's)."""
        value = self.text(name)
        if value is None:
            return None
        if value not in allowed:
            self.problems.append(f"--{name}: value {value!r}: allowed: {', '.join(allowed)}")
            return None
        return allowed[value]

    def number(self, name: str) -> float | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            self.problems.append(f"--{name}: value {value!r}: expected a number")
            return None

    def integer(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            self.problems.append(f"--{name}: value {value!r}: expected an integer")
            return None
