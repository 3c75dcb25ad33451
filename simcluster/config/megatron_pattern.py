"""Megatron-LM's per-layer pattern arguments (`--moe-layer-freq`, `--window-attn-skip-freq`)
read without `eval`, and `--window-size`'s tuple.

Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/training/arguments.py:
`moe_freq_type` takes an integer, or a string with a `[` that `_eval_pattern` checks against
the characters `,0-9[]()+*` and then `eval`s, e.g. "([0]*3+[1]*58)"; `tuple_type` reads
"w,0" or "(w,0)" as a tuple of ints. Here the same strings are read by walking their Python
syntax tree, allowing only integers, lists, `+` and `*`, so a launch line never runs code.
"""

from __future__ import annotations

import ast
import re

# _eval_pattern's own test: anything else makes Megatron raise "Invalid pattern".
_MEGATRON_PATTERN_CHARS = re.compile(r"[^,\d\[\]\(\)\+\*]")
# A per-layer list is as long as the model; bound it so "[1]*10**9"-like input cannot exhaust memory.
MAX_PATTERN_LENGTH = 100_000


class PatternError(ValueError):
    """A pattern Megatron would refuse, or one too large to be a layer list."""


def _value(node: ast.expr) -> int | list[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_value(item) for item in node.elts]
        if not all(isinstance(item, int) for item in items):
            raise PatternError("a list holds integers only")
        return [item for item in items if isinstance(item, int)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        return _combine(node.op, _value(node.left), _value(node.right))
    raise PatternError(f"{type(node).__name__} is not allowed (integers, lists, + and * only)")


def _combine(op: ast.operator, left: int | list[int], right: int | list[int]) -> int | list[int]:
    if isinstance(op, ast.Add):
        if isinstance(left, list) != isinstance(right, list):
            raise PatternError("+ joins two lists or two integers")
        total = left + right  # type: ignore[operator]  # both lists or both ints
        if isinstance(total, list) and len(total) > MAX_PATTERN_LENGTH:
            raise PatternError(f"longer than {MAX_PATTERN_LENGTH:,} entries")
        return total
    if isinstance(left, list) and isinstance(right, list):
        raise PatternError("* repeats a list an integer number of times")
    if isinstance(left, int) and isinstance(right, int):
        if abs(left * right) > MAX_PATTERN_LENGTH:
            raise PatternError(f"a count above {MAX_PATTERN_LENGTH:,}")
        return left * right
    items, times = (left, right) if isinstance(left, list) else (right, left)
    assert isinstance(items, list) and isinstance(times, int)
    if len(items) * max(times, 0) > MAX_PATTERN_LENGTH:
        raise PatternError(f"longer than {MAX_PATTERN_LENGTH:,} entries")
    return items * times


def parse_layer_pattern(text: str) -> int | list[int]:
    """An integer, or the list a Megatron pattern string such as "([0]*3+[1]*58)" evaluates to.

    Raises PatternError for what Megatron's `moe_freq_type` would refuse (other characters,
    e.g. spaces or letters) and for anything that is not an integer or a list of integers.
    """
    text = text.strip()
    if "[" not in text:  # moe_freq_type: "a single int but in str"
        try:
            return int(text)
        except ValueError:
            raise PatternError("expected an integer or a list pattern such as ([0]*3+[1]*58)") from None
    if bad := _MEGATRON_PATTERN_CHARS.search(text):
        raise PatternError(f"character {bad.group()!r}: Megatron allows only , digits [ ] ( ) + *")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise PatternError("not a well-formed list expression") from None
    value = _value(tree.body)
    if not isinstance(value, list):
        raise PatternError("a pattern with [ ] must evaluate to a list")
    return value


def leading_zeros(pattern: list[int]) -> int | None:
    """k where `pattern` is [0]*k + [1]*(len - k), else None."""
    k = next((i for i, entry in enumerate(pattern) if entry != 0), len(pattern))
    return k if all(entry == 1 for entry in pattern[k:]) else None


def skip_frequency(pattern: list[int]) -> int | None:
    """The integer N whose rule gives `pattern` (1 = sliding window, 0 = full attention):
    Megatron-core's `is_layer_window_attention` (megatron/core/transformer/utils.py) makes
    1-based layer n a window layer when n % N != 0; None when no N does, 0 when every layer
    is a window layer (the same as no skip frequency)."""
    if pattern and all(entry == 1 for entry in pattern):
        return 0
    for every in range(1, len(pattern) + 1):
        if pattern == [int(layer % every != 0) for layer in range(1, len(pattern) + 1)]:
            return every
    return None


def parse_window(text: str) -> tuple[int, ...]:
    """`tuple_type`: "w,0" or "(w,0)" as a tuple of ints."""
    try:
        return tuple(int(part) for part in text.strip().strip("()").split(","))
    except ValueError:
        raise PatternError("expected integers separated by a comma, such as 128,0") from None
