"""Input checks shared by the schedule builders: fail early, naming the value."""

from __future__ import annotations


def require_positive(name: str, value: int) -> None:
    """Raise ValueError unless `value` is an int ≥ 1 (bools are rejected too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def require_stage(stage: int, num_stages: int) -> None:
    """Raise ValueError unless 0 ≤ stage < num_stages."""
    require_positive("num_stages", num_stages)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < num_stages:
        raise ValueError(f"stage must be in [0, {num_stages}), got {stage!r}")


def require_chunk(chunk: int, num_chunks: int) -> None:
    """Raise ValueError unless 0 ≤ chunk < num_chunks."""
    require_positive("num_chunks", num_chunks)
    if not 0 <= chunk < num_chunks:
        raise ValueError(f"chunk must be in [0, {num_chunks}), got {chunk!r}")
