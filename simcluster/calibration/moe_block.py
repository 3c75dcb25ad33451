"""The torch MoE MLP block measured on an H100, priced by the simulator's own MoE model (issue 18).

    python -m simcluster.calibration.moe_block [--profile h100-sxm5-80gb] [--json] \
        [--host-graph FILE] [--followup FILE] [--scenario FILE ...]

The measurements (docs/calibration/h100-2026-11-27-script, README there) time the project's
torch MoE MLP block (`profiler.layer.moe.MoEBlock`: router GEMM, top-k, permute, a host copy of
the token counts, one `F.linear` per local expert, weighted SwiGLU, unpermute; eager bf16,
forward + backward) with `profiler.bench.host_graph.measure_moe_case`: `eager_s` from an idle
GPU with the host issuing, `host_issue_s` the host's wall time to issue it. One rank of an EP
group is stood in for by an ep = 1 block of G = E/ep experts with top-k G over T tokens, so
each local expert computes T rows. `host_graph.json` `moe_cases` holds the five shipped
layouts' G and T, `followup.json` `moe_sweep` h 2048, f 768 over G = 1-32 at T 1024 and 4096.

The check builds the same block as the simulator sees it: `workload.moe_layer.moe_mlp_ops` of
a layer with h, T tokens, G experts, top-k G, ep = etp = tp = 1, the alltoall dispatcher
unfused (Megatron-core's unfused path, which the torch block mirrors op by op), BF16. Then

- host: the launches `costs.host.op_kernels` counts for those ops (`costs.moe_host`'s
  Megatron counts) × the profile's host cost per launch (`host_issue_us_per_op`, the MoE
  block's launches at its MoE keys where it has them: `costs.host.layer_op_kernels`);
- device: each op at `costs.chunk.op_time_s` on the profile;
- eager (the measured quantity from an idle GPU): the forward task as `costs.host` prices a
  task with a sync (GPU + Σ_segments max(0, host_k − gpu_k), cut at `moe_host.sync_points`),
  then the backward's max(GPU, host).

The fit (`fit_host`) reads the sweep alone and only its host-bound runs (the GPU finished
within `HOST_BOUND_MARGIN` of the host's issue: in a GPU-bound run the host's wall time also
holds its waits on the GPU, as `host_fit.host_graph_per_op_s` excludes them):

    host_issue_s = other · c_op + expert · c_expert

by least squares, with `other` and `expert` the op graph's launch counts of the run (expert:
the expert GEMMs' launches, G per grouped GEMM op, six per local expert over forward and
backward; other: every other launch of the block). c_op is the host cost of one eager torch
op of the block as the op graph counts it; c_expert one expert GEMM's forward or backward
launch from Python (`F.linear` and its autograd node). Every run has exactly one sync (the
`.tolist()` of the counts), placed where the idle GPU has already caught up, so its cost is
inside c_op and the data do not separate it.

The H100 profile holds the fit as `compute.moe_host_us_per_op` (c_op) and
`expert_gemm_host_us_per_launch` (c_expert), so `predict` prices the block at those
(`host_s`) beside every launch at `host_issue_us_per_op` (`host_declared_s`, the model before).
`scenario_host` shows what that does to a scenario's MoE layer: its launches split into the
dense part's (attention, norms, shared experts: priced as before), the MoE block's other
launches and its expert GEMM launches, priced at the declared per-kernel cost and at c_op /
c_expert, beside the layer's GPU seconds (TE's `GroupedLinear` issues its per-expert GEMMs
from one C++ loop, so c_expert, a Python launch, is an upper bound there). Nothing here is
fitted to a published run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simcluster.calibration.check import ONE_DEVICE
from simcluster.config.choices import Activation, CudaGraphImpl, Dtype, Normalization
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.costs.chunk import op_time_s
from simcluster.costs.host import inorder_wait_s, layer_op_kernels, op_kernels, pass_pieces
from simcluster.costs.moe_host import is_expert_gemm, sync_points
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_layer import MoELayerSpec, moe_mlp_ops
from simcluster.workload.ops import Op

HOST_BOUND_MARGIN = 0.05  # eager ≤ 1.05 × host issue: the GPU waited for the host
DATA_DIR = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-27-script"
_FIELDS = ("hidden_size", "local_experts", "tokens_per_expert", "ffn_hidden_size", "eager_s", "host_issue_s")


@dataclass(frozen=True)
class BlockRun:
    """One measured MoE block: its shape and the two times (`measure_moe_case`)."""

    name: str
    source: str  # "moe_cases" (host_graph.json) or "moe_sweep" (followup.json)
    hidden_size: int
    local_experts: int
    tokens_per_expert: int
    ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int
    eager_s: float
    host_issue_s: float

    @property
    def host_bound(self) -> bool:
        """The GPU finished within `HOST_BOUND_MARGIN` of the host's issue."""
        return self.eager_s <= (1 + HOST_BOUND_MARGIN) * self.host_issue_s


