"""Host and device timelines of check-profile's runs, phase by phase, beside what was measured.

    python -m simcluster.calibration.host_timeline PROFILE --measurements layer_timing.json \
        [--hidden-size H] [--micro-batch-size B] [--tp T] [--json]

check-profile prices a run's device time (`check.predict_config`) and marks it host-bound
where the host's issue time (`check.host_pipeline_s`: one op every `host_per_op_s`, plus the
checkpoint terms where the profile has them) makes it 5 % slower. This prints what that
decision rests on, for each run: the device seconds of the forward, the recompute and the
backward, the host seconds the profile charges for issuing each, the two-stage pipeline of
one repeat (`with_host_s`, what check-profile uses), the steady state of back-to-back repeats
(`overlapped_s = max(host, device)`: the timer records them without a synchronisation
between repeats, `profiler.bench.timing.Timer.split_times_s`, so over many repeats the slower
stage sets the pace), and the measured forward and forward + backward; where the run
recorded them (`profiler.bench.layer_timing`, layers of at most `ISSUE_MAX_S`), the host's
measured issue time of forward + backward (`m host`) and the GPU time of a repeat started on an
idle device (`m idle`): a run whose `m host` exceeds its device time is host-bound; one whose
back-to-back time exceeds both its `m host` and its device time has host work that does not
overlap the device's.

`recompute_excess` reads the measurements alone: for each (shape, t, SP) timed with full and
with no recompute, the measured difference minus one measured forward, over that forward. Full
recompute re-runs the forward once (`workload.layer`), so on the device the difference is one
forward; an excess is what the device does not explain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from simcluster.calibration.check import (
    checkpoint_host,
    checkpoint_host_before_s,
    host_per_op_s,
    host_pipeline_s,
    predict_config,
)
from simcluster.calibration.records import LayerRun, LayerTiming
from simcluster.config.hardware import HardwareProfile


@dataclass(frozen=True)
class Timeline:
    """One run: priced device and host seconds by phase, the two host models, the measurement."""

    hidden_size: int
    micro_batch_size: int
    tp: int
    sequence_parallel: bool
    recompute: str
    ops: tuple[int, int, int]  # priced ops of forward, recompute, backward
    device_s: tuple[float, float, float]  # forward, recompute, backward
    host_s: tuple[float, float, float]  # their issue time as the profile prices it
    with_host_s: float  # check.host_pipeline_s: one repeat, host and device starting together
    measured_forward_s: float | None
    measured_total_s: float
    # the host's measured issue time of forward + backward and the GPU time of a repeat
    # started idle (`records.LayerTiming`, where the run recorded them; None in older files)
    measured_host_total_s: float | None = None
    measured_idle_start_s: float | None = None

    @property
    def device_total_s(self) -> float:
        return sum(self.device_s)

    @property
    def host_total_s(self) -> float:
        return sum(self.host_s)

    @property
    def overlapped_s(self) -> float:
        """Back-to-back repeats with no synchronisation: the slower stage sets the pace."""
        return max(self.host_total_s, self.device_total_s)

    @property
    def host_bound(self) -> bool:
        """In the profile's own terms: the host issues the run more slowly than the GPU runs it."""
        return self.host_total_s > self.device_total_s

    @property
    def error(self) -> float:
        """Device prediction / measured − 1, as check-profile reports it."""
        return self.device_total_s / self.measured_total_s - 1


def timeline(timing: LayerTiming, hw: HardwareProfile, dropout_prob: float) -> Timeline:
    """`timing`'s phases priced by `hw` exactly as `check.compare` prices them."""
    cfg = timing.layer_config(dropout_prob)
    p = predict_config(cfg, hw)
    per_op = host_per_op_s(hw)
    before = checkpoint_host_before_s(cfg, p, checkpoint_host(hw))
    nf, nr = p.num_forward_ops, p.num_recompute_ops
    phases = ((0, nf), (nf, nf + nr), (nf + nr, p.num_ops))
    device = tuple(sum(p.op_s[a:b]) for a, b in phases)
    host = tuple((b - a) * per_op + sum(v for i, v in before.items() if a <= i < b) for a, b in phases)
    return Timeline(
        timing.hidden_size,
        timing.micro_batch_size,
        timing.tp,
        timing.sequence_parallel,
        timing.recompute,
        (nf, nr, p.num_ops - nf - nr),
        device,  # type: ignore[arg-type]
        host,  # type: ignore[arg-type]
        host_pipeline_s(p.op_s, per_op, before) if per_op else 0.0,
        timing.forward_s,
        timing.total_s,
        timing.host_total_s,
        timing.idle_start_total_s,
    )


