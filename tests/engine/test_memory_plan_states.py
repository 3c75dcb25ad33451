"""The memory estimate's peaks from in-flight states equal the replay of the task order
bit for bit wherever it uses them (whole bytes, sums below 2^53), and it replays otherwise."""

from hypothesis import given
from hypothesis import strategies as st

from simcluster.config.choices import ScheduleKind
from simcluster.memory_plan import exact_peaks, maximal_states, replayed_peaks
from simcluster.schedule import build_schedule
from simcluster.schedule.in_flight import chunk_in_flight_states


@st.composite
def orders(draw):
    kind = draw(st.sampled_from([ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE]))
    p = draw(st.integers(1, 8))
    v = draw(st.integers(1, 3))
    interleaved = kind is ScheduleKind.ONE_F_ONE_B and v > 1
    m = p * draw(st.integers(1, 6)) if interleaved else draw(st.integers(1, 40))
    r = draw(st.integers(0, p - 1))
    return build_schedule(kind, p, m, v)[r], v


@given(orders(), st.data())
def test_states_give_the_replayed_peaks_for_whole_bytes(order, data):
    tasks, v = order
    chunk_saved = [float(data.draw(st.integers(0, 2**40))) for _ in range(v)]
    transient = float(data.draw(st.integers(0, 2**40)))
    after_forward, before_backward = chunk_in_flight_states(tasks, v)
    peaks = exact_peaks((after_forward, before_backward), chunk_saved, transient)
    assert peaks is not None
    assert peaks == replayed_peaks(tasks, chunk_saved, transient)
    # the estimate keeps only the states no other one dominates
    pruned = maximal_states(after_forward), maximal_states(before_backward)
    assert pruned[0] <= after_forward and pruned[1] <= before_backward
    assert exact_peaks(pruned, chunk_saved, transient) == peaks


@given(orders(), st.data())
def test_fractional_or_huge_bytes_are_replayed(order, data):
    tasks, v = order
    states = chunk_in_flight_states(tasks, v)
    fractional = [data.draw(st.floats(0.5, 1e12)) + 0.25 for _ in range(v)]
    assert exact_peaks(states, fractional, 0.0) is None
    assert exact_peaks(states, [1.0] * v, 0.5) is None
    assert exact_peaks(states, [2.0**53] * v, 0.0) is None


def test_states_of_a_one_f_one_b_stage():
    """1F1B on 4 stages: rank r stashes up to min(p − r, m) microbatches; only the ends of
    runs of forwards and the starts of runs of backwards are kept."""
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, 4, 8, 1)
    after_forward, before_backward = chunk_in_flight_states(schedule[0], 1)
    assert after_forward == {(4,)} and before_backward == {(4,)}
    assert exact_peaks((after_forward, before_backward), [10.0], 3.0) == (40.0, 43.0)
    assert chunk_in_flight_states(schedule[3], 1) == ({(1,)}, {(1,)})
    # GPipe: all forwards then all backwards, two states in all
    gpipe = build_schedule(ScheduleKind.GPIPE, 4, 8, 2)[1]
    assert chunk_in_flight_states(gpipe, 2) == ({(8, 8)}, {(8, 8)})
