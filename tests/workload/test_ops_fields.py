"""Ops say what they are in fields (`Op.module`, `Op.pass_`), not in their names.

Two guards (issue 18, "make room"): no code under simcluster/ classifies an op by parsing
its name again (an AST check on the patterns that did: string methods or comparisons on an
op's name, op-name literals in comparisons or lookup tables); and every op built for every
shipped scenario, and for a grid over the op graph's options, has fields that agree with its
name as the name-parsing code read it (copied below as the oracle, with the kinds and classes
it gave)."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

from simcluster.calibration.records import recorded_op_kind
from simcluster.calibration.shapes import standin_ops
from simcluster.config.scenario import load_scenario
from simcluster.costs.compute import elementwise_kind
from simcluster.costs.op_kind import OpKind, op_kind
from simcluster.workload.context_parallel import context_parallel_layer_ops
from simcluster.workload.embedding import embedding_ops, output_ops
from simcluster.workload.fp8 import is_te_linear_gemm
from simcluster.workload.layer import LayerOps, layer_ops
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GradOf, Module, Op, Pass
from simcluster.workload.ops import OpKind as PriceKind
from tests.workload import room_ops_golden as golden

PACKAGE = Path(__file__).resolve().parents[2] / "simcluster"
OP_NAME = re.compile(
    r"^(attn|mlp|output|embedding)\.|^ln[12]?(\.|$)|\.(wgrad|dgrad|bwd|amax|fp8_scale)$|\.standin_"
)
"""A string that is (part of) an op's name (`workload.layer`, `workload.embedding`)."""
STRING_METHODS = {"endswith", "startswith", "split", "rsplit", "removesuffix", "removeprefix", "partition"}
BUILDERS = {"gemm", "elementwise", "collective", "flash_attention", "_tp_enter", "_tp_exit", "_rope",
            "_kv_repeat", "_layer_norm", "_bias_dropout_add", "_row_parallel_backward",
            "_column_parallel_backward", "_norm_and_residual_backward"}  # fmt: skip
"""Calls whose string arguments name the op they build (names stay: traces, records)."""
FILE_FORMAT_READERS = {("calibration/records.py", "recorded_op_kind")}
"""Functions that read op names from files (measurement records key sites by op name)."""


def _is_op_name(node: ast.AST) -> bool:
    """`op.name`, `x.op.name`, `after.name`, or a variable called `op_name`."""
    if isinstance(node, ast.Name):
        return node.id == "op_name"
    if isinstance(node, ast.Attribute) and node.attr == "name":
        inner = node.value
        word = (
            inner.id
            if isinstance(inner, ast.Name)
            else inner.attr
            if isinstance(inner, ast.Attribute)
            else ""
        )
        return word in {"op", "after", "before", "other"} or word.endswith("_op")
    return False


