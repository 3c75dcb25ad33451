"""The timer: warm-up, an estimate, bounded repeats, rotation over input sets."""

from __future__ import annotations

import time

import torch

from simcluster.profiler.bench.timing import CPU_CACHE_BYTES, Timer, TimingPolicy, cpu_threads, random_tensor

CPU = torch.device("cpu")


def test_repeats_rotate_over_every_input_set() -> None:
    """Three sets, 2 warm-ups (raised to 3: each set once), 3 to estimate, then 10 timed."""
    seen: list[int] = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    policy = TimingPolicy(warmup=2, min_repeats=10, max_repeats=10, budget_s=1.0)
    times = Timer(CPU, policy).times_s(calls)
    assert len(times) == 10
    assert seen[:3] == [0, 1, 2] and len(seen) == 3 + 3 + 10
    assert seen[-10:] == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]


def test_median_is_the_middle_of_the_timed_calls() -> None:
    """A 2 ms sleep times at 2 ms or a little more."""
    timer = Timer(CPU, TimingPolicy(warmup=1, min_repeats=3, max_repeats=3, budget_s=0.0))
    seconds = timer.median_s([lambda: time.sleep(0.002)])
    assert 0.002 <= seconds < 0.05


def test_input_sets_overflow_the_cache() -> None:
    """Sets of a quarter of the cache: 4 of them; sets bigger than the cache: 1; at most max_buffers."""
    timer = Timer(CPU, TimingPolicy(max_buffers=8))
    assert timer.num_buffers(CPU_CACHE_BYTES / 4) == 4
    assert timer.num_buffers(10 * CPU_CACHE_BYTES) == 1
    assert timer.num_buffers(1.0) == 8


def test_split_times_mark_the_midpoint() -> None:
    """A call that sleeps 1 ms, marks, sleeps 1 ms: first part ≥ 1 ms, whole ≥ 2 ms."""

    def call(mark) -> None:
        time.sleep(0.001)
        mark()
        time.sleep(0.001)

    for first, whole in Timer(CPU, TimingPolicy()).split_times_s([call], 3):
        assert 0.001 <= first < whole and whole >= 0.002


def test_random_inputs_are_never_zero() -> None:
    """Benchmarks run on normal draws, not zeros or constants."""
    gen = torch.Generator().manual_seed(0)
    x = random_tensor((1000,), torch.bfloat16, CPU, gen)
    assert (x != 0).float().mean() > 0.99 and x.float().std() > 0.5


def test_cpu_threads_are_restored() -> None:
    """One intra-op thread while measuring, the previous count after."""
    before = torch.get_num_threads()
    with cpu_threads(CPU, 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
