"""The base of every file-backed model: unknown keys are errors, and numbers are never
guessed from other types.

pydantic's lax mode reads `tp: true` as 1, `num_layers: 96.0` as 96 and `"8"` as 8. A
configuration file says what it means, so here:
- an integer field takes a YAML integer only (not a boolean, not a float such as
  `1.0e9`: write `1000000000`; YAML 1.1 reads `1e9` as a string anyway);
- a float field takes a YAML integer or float, not a boolean or a string;
- a boolean field takes `true` / `false` only;
- an integer is at most 2³¹ - 1 in size, and a float is finite (no `.inf`, no `.nan`).
The check reads each field's annotation, so a numeric field added later is covered without
naming it. Enums, Literals and strings keep pydantic's own checks.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_EXPECTED = {int: "an integer", float: "a number", bool: "true or false"}
_KINDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}
MAX_INT = 2**31 - 1  # Megatron's sizes are int32; larger values only feed loops and overflows


def _mismatch(value: Any, annotation: Any) -> str | None:
    """Why `value` may not be read as `annotation`, or None when it may (or pydantic decides)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        reasons = [_mismatch(value, member) for member in get_args(annotation)]
        return None if any(reason is None for reason in reasons) else next(r for r in reasons if r)
    if annotation is type(None):
        return None if value is None else "not null"
    if annotation is bool:
        return None if isinstance(value, bool) else _describe(value, bool)
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and abs(value) > MAX_INT:
            return f"must be at most {MAX_INT:,}"
        return None if ok else _describe(value, int)
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else _describe(value, float)
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        if origin is tuple and len(args) == len(value) and Ellipsis not in get_args(annotation):
            pairs = list(zip(value, args))
        else:
            pairs = [(item, args[0]) for item in value] if args else []
        return next((reason for item, arg in pairs if (reason := _mismatch(item, arg))), None)
    if origin is dict and isinstance(value, dict):
        item_type = get_args(annotation)[1] if get_args(annotation) else Any
        return next((reason for item in value.values() if (reason := _mismatch(item, item_type))), None)
    return None


def _describe(value: Any, expected: type) -> str:
    hint = ""
    if expected is int and isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        hint = f" (write {int(value)})"
    kind = _KINDS.get(type(value), f"a {type(value).__name__}")
    return f"must be {_EXPECTED[expected]}, not {kind}{hint}"


class StrictModel(BaseModel):
    """Frozen, unknown keys forbidden, no type guessing for numbers and booleans."""

    # allow_inf_nan: `inf` and `.nan` are valid YAML floats but never a valid quantity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _exact_types(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        reason = _mismatch(value, cls.model_fields[info.field_name].annotation)
        if reason is not None:
            raise ValueError(reason)
        return value