def _literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def name_parsing(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place in `source` that classifies ops by name."""
    tree = ast.parse(source)
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILDERS:
            exempt.update(id(n) for arg in node.args[:1] for n in ast.walk(arg))
        if isinstance(node, ast.JoinedStr):  # f"{op.name}.amax": building a name, not reading one
            exempt.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in STRING_METHODS and _is_op_name(node.func.value):
                found.append((node.lineno, f"{node.func.attr} on an op's name"))
            if node.func.attr == "join" and any(_is_op_name(n) for n in ast.walk(node)):
                found.append((node.lineno, "join of an op's name"))
            if node.func.attr == "get" and any(_is_op_name(arg) for arg in node.args):
                found.append((node.lineno, "lookup by an op's name"))
        if isinstance(node, ast.Subscript) and _is_op_name(node.slice):
            found.append((node.lineno, "lookup by an op's name"))
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_op_name(side) for side in sides):
                found.append((node.lineno, "comparison with an op's name"))
        keyed = [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else []
        table = [node] if isinstance(node, (ast.Compare, ast.Set)) else keyed
        literals = [text for part in table for text in _literals(part) if OP_NAME.search(text)]
        if literals:
            found.append((node.lineno, f"op-name literals {literals[:3]} in a comparison or table"))
        if isinstance(node, ast.arg) and node.arg == "op_name":
            found.append((node.lineno, "a parameter op_name"))
    return sorted(set(found))


def _readers(path: Path, source: str) -> set[int]:
    """Lines of the file-format readers in `path` (allowed to read op names)."""
    rel = path.relative_to(PACKAGE).as_posix()
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and (rel, node.name) in FILE_FORMAT_READERS:
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_no_code_classifies_ops_by_parsing_their_names():
    """Every module under simcluster/: no string method, comparison or lookup table on op names."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        allowed = _readers(path, source)
        offenders += [f"{path.relative_to(PACKAGE)}:{line}: {what}" for line, what in name_parsing(source)
                      if line not in allowed]  # fmt: skip
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize(
    "snippet",
    [
        'if op.name.endswith(".wgrad"):\n    pass',
        'x = ".".join(op.name.split(".")[:2]) in TE_LINEARS',
        'ring = f(backward=op.name == "attn.flash.bwd")',
        'if after.name in ("attn.qkv", "mlp.fc1"):\n    pass',
        'TE_LINEARS = frozenset({"attn.qkv", "attn.proj"})',
        'kept = {"attn.qk": 1, "attn.av": 2}',
        "saved = kept[op.name]",
        "saved = kept.get(op.name, 0.0)",
        "def kind(op_name: str) -> str:\n    return op_name",
        'core = ".standin_" in op.name',
    ],
)
def test_the_check_catches_the_name_parsing_this_package_had(snippet):
    """The patterns the code used before ops had fields (taken from it) are each caught."""
    assert name_parsing(snippet)


def test_the_check_lets_ops_be_named():
    """Building ops with names, and names in f-strings, is what names are for."""
    source = 'a = gemm("attn.qkv", shape, module=m, pass_=p)\nb = elementwise(f"{op.name}.amax", 1.0)\n'
    assert name_parsing(source) == []


# ---------------------------------------------------------------- the oracle: names as read before

ORACLE_CORE = {"flash", "qk", "av", "softmax", "dropout", "context_copy"}
# the MoE layer's routed and shared experts are TE linears too (TEGroupedMLP, SharedExpertMLP),
# and so are MLA's down, up and q projections (Megatron-core's TE layer spec)
ORACLE_TE = {
    "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "moe.experts", "moe.shared",
    "attn.q_down", "attn.kv_down", "attn.q_up", "attn.kv_up", "attn.q_proj",
}  # fmt: skip


def oracle_op_kind(op: Op) -> OpKind:
    """`costs.op_kind.op_kind` as it read names (commit bcfddff)."""
    parts = op.name.split(".")
    core = len(parts) > 1 and parts[0] == "attn" and parts[1] in ORACLE_CORE
    if op.ring is not None or op.kind is PriceKind.ATTENTION or core:
        return OpKind.ATTENTION
    if op.kind is PriceKind.COLLECTIVE:
        return OpKind.COMMUNICATION
    if op.kind is PriceKind.GEMM:
        return OpKind.GEMM
    return OpKind.FP8_CAST if op.name.endswith((".amax", ".fp8_scale")) else OpKind.MEMORY_BOUND


def oracle_pass(op: Op, phase: str) -> Pass:
    """Forward and recompute ops run forward; in the backward ".wgrad" GEMMs (and the
    embedding's grad scatter-add) and the SP re-gather of a linear's input feed the weight
    gradient, the rest the input gradient."""
    if phase != "backward":
        return Pass.FORWARD
    stem = op.name.removesuffix(".amax").removesuffix(".fp8_scale").split(".standin_")[0]
    weight = stem.endswith(".wgrad") or ".input_allgather" in stem
    return Pass.WEIGHT_GRAD if weight else Pass.INPUT_GRAD


ORACLE_GRAD_OF = {"dgrad_q": GradOf.Q, "dgrad_k": GradOf.K, "dgrad_probs": GradOf.PROBS, "dgrad_v": GradOf.V}


def _block_module(op: Op) -> str:
    return ".".join(op.name.split(".")[:2])


def _check(ops: LayerOps) -> list[str]:
    problems = []
    for phase in ("forward", "backward", "recompute"):
        for op in getattr(ops, phase):
            expected = {
                "op_kind": (op_kind(op), oracle_op_kind(op)),
                "pass": (op.pass_, oracle_pass(op, phase)),
                "te_linear": (is_te_linear_gemm(op), op.gemm is not None and _block_module(op) in ORACLE_TE),
                "grad_of": (op.grad_of, ORACLE_GRAD_OF.get(op.name.rsplit(".", 1)[-1])),
            }  # fmt: skip
            if op.kind is PriceKind.ELEMENTWISE:
                # the record format names a norm's site "layernorm" whichever norm it is; an
                # RMSNorm's own kernel (`Op.kernel`) is priced apart (tests/costs/test_costs_rmsnorm_kind.py)
                expected["kind"] = (elementwise_kind(replace(op, kernel=None)), recorded_op_kind(op.name))
            problems += [f"{phase} {op.name}: {k} {a} != {b}" for k, (a, b) in expected.items() if a != b]
    return problems


def _with_standins(ops: LayerOps, tp: int) -> LayerOps:
    return LayerOps(*(standin_ops(getattr(ops, p), tp) for p in ("forward", "backward", "recompute")))


def _all_ops(ops: LayerOps, tp: int) -> list[LayerOps]:
    return [ops, _with_standins(ops, tp)]


@pytest.mark.parametrize("path", golden._scenario_files(), ids=lambda p: p.stem)
def test_every_op_of_every_shipped_scenario_has_fields_that_agree_with_its_name(path):
    """Pass, kind of work, kernel kind, TE linear and grad_of: the fields give what the name gave."""
    workload = build_workload(load_scenario(path))
    tp = workload.layer_config.tp
    problems = []
    for stage in workload.stages:
        for chunk in stage.chunks:
            for ops in (*(segment.layer for segment in chunk.segments), chunk.embedding, chunk.output):
                if ops is not None:
                    problems += [p for part in _all_ops(ops, tp) for p in _check(part)]
    assert not problems, problems[:10]


def test_every_op_of_the_grid_has_fields_that_agree_with_its_name():
    """The same over every op-graph option (FP8 recipes, CP ring, unfused core, activations)."""
    problems = []
    for cfg in golden.layer_configs()[::3]:
        built = [layer_ops(cfg), embedding_ops(cfg, 50257), output_ops(cfg, 50257)]
        if cfg.flash:
            built.append(context_parallel_layer_ops(built[0], cfg, 2))
        problems += [p for ops in built for part in _all_ops(ops, cfg.tp) for p in _check(part)]
    assert not problems, problems[:10]


def test_modules_name_what_the_linears_and_the_core_are():
    """A spot check by hand: the TE linears' GEMMs, the core, the norms."""
    ops = layer_ops(golden.layer_configs()[0])
    by_name = {op.name: op for op in ops.forward + ops.backward}
    assert by_name["attn.qkv"].module is Module.QKV and by_name["attn.qkv"].pass_ is Pass.FORWARD
    assert (
        by_name["mlp.fc2.wgrad"].module is Module.FC2 and by_name["mlp.fc2.wgrad"].pass_ is Pass.WEIGHT_GRAD
    )
    assert by_name["attn.qk.dgrad_k"].module is Module.QK and by_name["attn.qk.dgrad_k"].grad_of is GradOf.K
    assert by_name["ln2.bwd"].module is Module.LAYERNORM and by_name["ln2.bwd"].pass_ is Pass.INPUT_GRAD
