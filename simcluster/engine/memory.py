"""Per-stage memory tracker: static bytes plus activations stored between a chunk's
forward and its backward, plus transient bytes while a task runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class MemoryTracker:
    static_bytes: float
    stored_bytes: float = 0.0
    transient_bytes: float = 0.0
    peak_stored_bytes: float = 0.0
    peak_total_bytes: float = 0.0

    def __post_init__(self) -> None:
        self.peak_total_bytes = self.static_bytes

    def _observe(self) -> None:
        self.peak_stored_bytes = max(self.peak_stored_bytes, self.stored_bytes)
        total = self.static_bytes + self.stored_bytes + self.transient_bytes
        self.peak_total_bytes = max(self.peak_total_bytes, total)

    def store(self, num_bytes: float) -> None:
        self.stored_bytes += num_bytes
        self._observe()

    def release(self, num_bytes: float) -> None:
        self.stored_bytes -= num_bytes
        if self.stored_bytes < -1e-6 * max(1.0, num_bytes):
            raise RuntimeError("memory tracker: freed more activation bytes than were stored")

    def hold(self, num_bytes: float) -> None:
        self.transient_bytes += num_bytes
        self._observe()

    def drop(self, num_bytes: float) -> None:
        self.transient_bytes -= num_bytes
