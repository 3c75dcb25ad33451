"""Load-time errors that name the file, the field, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError


class ConfigError(ValueError):
    """A scenario, hardware profile or sweep spec that cannot be used as written."""

    def __init__(self, source: str | Path, problems: list[str]) -> None:
        self.source = str(source)
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"{self.source}: invalid configuration\n{lines}")


def describe_validation_error(error: ValidationError) -> list[str]:
    """Turn pydantic's error list into 'field.path: value X: message' lines."""
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            problems.append(f"{field}: unknown key (value {item['input']!r}); check its spelling")
        elif item["type"] == "missing":
            problems.append(f"{field}: required key is missing")
        elif isinstance(item.get("input"), (dict, list)):
            problems.append(f"{field}: {message}")
        else:
            problems.append(f"{field}: value {item.get('input')!r}: {message}")
    return problems