def _run(row: Any, source: str, where: str) -> BlockRun:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    missing = [name for name in _FIELDS if not isinstance(row.get(name), int | float)]
    if missing:
        raise ValueError(f"{where}: field(s) {', '.join(missing)} missing or not numbers (a failed case?)")
    return BlockRun(
        name=str(row.get("name", source)),
        source=source,
        hidden_size=int(row["hidden_size"]),
        local_experts=int(row["local_experts"]),
        tokens_per_expert=int(row["tokens_per_expert"]),
        ffn_hidden_size=int(row["ffn_hidden_size"]),
        shared_expert_ffn_hidden_size=int(row.get("shared_expert_ffn_hidden_size") or 0),
        eager_s=float(row["eager_s"]),
        host_issue_s=float(row["host_issue_s"]),
    )


def load_runs(path: Path, key: str) -> tuple[BlockRun, ...]:
    """The MoE blocks of `path` under `key` (`moe_cases` or `moe_sweep`); ValueError naming
    the file, the field and the row for anything else."""
    data = json.loads(Path(path).read_text())
    rows = data.get(key) if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: no list {key!r} of MoE block runs")
    return tuple(_run(row, key, f"{path}: {key}[{i}]") for i, row in enumerate(rows))


def block_spec(run: BlockRun) -> tuple[LayerConfig, MoELayerSpec]:
    """The layer config and MoE spec the simulator sees for the measured block (module
    docstring): T tokens, G experts, top-k G, ep = 1, alltoall unfused, BF16. The attention
    fields only have to be valid: no attention op is priced."""
    cfg = LayerConfig(
        hidden_size=run.hidden_size,
        num_attention_heads=1,
        seq_length=run.tokens_per_expert,
        micro_batch_size=1,
        activation=Activation.SWIGLU,
        normalization=Normalization.RMSNORM,
        dtype=Dtype.BF16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    moe = MoEConfig(
        num_experts=run.local_experts,
        router_topk=run.local_experts,
        ffn_hidden_size=run.ffn_hidden_size,
        shared_expert_ffn_hidden_size=run.shared_expert_ffn_hidden_size,
    )
    return cfg, MoELayerSpec(moe, ExpertLayout(tp=1, cp=1, dp=1, ep=1))


@dataclass(frozen=True)
class KernelSplit:
    """Launches of a forward + backward: expert GEMM launches and every other launch."""

    other: int
    expert: int


def split_kernels(ops: Sequence[tuple[Op, int]]) -> KernelSplit:
    """(op, launches) pairs split into expert GEMM launches and the rest."""
    expert = sum(n for op, n in ops if is_expert_gemm(op))
    return KernelSplit(other=sum(n for _, n in ops) - expert, expert=expert)


def block_kernels(run: BlockRun) -> KernelSplit:
    """The measured block's launches as the simulator counts them (forward + backward)."""
    _, spec = block_spec(run)
    forward, backward = moe_mlp_ops(*block_spec(run))
    pairs = [pair for ops in (forward, backward) for pair in zip(ops, op_kernels(ops, Dtype.BF16, spec))]
    return split_kernels(pairs)


@dataclass(frozen=True)
class BlockPrediction:
    """The simulator's prices of one measured block beside the measurement."""

    run: BlockRun
    kernels: KernelSplit
    host_s: float  # the profile's price: launches × its per-kernel cost, the MoE weights applied
    host_declared_s: float  # every launch at `host_issue_us_per_op` (no MoE host keys)
    gpu_forward_s: float
    gpu_backward_s: float
    eager_s: float  # the forward, then the backward, each op by op in issue order (`costs.host`)

    @property
    def host_error(self) -> float:
        """(priced − measured) / measured host issue seconds."""
        return self.host_s / self.run.host_issue_s - 1

    @property
    def eager_error(self) -> float:
        return self.eager_s / self.run.eager_s - 1


def host_per_op_s(hw: HardwareProfile) -> float:
    per_op = hw.compute.host_issue_s_per_op
    if per_op is None:
        raise ValueError(
            f"hardware profile {hw.name!r} has no compute.host_issue_us_per_op to price the host"
        )
    return per_op


def predict(run: BlockRun, hw: HardwareProfile) -> BlockPrediction:
    """Price the measured block with the simulator's op graph, host model and profile."""
    per_op = host_per_op_s(hw)
    cfg, spec = block_spec(run)
    forward, backward = moe_mlp_ops(cfg, spec)

    def own(ops: tuple[Op, ...]) -> tuple[float, ...]:
        return tuple(op_time_s(op, hw, ONE_DEVICE, Dtype.BF16) for op in ops)

    def price(ops: tuple[Op, ...]) -> float:
        return sum(own(ops))

    graph, weights = CudaGraphImpl.NONE, hw.compute.moe_host_weights()
    kf = layer_op_kernels(forward, Dtype.BF16, spec, graph, weights=weights)
    kb = layer_op_kernels(backward, Dtype.BF16, spec, graph, weights=weights)
    own_f, own_b = own(forward), own(backward)
    gpu_f, gpu_b = sum(own_f), sum(own_b)
    pieces = pass_pieces(forward, gpu_f, price, kf, sync_points(forward, spec), own_f)
    forward_task = gpu_f + inorder_wait_s(pieces, per_op)
    backward_task = gpu_b + inorder_wait_s(pass_pieces(backward, gpu_b, price, kb, (), own_b), per_op)
    kernels = block_kernels(run)
    declared_s = (kernels.other + kernels.expert) * per_op
    host_s = (sum(kf) + sum(kb)) * per_op
    return BlockPrediction(run, kernels, host_s, declared_s, gpu_f, gpu_b, forward_task + backward_task)


@dataclass(frozen=True)
class HostFit:
    """host_issue_s = other · per_op_s + expert · per_expert_launch_s over `runs`."""

    per_op_s: float
    per_expert_launch_s: float
    launches_per_local_expert: int  # expert GEMM launches of one local expert, forward + backward
    runs: tuple[BlockRun, ...]
    residuals: tuple[float, ...]  # (fitted − measured) / measured, per run

    @property
    def per_local_expert_s(self) -> float:
        return self.launches_per_local_expert * self.per_expert_launch_s


def fit_host(runs: Sequence[BlockRun]) -> HostFit:
    """Least squares of the host-bound runs' host issue seconds on their launch counts
    (module docstring); ValueError with fewer than two usable runs or collinear counts."""
    used = tuple(run for run in runs if run.host_bound)
    splits = [block_kernels(run) for run in used]
    xs = [(float(s.other), float(s.expert)) for s in splits]
    ys = [run.host_issue_s for run in used]
    a11 = sum(x * x for x, _ in xs)
    a12 = sum(x * y for x, y in xs)
    a22 = sum(y * y for _, y in xs)
    b1 = sum(x * t for (x, _), t in zip(xs, ys))
    b2 = sum(y * t for (_, y), t in zip(xs, ys))
    det = a11 * a22 - a12 * a12
    if len(used) < 2 or det <= 1e-9 * a11 * a22:
        raise ValueError(
            f"fit_host: {len(used)} host-bound run(s) with distinct expert counts; need two or more"
        )
    per_op, per_expert = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
    one = block_kernels(BlockRun("one", "fit", 64, 1, 64, 64, 0, 1.0, 1.0)).expert
    residuals = tuple((x * per_op + y * per_expert) / t - 1 for (x, y), t in zip(xs, ys))
    return HostFit(per_op, per_expert, one, used, residuals)


def default_runs() -> tuple[tuple[BlockRun, ...], tuple[BlockRun, ...]]:
    """The committed H100 files' (moe_cases, moe_sweep)."""
    return load_runs(DATA_DIR / "host_graph.json", "moe_cases"), load_runs(
        DATA_DIR / "followup.json", "moe_sweep"
    )


@dataclass(frozen=True)
class LayerHost:
    """One MoE layer of a scenario, forward + backward (with recompute), per microbatch: its
    GPU seconds and its launches by class, priced at the declared cost and at the fit's."""

    scenario: str
    gpu_s: float
    dense: int  # launches outside the MoE block (attention, norms, shared experts' TE linears)
    moe_other: int  # the MoE block's launches but its expert GEMMs'
    expert: int  # expert GEMM launches (TE GroupedLinear: one cuBLAS GEMM per local expert)
    declared_s: float
    measured_split_s: float


def scenario_host(path: str | Path, fit: HostFit) -> LayerHost:
    """The first MoE layer of `path`'s first stage that has one, as `costs.stage_pricing` prices
    it, with its host seconds at the declared per-kernel cost and with the dense launches at
    that cost, the MoE block's other launches at `fit.per_op_s` and its expert GEMM launches at
    `fit.per_expert_launch_s` (module docstring: a what-if, not what the simulator runs)."""
    from simcluster.config.scenario import load_scenario_and_hardware
    from simcluster.costs.host import layer_op_kernels
    from simcluster.costs.moe_host import moe_op_kernels
    from simcluster.costs.stage_pricing import StagePricing, pricing_layout
    from simcluster.workload.model import build_workload

    scenario, hw = load_scenario_and_hardware(path)
    per_op = host_per_op_s(hw)
    layout = pricing_layout(scenario, hw)
    workload = build_workload(scenario, hw.fp8_weight_copies)
    segments = [s for st in workload.stages for c in st.chunks for s in c.segments if s.kind.moe is not None]
    if not segments:
        raise ValueError(f"{path}: no MoE layer (model.moe absent)")
    segment, moe = segments[0], segments[0].kind.moe
    assert moe is not None
    dense = moe_other = expert = 0
    for part in (segment.layer.forward, segment.layer.recompute, segment.layer.backward):
        args = (layout.dtype, moe, layout.cuda_graph, layout.cuda_graph_scope)
        counts = layer_op_kernels(part, *args, recompute=part is segment.layer.recompute)  # unweighted: ints
        for op, n, m in zip(part, map(int, counts), moe_op_kernels(part, moe, layout.dtype.quantized)):
            launches = op.gemm.batch if n and op.gemm is not None and is_expert_gemm(op) else 0
            if m is None:
                dense += n
            else:  # an expert GEMM's input cast is a MoE-block launch (`moe_host.weighted_moe_kernels`)
                expert += launches
                moe_other += n - launches
    cost = StagePricing(hw).segment(segment, layout)
    gpu_s = cost.forward.total_s + cost.recompute.total_s + cost.backward.total_s
    declared = (dense + moe_other + expert) * per_op
    measured = dense * per_op + moe_other * fit.per_op_s + expert * fit.per_expert_launch_s
    return LayerHost(scenario.name, gpu_s, dense, moe_other, expert, declared, measured)


def format_report(predictions: Sequence[BlockPrediction], fit: HostFit, per_op_s: float) -> str:
    """The per-run table, the fit and its residuals, for people."""
    lines = [
        f"{'run':<16} {'G':>3} {'T':>5} {'launch':>7} {'host m':>7} {'decl':>6} {'err':>5} {'host p':>7}"
        f" {'err':>5} {'eager m':>8} {'eager p':>8} {'err':>5} {'gpu p':>6}"
        f"  (ms; decl: every launch at {per_op_s * 1e6:.1f} us; p: the profile)"
    ]
    for p in predictions:
        r, launches = p.run, p.kernels.other + p.kernels.expert
        declared_error = p.host_declared_s / r.host_issue_s - 1
        lines.append(
            f"{r.name:<16} {r.local_experts:>3} {r.tokens_per_expert:>5} {launches:>7}"
            f" {r.host_issue_s * 1e3:>7.2f} {p.host_declared_s * 1e3:>6.2f} {declared_error:>+5.0%}"
            f" {p.host_s * 1e3:>7.2f} {p.host_error:>+5.0%}"
            f" {r.eager_s * 1e3:>8.2f} {p.eager_s * 1e3:>8.2f} {p.eager_error:>+5.0%}"
            f" {(p.gpu_forward_s + p.gpu_backward_s) * 1e3:>6.2f}{'' if r.host_bound else '  GPU-bound'}"
        )
    lines.append(
        f"\nfit over {len(fit.runs)} host-bound sweep runs: {fit.per_op_s * 1e6:.1f} us per other launch, "
        f"{fit.per_expert_launch_s * 1e6:.1f} us per expert GEMM launch "
        f"({fit.per_local_expert_s * 1e6:.0f} us per local expert, forward + backward); residuals "
        + ", ".join(
            f"G{r.local_experts}/T{r.tokens_per_expert} {e:+.0%}" for r, e in zip(fit.runs, fit.residuals)
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simcluster.calibration.moe_block", description=__doc__)
    parser.add_argument("--profile", default="h100-sxm5-80gb", help="hardware profile (name or .yaml)")
    parser.add_argument("--host-graph", type=Path, default=DATA_DIR / "host_graph.json")
    parser.add_argument("--followup", type=Path, default=DATA_DIR / "followup.json")
    parser.add_argument("--scenario", action="append", default=[], help="a MoE scenario for the what-if")
    parser.add_argument("--json", action="store_true", help="print the runs, the fit and the what-if as JSON")
    args = parser.parse_args(argv)
    try:
        hw = load_hardware(args.profile)
        runs = load_runs(args.host_graph, "moe_cases") + load_runs(args.followup, "moe_sweep")
        predictions = [predict(run, hw) for run in runs]
        fit = fit_host([run for run in runs if run.source == "moe_sweep"])
        layers = [scenario_host(path, fit) for path in args.scenario]
    except (OSError, ValueError) as error:
        print(f"moe_block: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = {
            "profile": hw.name,
            "runs": [
                {
                    **asdict(p),
                    "host_error": p.host_error,
                    "eager_error": p.eager_error,
                    "host_bound": p.run.host_bound,
                }
                for p in predictions
            ],
            "fit": {**asdict(fit), "per_local_expert_s": fit.per_local_expert_s},
            "scenarios": [asdict(layer) for layer in layers],
        }
        print(json.dumps(out, indent=1))
        return 0
    print(format_report(predictions, fit, host_per_op_s(hw)))
    if layers:
        print(f"\n{'MoE layer, per microbatch (ms)':<46} {'gpu':>6} {'dense':>5} {'moe':>4} {'exp':>4}"
              f" {'host decl':>9} {'host meas':>9}")  # fmt: skip
        for layer in layers:
            host = f"{layer.declared_s * 1e3:>9.2f} {layer.measured_split_s * 1e3:>9.2f}"
            print(f"{layer.scenario[:46]:<46} {layer.gpu_s * 1e3:>6.2f} {layer.dense:>5} {layer.moe_other:>4}"
                  f" {layer.expert:>4} {host}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
