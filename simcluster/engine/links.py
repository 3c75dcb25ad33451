"""Links: what a plan names (`Link`, typed) and what the engine queues on (`LinkQueue`).

A plan's transfers and collectives say which link they occupy with a `Link`: its kind (the
hardware it crosses), its scope (one pipeline stage's own port, or one shared by a group of
stages) and its name, which is the engine's key (two transfers on links of one name queue
behind each other) and the trace's row.

A `LinkQueue` carries one transfer at a time, in the order transfers are issued (SimPy's
Resource with capacity 1 and FIFO queueing gives the same times). Because every transfer
is issued at the current simulation time, its start is simply max(now, free_at): no extra
events per transfer. Busy spans are recorded for the trace and the breakdown.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class LinkKind(str, enum.Enum):
    """The hardware a link crosses (the value is the first part of a stage link's name)."""

    NVLINK = "nvlink"  # inside the NVLink domain (a node's NVSwitch, or NVL72's)
    NIC = "nic"  # InfiniBand / RoCE through the node's NICs
    PCIE = "pcie"  # a PCIe path (host, or GPUs without NVLink)


class LinkScope(str, enum.Enum):
    STAGE = "stage"  # one pipeline stage's own port: only that stage's transfers queue on it
    GROUP = "group"  # shared by the stages of a group: their transfers queue on one link


@dataclass(frozen=True, slots=True)
class Link:
    """A typed link of a plan. `name` identifies it (the engine queues transfers on links
    of one name FIFO, and the trace draws one row per name)."""

    kind: LinkKind
    scope: LinkScope
    name: str

    @classmethod
    def of_stage(cls, kind: LinkKind, stage: int, channel: str | None = None) -> Link:
        """Stage `stage`'s own link of `kind`, named `kind:stage`, or `channel:stage` for a
        communicator with a channel of its own (the distributed optimizer's `dp:` link)."""
        return cls(kind, LinkScope.STAGE, f"{channel or kind.value}:{stage}")

    @classmethod
    def group(cls, kind: LinkKind, name: str) -> Link:
        return cls(kind, LinkScope.GROUP, name)

    @classmethod
    def parse(cls, name: str) -> Link:
        """A link from the earlier spelling `kind:stage` (`nvlink:3`, `nic:0`; `dp:2` is the
        distributed optimizer's channel, taken as the NIC), or `kind:anything-else` for a
        link shared by a group (`nic:shared`)."""
        prefix, sep, rest = name.partition(":")
        kinds = {kind.value: kind for kind in LinkKind} | {"dp": LinkKind.NIC}
        if not sep or prefix not in kinds or not rest:
            allowed = ", ".join(sorted(kinds))
            raise ValueError(f"link {name!r}: expected KIND:STAGE or KIND:GROUP with KIND one of {allowed}")
        scope = LinkScope.STAGE if rest.isdigit() else LinkScope.GROUP
        return cls(kinds[prefix], scope, name)

    def __str__(self) -> str:
        return self.name


def as_link(link: Link | str) -> Link:
    """`link` typed (the earlier string spelling is parsed by `Link.parse`)."""
    return link if isinstance(link, Link) else Link.parse(link)


@dataclass(slots=True)
class LinkQueue:
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