@dataclass(frozen=True)
class RecomputeExcess:
    """Measured full − no recompute of one (shape, t, SP), against one measured forward."""

    hidden_size: int
    micro_batch_size: int
    tp: int
    sequence_parallel: bool
    forward_s: float  # the full-recompute run's measured forward
    difference_s: float  # total(full) − total(none)

    @property
    def excess_s(self) -> float:
        """What one re-run forward does not explain."""
        return self.difference_s - self.forward_s

    @property
    def excess(self) -> float:
        return self.excess_s / self.forward_s


def recompute_excess(run: LayerRun) -> list[RecomputeExcess]:
    """Every (shape, t, SP) of `run` timed with both full and no recompute (forward recorded)."""
    key = lambda t: (t.hidden_size, t.micro_batch_size, t.tp, t.sequence_parallel, t.name)  # noqa: E731
    none = {key(t): t for t in run.timings if t.recompute == "none"}
    out = []
    for full in run.timings:
        base = none.get(key(full))
        if full.recompute != "full" or base is None or full.forward_s is None:
            continue
        out.append(
            RecomputeExcess(
                full.hidden_size,
                full.micro_batch_size,
                full.tp,
                full.sequence_parallel,
                full.forward_s,
                full.total_s - base.total_s,
            )
        )
    return out


@dataclass(frozen=True)
class HostCheck:
    """The profile's host terms against the host times a run recorded (`m host`, `m idle`),
    over the runs that have them: measured / priced host issue time by recompute (medians),
    the measured and priced host cost of each recompute (its runs minus the same layout's
    run without, medians), and the one-repeat pipeline (`with_host_s`) against the repeats
    started idle, which it models (median |pipe / m idle − 1|)."""

    num_runs: int
    measured_over_priced_host: dict[str, float]
    recompute_host_s: dict[str, tuple[float, float]]  # recompute -> (measured, priced) extra host s
    pipeline_median_abs_error: float


def host_check(lines: Sequence[Timeline]) -> HostCheck | None:
    """`HostCheck` of the timelines with measured host times; None where none has them."""
    timed = [t for t in lines if t.measured_host_total_s is not None and t.measured_idle_start_s is not None]
    if not timed:
        return None
    ratio = {
        r: statistics.median(t.measured_host_total_s / t.host_total_s for t in timed if t.recompute == r)  # type: ignore[operator]
        for r in dict.fromkeys(t.recompute for t in timed)
    }
    layout = lambda t: (t.hidden_size, t.micro_batch_size, t.tp, t.sequence_parallel)  # noqa: E731
    none = {layout(t): t for t in timed if t.recompute == "none"}
    extra: dict[str, tuple[float, float]] = {}
    for r in (r for r in ratio if r != "none"):
        pairs = [(t, none[layout(t)]) for t in timed if t.recompute == r and layout(t) in none]
        if pairs:
            extra[r] = (
                statistics.median(t.measured_host_total_s - n.measured_host_total_s for t, n in pairs),  # type: ignore[operator]
                statistics.median(t.host_total_s - n.host_total_s for t, n in pairs),
            )
    pipe = statistics.median(abs(t.with_host_s / t.measured_idle_start_s - 1) for t in timed)  # type: ignore[operator]
    return HostCheck(len(timed), ratio, extra, pipe)


def format_host_check(check: HostCheck) -> str:
    out = [f"the host times measured ({check.num_runs} runs) against the profile's host terms:"]
    for r, value in check.measured_over_priced_host.items():
        out.append(f"  recompute {r}: measured host issue time / priced, median {value:.2f}")
    for r, (measured, priced) in check.recompute_host_s.items():
        out.append(f"  {r} minus none, host: measured {_ms(measured)} ms, priced {_ms(priced)} ms (medians)")
    out.append(
        f"  one-repeat pipeline vs repeats started idle: median |error| {check.pipeline_median_abs_error:.1%}"
    )
    return "\n".join(out)


