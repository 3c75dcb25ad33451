"""Golden numbers for issue 18's "make room" refactor of the ops (module / pass fields in
place of name parsing) and of the layer rules (written once): every number the refactor
could move, captured from the commit before it, so `test_room_ops_golden.py` can demand
`==` (exact floats) after it.

Captured: `run --json` of every shipped scenario and of variants of them that reach the
ops the shipped ones do not (FP8 current scaling and MXFP8, context parallelism, unfused
GQA, squared ReLU, no dropout, TP comm overlap); `validate --json`'s rows; and, per layer
configuration of a grid over every op-graph option (`layer_configs`, in order), a digest
of the op graph (every field but the new ones), each op's price, each phase's price, the
layer's time split by kind, the host's kernel count and the calibration stand-in layer's
kinds and prices on three hardware profiles. Regenerate (only at the base commit, never to make a test pass):

    .venv/bin/python -m tests.workload.room_ops_golden

Re-captured (issue 20, 2026-11-27) at the deliberate pricing change that priced the
dropout-0 bias-dropout-add as a bias add and took the H100 SwiGLU / bias-GeLU rates from two
more H100s: only runs on the H100, H200 and Blackwell profiles moved; every A100 run equal.

Re-captured (2026-11-27) at MLA's attention backward counted as its five GEMMs by their own
head dims (workload.ops.AttentionShape.flops): only scenarios/moe/deepseek-v3-h100.yaml moved.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Dtype,
    Fp8Recipe,
    PositionEmbedding,
    Recompute,
)
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import load_scenario, parse_scenario
from simcluster.costs.breakdown import layer_split
from simcluster.costs.chunk import op_time_s, price_layer_ops
from simcluster.costs.host import kernels_issued
from simcluster.costs.network import GroupPlacement
from simcluster.workload.context_parallel import context_parallel_layer_ops
from simcluster.workload.embedding import embedding_ops, output_ops
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("room_ops_golden.json")
OP_FIELDS = (
    "name", "kind", "gemm", "bytes_moved", "collective", "message_bytes", "saved_bytes",
    "overlaps_next", "attention", "ring",
)  # fmt: skip
"""The fields `Op` had before the refactor (the digest ignores fields added since)."""
DIGEST_CHARS = 16  # 64 bits: a check for change, not a security hash
PROFILES = ("h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb")

# Variants of shipped scenarios: (base file, name, overrides per section).
VARIANTS: list[tuple[str, str, dict[str, dict[str, Any]]]] = [
    ("modern/gpt3-175b-h100-fp8.yaml", "fp8-tensorwise", {"training": {"fp8_recipe": "tensorwise"}}),
    ("modern/llama3-8b-h100.yaml", "fp8-tensorwise-sp", {
        "training": {"dtype": "fp8", "fp8_recipe": "tensorwise", "tp_comm_overlap": True},
        "parallel": {"tp": 2, "sequence_parallel": True, "dp": 2}}),
    ("modern/llama3-8b-h100.yaml", "mxfp8-b200", {
        "hardware": {"": "b200-sxm-180gb"}, "training": {"dtype": "fp8", "fp8_recipe": "mxfp8"}}),
    ("modern/llama3-8b-h100.yaml", "cp2-selective", {
        "parallel": {"cp": 2, "dp": 4}, "training": {"recompute": "selective"}}),
    ("modern/llama3-8b-h100.yaml", "unfused-gqa-full", {
        "training": {"attention_backend": "unfused", "recompute": "full"},
        "model": {"seq_length": 2048}, "parallel": {"cp": 1, "dp": 8}}),
    ("modern/llama3-8b-h100.yaml", "squared-relu-dropout", {
        "model": {"activation": "squared_relu", "hidden_dropout": 0.1, "attention_dropout": 0.1},
        "parallel": {"tp": 4, "sequence_parallel": True, "cp": 1, "dp": 2}}),
    ("paper/gpt-22b-sp-selective.yaml", "paper-no-dropout-h100", {
        "hardware": {"": "h100-sxm5-80gb"}, "model": {"hidden_dropout": 0.0, "attention_dropout": 0.0}}),
]  # fmt: skip


def _scenario_files() -> list[Path]:
    return sorted(p for p in (REPO / "scenarios").rglob("*.yaml"))


def _run(scenario, path: Path) -> dict[str, Any]:
    from simcluster.simulation import run_simulation

    hw = load_hardware(scenario.hardware, relative_to=path)
    return run_simulation(scenario, hw).result.to_json_dict()


def _variant(base: str, name: str, overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import yaml

    path = REPO / "scenarios" / base
    data = yaml.safe_load(path.read_text())
    data = copy.deepcopy(data)
    for section, values in overrides.items():
        if section == "hardware":
            data["hardware"] = values[""]
            continue
        data.setdefault(section, {}).update(values)
    data["name"] = name
    return _run(parse_scenario(data, name), path)


def layer_configs() -> list[LayerConfig]:
    """One layer per combination of the options the op graph branches on."""
    configs = []
    layouts = [(1, False), (2, False), (4, True)]
    dtypes = [
        (Dtype.BF16, Fp8Recipe.DELAYED), (Dtype.FP8, Fp8Recipe.DELAYED), (Dtype.FP8, Fp8Recipe.TENSORWISE),
        (Dtype.FP8, Fp8Recipe.MXFP8), (Dtype.FP32, Fp8Recipe.DELAYED),
    ]  # fmt: skip
    for act, backend, gqa, pos, drop, (tp, sp), rec, (dtype, recipe) in itertools.product(
        list(Activation), list(AttentionBackend), (False, True), list(PositionEmbedding), (0.0, 0.1),
        layouts, list(Recompute), dtypes,
    ):  # fmt: skip
        if backend is AttentionBackend.FLASH and dtype is Dtype.FP32:
            continue
        configs.append(
            LayerConfig(
                hidden_size=512, num_attention_heads=8, seq_length=256, micro_batch_size=2,
                ffn_hidden_size=1536, tp=tp, sequence_parallel=sp, recompute=rec, dtype=dtype,
                num_query_groups=4 if gqa else 0, activation=act, position_embedding=pos,
                attention_backend=backend, hidden_dropout=drop, attention_dropout=drop, fp8_recipe=recipe,
            )
        )  # fmt: skip
    return configs


def _op_record(op) -> list[Any]:
    return [repr(getattr(op, f)) for f in OP_FIELDS]


def _captured_fields(values: dict[str, Any], added: str) -> dict[str, Any]:
    """`values` (nested) without a field added since the capture (`ep_comm_s` of `OpsCost`,
    the `ep_comm` kind: MoE dispatch) where it is 0, as it is for every dense layer here; a
    non-zero value stays and changes the digest."""
    return {
        k: _captured_fields(v, added) if isinstance(v, dict) else v
        for k, v in values.items()
        if not (k == added and v == 0.0)
    }


def layer_digest(cfg: LayerConfig, profiles: dict[str, Any]) -> str:
    """sha256 of everything the ops of `cfg` give (module docstring)."""
    from simcluster.calibration.check import check_kind
    from simcluster.calibration.shapes import standin_ops

    out: list[Any] = []
    ops = layer_ops(cfg)
    variants = [
        ("layer", ops, 1),
        ("embedding", embedding_ops(cfg, 50257), 1),
        ("output", output_ops(cfg, 50257), 1),
    ]
    if cfg.flash and cfg.seq_length % 2 == 0:
        variants.append(("cp2", context_parallel_layer_ops(ops, cfg, 2), 2))
    for label, layer, cp in variants:
        out.append(label)
        for phase in ("forward", "backward", "recompute"):
            out.append([_op_record(op) for op in getattr(layer, phase)])
        for name, hw in profiles.items():
            tp = GroupPlacement(num_ranks=cfg.tp, ranks_per_node=8)
            cpg = GroupPlacement(num_ranks=cp, ranks_per_node=8)
            dtype = cfg.dtype
            for phase in ("forward", "backward", "recompute"):
                phase_ops = getattr(layer, phase)
                out.append(
                    [
                        repr(op_time_s(op, hw, tp, dtype, layer.fp8_recipe))
                        for op in phase_ops
                        if op.ring is None
                    ]
                )
                out.append(kernels_issued(phase_ops, dtype))
            for overlap in (False, True) if cfg.sequence_parallel else (False,):
                cost = price_layer_ops(layer, hw, tp, dtype, cpg, overlap)
                out.append([name, repr(_captured_fields(asdict(cost), "ep_comm_s"))])
                split = {k.value: v for k, v in layer_split(layer, cost, hw, tp, dtype, cpg).items()}
                out.append(sorted((k, repr(v)) for k, v in _captured_fields(split, "ep_comm").items()))
    if cfg.dtype is not Dtype.FP8:
        hw = profiles["h100-sxm5-80gb"]
        one = GroupPlacement(num_ranks=1, ranks_per_node=1)
        for phase in ("forward", "backward", "recompute"):
            stand = standin_ops(getattr(ops, phase), cfg.tp)
            out.append([(op.name, check_kind(op), repr(op_time_s(op, hw, one, cfg.dtype))) for op in stand])
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()[:DIGEST_CHARS]


def profiles_for(index: int, profiles: dict[str, Any]) -> dict[str, Any]:
    """The H100 (whose profile prices memory-bound kernels by kind) for every layer, the
    other profiles for every fifth (time: the digests run in the test suite)."""
    return profiles if index % 5 == 0 else {PROFILES[0]: profiles[PROFILES[0]]}


def capture() -> dict[str, Any]:
    from simcluster.validation import table4_comparisons, table5_comparisons

    runs = {}
    for path in _scenario_files():
        runs[str(path.relative_to(REPO))] = _run(load_scenario(path), path)
    variants = {name: _variant(base, name, over) for base, name, over in VARIANTS}
    rows = table4_comparisons(None) + table5_comparisons(None)
    validate = [{**asdict(row), "error": row.error} for row in rows]
    profiles = {name: load_hardware(name) for name in PROFILES}
    layers = [layer_digest(cfg, profiles_for(i, profiles)) for i, cfg in enumerate(layer_configs())]
    return {"runs": runs, "variants": variants, "validate": validate, "layers": layers}


def main() -> None:
    data = capture()
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    counts = f"{len(data['runs'])} runs, {len(data['variants'])} variants, {len(data['validate'])} rows"
    print(f"wrote {GOLDEN}: {counts}, {len(data['layers'])} layer digests", file=sys.stderr)


if __name__ == "__main__":
    main()
