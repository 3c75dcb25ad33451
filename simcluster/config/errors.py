"""Load-time errors that name the file, the field, the value and what is allowed."""

from __future__ import annotations

import difflib
import reprlib
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

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


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model class inside a field's annotation (`Model`, `Model | None`, `list[Model]`,
    `dict[str, Model]`), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _submodel(arg)) is not None), None)


def known_keys(model: type[BaseModel], location: tuple[int | str, ...]) -> list[str]:
    """The keys allowed in the mapping that holds `location`'s last part (a misspelt key),
    walking `model`'s fields; list indices and dict keys on the way are stepped over."""
    current: type[BaseModel] | None = model
    for part in location[:-1]:
        if current is None:
            return []
        field = current.model_fields.get(str(part))
        if field is not None:
            current = _submodel(field.annotation)
    if current is None:
        return []
    return [field.alias or name for name, field in current.model_fields.items()]


def _unknown_key(item: Any, field: str, model: type[BaseModel] | None) -> str:
    known = known_keys(model, tuple(item["loc"])) if model is not None else []
    close = difflib.get_close_matches(str(item["loc"][-1]), known, n=1, cutoff=0.6) if item["loc"] else []
    hint = f"did you mean {close[0]!r}?" if close else "check its spelling"
    return f"{field}: unknown key (value {shorten(item['input'])}); {hint}"


def describe_validation_error(error: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """Turn pydantic's error list into 'field.path: value X: message' lines; with the
    `model` validated, a misspelt key gets a did-you-mean over the keys allowed there."""
    problems: list[str] = []
    for item in error.errors():
        if len(problems) == MAX_PROBLEMS:
            problems.append(f"… and {len(error.errors()) - MAX_PROBLEMS} more problems")
            break
        field = cut(".".join(str(part) for part in item["loc"]) or "(top level)", 200)
        message = cut(item["msg"].removeprefix("Value error, "), 400)
        if item["type"] == "extra_forbidden":
            problems.append(_unknown_key(item, field, model))
        elif item["type"] == "missing":
            problems.append(f"{field}: required key is missing")
        elif isinstance(item.get("input"), (dict, list)):
            problems.append(f"{field}: {message}")
        else:
            problems.append(f"{field}: value {shorten(item.get('input'))}: {message}")
    return problems
