"""Load-time errors that name the file, the field, the value and what is allowed."""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

MAX_SHOWN_CHARS = 120  # a value quoted in an error is cut to this (never echo a megabyte)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 3, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = MAX_SHOWN_CHARS, MAX_SHOWN_CHARS, 40


MAX_PROBLEMS = 20  # listed per file; the rest are counted


def cut(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text`, or its start and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 30, 10)]}… ({len(text):,} characters in all)"


def shorten(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """repr(value) bounded in work and length (reprlib stops at a few items per level)."""
    return cut(_REPR.repr(value), limit)


class ConfigError(ValueError):
    """A scenario, hardware profile or sweep spec that cannot be used as written."""

    def __init__(self, source: str | Path, problems: list[str]) -> None:
        self.source = str(source)
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"{self.source}: invalid configuration\n{lines}")


def describe_validation_error(error: ValidationError) -> list[str]:
    """Turn pydantic's error list into 'field.path: value X: message' lines."""
    problems: list[str] = []
    for item in error.errors():
        if len(problems) == MAX_PROBLEMS:
            problems.append(f"… and {len(error.errors()) - MAX_PROBLEMS} more problems")
            break
        field = cut(".".join(str(part) for part in item["loc"]) or "(top level)", 200)
        message = cut(item["msg"].removeprefix("Value error, "), 400)
        if item["type"] == "extra_forbidden":
            problems.append(f"{field}: unknown key (value {shorten(item['input'])}); check its spelling")
        elif item["type"] == "missing":
            problems.append(f"{field}: required key is missing")
        elif isinstance(item.get("input"), (dict, list)):
            problems.append(f"{field}: {message}")
        else:
            problems.append(f"{field}: value {shorten(item.get('input'))}: {message}")
    return problems
