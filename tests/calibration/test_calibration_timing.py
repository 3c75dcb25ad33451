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


def test_issue_times_start_each_repeat_idle_and_mark_the_midpoint() -> None:
    """A call that sleeps 1 ms, marks, sleeps 1 ms: on a CPU the host's issue time of the
    first part is ≥ 1 ms, of the whole ≥ 2 ms, and the whole's time is the host's."""

    def call(mark) -> None:
        time.sleep(0.001)
        mark()
        time.sleep(0.001)

    repeats = Timer(CPU, TimingPolicy()).issue_times_s([call], 3)
    assert len(repeats) == 3
    for host_first, host_whole, whole in repeats:
        assert 0.001 <= host_first < host_whole and host_whole >= 0.002
        assert whole == host_whole


def test_a_short_layer_records_its_host_issue_time() -> None:
    """time_layer on a tiny layer (CPU) records the issue times (`ISSUE_MAX_S`), and the
    run's JSON keeps them; a run without them writes no such keys (older files unchanged)."""
    import dataclasses
    import json
    import math

    from simcluster.calibration.records import ISSUE_FIELDS, LayerRun
    from simcluster.calibration.shapes import DROPOUT_PROB, LayerShape
    from simcluster.config.choices import Recompute
    from simcluster.profiler.bench.device_info import describe_device
    from simcluster.profiler.bench.layer_timing import time_layer
    from simcluster.profiler.layer.spec import LayerSpec

    config = LayerShape(64, 8, 8, 1).config(2, False, Recompute.FULL)
    spec = LayerSpec.from_layer_config(config, dropout_prob=DROPOUT_PROB)
    policy = TimingPolicy(warmup=1, min_repeats=3, max_repeats=3, budget_s=0.0, max_buffers=1)
    assert time_layer(spec, Timer(CPU, policy), issue_max_s=0.0).host_total_s is None  # a "large" layer
    timing = time_layer(spec, Timer(CPU, policy), issue_max_s=math.inf)  # a shared CPU can be slow
    assert timing.host_forward_s is not None and timing.host_total_s is not None
    assert 0 < timing.host_forward_s < timing.host_total_s == timing.idle_start_total_s
    run = LayerRun(describe_device(CPU), "test", "quick", "bf16", DROPOUT_PROB, [timing])
    assert LayerRun.from_json(run.to_json()) == run
    bare = dataclasses.replace(run, timings=[dataclasses.replace(timing, **dict.fromkeys(ISSUE_FIELDS))])
    assert not set(ISSUE_FIELDS) & set(json.loads(bare.to_json())["timings"][0])
    assert LayerRun.from_json(bare.to_json()) == bare
