"""Garbage-collector settings for simulation runs.

A simulation allocates hundreds of thousands of short-lived SimPy events; with CPython's
default first-generation threshold (700) the collector runs thousands of times and took
~20 % of the time (the gbs-1536 sweep of benchmarks/bench_sweep.py on one core: 16.5 s,
13.3 s with these thresholds, 13.1 s with no collection at all). Collections still run,
just far fewer of them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLDS = (50_000, 20, 100)


@contextmanager
def simulation_gc() -> Iterator[None]:
    """Objects alive now are frozen (never rescanned) and the first-generation threshold
    raised; both restored on exit."""
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