def _sp(on: bool) -> str:
    return "on" if on else "off"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def format_timelines(lines: Sequence[Timeline]) -> str:
    head = (
        f"{'h':>6} {'b':>2} {'t':>2} {'SP':>3} {'recompute':9} {'ops f/r/b':>10} "
        f"{'dev f':>6} {'r':>6} {'b':>6} {'dev':>6} | {'host f':>6} {'r':>6} {'b':>6} {'host':>6} | "
        f"{'pipe':>6} {'overlap':>7} | {'meas f':>6} {'meas':>6} {'err':>6} | {'m host':>6} {'m idle':>6}"
    )
    rows = [head, "-" * len(head)]
    for t in lines:
        ops = "/".join(str(n) for n in t.ops)
        rows.append(
            f"{t.hidden_size:>6} {t.micro_batch_size:>2} {t.tp:>2} {_sp(t.sequence_parallel):>3} "
            f"{t.recompute:9} {ops:>10} "
            + " ".join(f"{_ms(s):>6}" for s in t.device_s)
            + f" {_ms(t.device_total_s):>6} | "
            + " ".join(f"{_ms(s):>6}" for s in t.host_s)
            + f" {_ms(t.host_total_s):>6} | {_ms(t.with_host_s):>6} {_ms(t.overlapped_s):>7} | "
            f"{_ms(t.measured_forward_s):>6} {_ms(t.measured_total_s):>6} {t.error:>+6.1%} | "
            f"{_ms(t.measured_host_total_s):>6} {_ms(t.measured_idle_start_s):>6}"
        )
    return "\n".join(rows)


def format_excess(rows: Sequence[RecomputeExcess]) -> str:
    out = [
        f"{'h':>6} {'b':>2} {'t':>2} {'SP':>3} {'fwd ms':>7} {'full-none ms':>12} "
        f"{'excess ms':>9} {'/fwd':>6}"
    ]
    for r in rows:
        out.append(
            f"{r.hidden_size:>6} {r.micro_batch_size:>2} {r.tp:>2} {_sp(r.sequence_parallel):>3} "
            f"{_ms(r.forward_s):>7} {_ms(r.difference_s):>12} {_ms(r.excess_s):>9} {r.excess:>+6.1%}"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    from simcluster.config.hardware import load_hardware

    parser = argparse.ArgumentParser(
        prog="python -m simcluster.calibration.host_timeline", description=__doc__
    )
    parser.add_argument("profile", help="hardware profile stem or path (a calibrated one prices the host)")
    parser.add_argument("--measurements", required=True, help="a layer_timing JSON (check-profile's runs)")
    parser.add_argument("--hidden-size", type=int, help="only runs of this hidden size")
    parser.add_argument("--micro-batch-size", type=int, help="only runs of this micro-batch size")
    parser.add_argument("--tp", type=int, help="only runs of this tensor-parallel size")
    parser.add_argument(
        "--json", action="store_true", help="print the timelines and the excess table as JSON"
    )
    args = parser.parse_args(argv)
    try:
        hw = load_hardware(args.profile)
        with open(args.measurements) as f:
            run = LayerRun.from_json(f.read())
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"host_timeline: {error}", file=sys.stderr)
        return 2
    wanted = {"hidden_size": args.hidden_size, "micro_batch_size": args.micro_batch_size, "tp": args.tp}
    timings = [t for t in run.timings if all(v is None or getattr(t, k) == v for k, v in wanted.items())]
    lines = [timeline(t, hw, run.dropout_prob) for t in timings]
    excess = [
        r for r in recompute_excess(run) if all(v is None or getattr(r, k) == v for k, v in wanted.items())
    ]
    if args.json:
        print(json.dumps({
            "timelines": [{**asdict(t), "host_total_s": t.host_total_s, "device_total_s": t.device_total_s,
                           "overlapped_s": t.overlapped_s, "host_bound": t.host_bound} for t in lines],
            "recompute_excess": [{**asdict(r), "excess_s": r.excess_s} for r in excess],
            "host_check": None if (check := host_check(lines)) is None else asdict(check),
        }, indent=1))  # fmt: skip
        return 0
    print(f"host seconds per priced op {host_per_op_s(hw) * 1e6:.2f} us; checkpoint {checkpoint_host(hw)}")
    print(format_timelines(lines))
    print("\nfull minus no recompute, against one measured forward:")
    print(format_excess(excess))
    if (measured := host_check(lines)) is not None:
        print("\n" + format_host_check(measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
