"""Layouts in order of increasing time bound, computing the full bound lazily.

Each layout enters with a cheap bound (`plan.layer_bound`, never above its full bound) or
its full one. A heap keyed by (bound, enumeration index) pops its front; a cheap entry at
the front is refined (its full bound computed) and pushed back, a full one is next. This
is the order of sorting every layout by (full bound, index): when a full entry (b, i) is at
the front, every other entry's key is ≥ (b, i), and a cheap key only grows when refined.
So the layouts after the search's stopping point, usually most of them, never need their
full bound (a workload and its stage prices); the search's answer and counts are unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar


class Bounded(Protocol):
    """What the order reads of a layout (`plan.search.Candidate`)."""

    @property
    def index(self) -> int: ...
    @property
    def bound_s(self) -> float: ...
    @property
    def bound_exact(self) -> bool: ...


Candidate = TypeVar("Candidate", bound=Bounded)


class BoundOrder(Generic[Candidate]):
    """Candidates by increasing (full bound, index); `refine` turns a cheap candidate
    (`bound_exact` False) into its full-bound one."""

    def __init__(self, candidates: Iterable[Candidate], refine: Callable[[Candidate], Candidate]) -> None:
        # the index is unique, so tuple comparison never reaches the candidate
        self._heap = [(c.bound_s, c.index, c) for c in candidates]
        heapq.heapify(self._heap)
        self._refine = refine
        self.refined = 0

    def __len__(self) -> int:
        return len(self._heap)

    def peek(self) -> Candidate:
        """The next layout, its full bound computed (IndexError when none is left)."""
        while not self._heap[0][2].bound_exact:
            candidate = self._refine(heapq.heappop(self._heap)[2])
            assert candidate.bound_exact
            self.refined += 1
            heapq.heappush(self._heap, (candidate.bound_s, candidate.index, candidate))
        return self._heap[0][2]

    def pop(self) -> Candidate:
        candidate = self.peek()
        heapq.heappop(self._heap)
        return candidate

    def clear(self) -> None:
        self._heap.clear()
