"""Links as first-come-first-served servers.

A link carries one transfer at a time, in the order transfers are issued (SimPy's
Resource with capacity 1 and FIFO queueing gives the same times). Because every transfer
is issued at the current simulation time, its start is simply max(now, free_at): no extra
events per transfer. Busy spans are recorded for the trace and the breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Link:
    name: str
    record: bool = False
    free_at_s: float = 0.0
    busy_s: float = 0.0
    spans: list[tuple[float, float, str]] = field(default_factory=list)

    def reserve(self, now_s: float, seconds: float, label: str = "") -> tuple[float, float]:
        """Queue a transfer issued at `now_s`; return its (start, end)."""
        start = max(now_s, self.free_at_s)
        end = start + seconds
        self.free_at_s = end
        self.busy_s += seconds
        if self.record:
            self.spans.append((start, seconds, label))
        return start, end
