"""Timing kernels and layers the way the device method asks: warm up, device events,
median of many repeats, rotating input buffers, random data.

    timer = Timer(torch.device("cuda"), TimingPolicy.for_device("cuda"))
    seconds = timer.median_s([call_on_buffer_0, call_on_buffer_1, ...])

CUDA: every call is bracketed by a pair of CUDA events recorded on the current stream; the
host does not wait between calls (it runs ahead, as in eager training), the stream is
synchronized once after the last call, and each call's time is `start.elapsed_time(end)`.
If the host cannot keep the GPU busy (tiny kernels), the gap shows up in the event time,
as it would in the real layer. CPU: kernels run synchronously in the calling thread, so
`time.perf_counter()` around each call is the time, with no synchronization.

The calls rotate over several independent input sets (one closure per set), enough that
together they exceed `cache_bytes` (twice the GPU's L2; a few MiB on a CPU), so no repeat
finds its inputs in cache from the previous one. The number of repeats adapts to the
kernel: `budget_s` of timed calls, between `min_repeats` and `max_repeats`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

Call = Callable[[], object]

CPU_CACHE_BYTES = 8 * 1024**2  # rotate past a couple of MiB of per-core L2


@dataclass(frozen=True)
class TimingPolicy:
    """How hard to look: warm-up calls, repeat bounds, seconds of timed calls per kernel."""

    warmup: int = 3
    min_repeats: int = 10
    max_repeats: int = 200
    budget_s: float = 0.05
    max_buffers: int = 8

    @staticmethod
    def for_device(device_type: str, quick: bool = False) -> TimingPolicy:
        if device_type == "cuda":
            return TimingPolicy(warmup=3, min_repeats=10, max_repeats=200, budget_s=0.02 if quick else 0.05)
        if quick:
            return TimingPolicy(warmup=1, min_repeats=3, max_repeats=15, budget_s=0.004, max_buffers=2)
        return TimingPolicy(warmup=2, min_repeats=5, max_repeats=50, budget_s=0.05, max_buffers=4)


class Timer:
    """Times closures on one device under one policy."""

    def __init__(self, device: torch.device, policy: TimingPolicy) -> None:
        self.device = device
        self.policy = policy
        self.is_cuda = device.type == "cuda"

    @property
    def cache_bytes(self) -> int:
        if self.is_cuda:
            return 2 * int(
                getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 50 * 1024**2)
            )
        return CPU_CACHE_BYTES

    def num_buffers(self, set_bytes: float) -> int:
        """Input sets to rotate over so that together they overflow the cache."""
        wanted = math.ceil(self.cache_bytes / max(set_bytes, 1.0))
        return max(1, min(self.policy.max_buffers, wanted))

    def median_s(self, calls: Sequence[Call]) -> float:
        """Median seconds of one call, rotating over `calls` (one per input set)."""
        return statistics.median(self.times_s(calls))

    def times_s(self, calls: Sequence[Call]) -> list[float]:
        """Per-call seconds of the timed repeats (after warm-up and a 3-call estimate)."""
        for i in range(max(self.policy.warmup, len(calls))):
            calls[i % len(calls)]()
        estimate = statistics.median(self._run(calls, 3))
        wanted = int(self.policy.budget_s / max(estimate, 1e-9))
        repeats = max(self.policy.min_repeats, min(self.policy.max_repeats, wanted))
        return self._run(calls, repeats)

    def _run(self, calls: Sequence[Call], repeats: int) -> list[float]:
        if self.is_cuda:
            return _cuda_times(calls, repeats)
        times = []
        for i in range(repeats):
            start = time.perf_counter()
            calls[i % len(calls)]()
            times.append(time.perf_counter() - start)
        return times

    def split_times_s(
        self, calls: Sequence[Callable[[Callable[[], None]], object]], repeats: int
    ) -> list[tuple[float, float]]:
        """(first part, whole) seconds per repeat of calls that mark their midpoint.

        Each call receives a `mark()` to invoke between its two parts (forward, then
        backward): on CUDA an event recorded there, on CPU a perf_counter reading.
        """
        if self.is_cuda:
            return _cuda_split_times(calls, repeats)
        out = []
        marks: list[float] = []

        def mark() -> None:
            marks.append(time.perf_counter())

        for i in range(repeats):
            start = time.perf_counter()
            calls[i % len(calls)](mark)
            end = time.perf_counter()
            out.append((marks[-1] - start, end - start))
        return out

    def issue_times_s(
        self, calls: Sequence[Callable[[Callable[[], None]], object]], repeats: int
    ) -> list[tuple[float, float, float]]:
        """(host seconds to issue the first part, host seconds to issue the whole, seconds the
        whole takes from an idle device) per repeat of calls that mark their midpoint.

        Each repeat starts on an idle device (CUDA: synchronized first), so the host's
        `perf_counter` from the start to the mark and to the call's return is its issue time,
        never throttled by a full launch queue, and the events give the repeat's time with
        the GPU waiting wherever the host falls behind: the one-repeat pipeline
        `calibration.check.host_pipeline_s` models. The timed repeats (`split_times_s`) run
        back to back instead, where the host may run ahead into the next repeat. On a CPU the
        three are the same `perf_counter` readings (kernels run in the calling thread).
        """
        return [_issue_once(calls[i % len(calls)], self.is_cuda) for i in range(repeats)]


def _issue_once(call: Callable[[Callable[[], None]], object], is_cuda: bool) -> tuple[float, float, float]:
    """One repeat of `Timer.issue_times_s`."""
    marks: list[float] = []
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if is_cuda else []

    def mark() -> None:
        marks.append(time.perf_counter())
        if events:
            events[1].record()

    if events:
        torch.cuda.synchronize()
    begin = time.perf_counter()
    if events:
        events[0].record()
    call(mark)
    issued = time.perf_counter()
    whole = issued - begin
    if events:
        events[2].record()
        torch.cuda.synchronize()
        whole = events[0].elapsed_time(events[2]) * 1e-3  # ms -> s
    return marks[-1] - begin, issued - begin, whole


def _cuda_times(calls: Sequence[Call], repeats: int) -> list[float]:
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)
    ]
    torch.cuda.synchronize()
    for i, (start, end) in enumerate(events):
        start.record()
        calls[i % len(calls)]()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e-3 for start, end in events]  # ms -> s


def _cuda_split_times(
    calls: Sequence[Callable[[Callable[[], None]], object]], repeats: int
) -> list[tuple[float, float]]:
    def new() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    events = [(new(), new(), new()) for _ in range(repeats)]
    torch.cuda.synchronize()
    for i, (start, mid, end) in enumerate(events):
        start.record()
        calls[i % len(calls)](mid.record)
        end.record()
    torch.cuda.synchronize()
    return [(start.elapsed_time(mid) * 1e-3, start.elapsed_time(end) * 1e-3) for start, mid, end in events]


def median_and_spread(times: list[float]) -> tuple[float, float]:
    """(median, interquartile range over the median) of per-call seconds."""
    ordered = sorted(times)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    spread = (ordered[(3 * n) // 4] - ordered[n // 4]) / median if median > 0 else 0.0
    return median, spread


def random_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    scale: float = 1.0,
) -> torch.Tensor:
    """Normal(0, scale²) values drawn on the device: never zeros, never a constant."""
    values = torch.randn(tuple(shape), generator=generator, device=device, dtype=dtype)
    return values if scale == 1.0 else values.mul_(scale)


def device_generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


@contextlib.contextmanager
def cpu_threads(device: torch.device, num_threads: int | None) -> Iterator[None]:
    """Run a CPU measurement with `num_threads` intra-op threads (restored after).

    One thread is the default for CPU runs: on a shared machine a second worker thread
    waits on the scheduler at every parallel region, and kernels that take tens of µs
    come out at milliseconds. GPUs ignore this.
    """
    if device.type != "cpu" or not num_threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
