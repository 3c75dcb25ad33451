"""How the refactor golden captures (issue 18) compare with today's numbers."""

from __future__ import annotations


def kept(old: object, new: object) -> bool:
    """`new` holds every number of `old`, equal (`==`, floats bit for bit). Keys added since
    the capture pass (the scenario and result contract grows by adding keys, never by
    renaming or dropping one); a key that vanished or a value that moved is a change."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(key in new and kept(value, new[key]) for key, value in old.items())
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(kept(a, b) for a, b in zip(old, new, strict=True))
    return old == new
