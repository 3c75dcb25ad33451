"""A Megatron-LM launch command line -> a scenario (`simcluster import-megatron`).

Megatron's argparse names (`megatron/training/arguments.py`) map onto the scenario's keys,
which already use Megatron's vocabulary. Every flag ends in exactly one bucket, and none is
dropped silently:
  used         read into the scenario (`--num-layers`, `--sequence-parallel`, …);
  ignored      known, with no effect on a simulated iteration (`--lr`, `--train-iters`, …);
  not modelled known, changes the workload, but the simulator has no model of it
               (`--swiglu`, `--num-experts`, …): the scenario describes the run without it;
  unknown      anything else (a typo, a newer flag): listed for the user to check.
Data parallelism is not a Megatron flag: Megatron derives d = world size / (t · p). The world
size comes from `--world-size`, an explicit `num_gpus`, or torchrun's `--nnodes` ×
`--nproc_per_node`; without any, d = 1 with a note.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from simcluster.config.choices import Dtype, Recompute, ScheduleKind
from simcluster.config.errors import ConfigError
from simcluster.config.scenario import Scenario, parse_scenario

SOURCE = "megatron arguments"
DEFAULT_HARDWARE = "a100-sxm4-80gb"
# GPT-2 BPE (50,257 tokens) padded as in Korthikanti et al. Table 3 (v = 51,200).
DEFAULT_VOCAB_SIZE = 51200

_MODEL_INTS = {
    "num-layers": "num_layers",
    "hidden-size": "hidden_size",
    "num-attention-heads": "num_attention_heads",
    "seq-length": "seq_length",
    "vocab-size": "vocab_size",
    "ffn-hidden-size": "ffn_hidden_size",
}
_REQUIRED = ("num-layers", "hidden-size", "num-attention-heads", "seq-length", "micro-batch-size")

# Flags this module reads (beyond _MODEL_INTS); everything else is sorted below.
_USED = {
    "encoder-seq-length", "micro-batch-size", "global-batch-size", "tensor-model-parallel-size",
    "pipeline-model-parallel-size", "virtual-pipeline-model-parallel-size",
    "num-layers-per-virtual-pipeline-stage", "sequence-parallel", "recompute-granularity",
    "recompute-activations", "checkpoint-activations", "recompute-method", "recompute-num-layers",
    "bf16", "fp16", "use-distributed-optimizer", "overlap-grad-reduce", "world-size",
    "data-parallel-size", "nproc-per-node", "nnodes",
}  # fmt: skip

_IGNORED = {
    "lr", "min-lr", "train-iters", "train-samples", "weight-decay", "start-weight-decay",
    "end-weight-decay", "weight-decay-incr-style", "clip-grad", "sgd-momentum", "init-method-std",
    "init-method-xavier-uniform", "seed", "split", "vocab-file", "merge-file", "tokenizer-type",
    "tokenizer-model", "vocab-extra-ids", "save", "load", "pretrained-checkpoint", "finetune",
    "distributed-backend", "distributed-timeout-minutes", "num-workers", "dataloader-type",
    "attention-dropout", "hidden-dropout", "no-masked-softmax-fusion", "no-bias-gelu-fusion",
    "no-bias-dropout-fusion", "no-gradient-accumulation-fusion", "masked-softmax-fusion",
    "use-cpu-initialization", "no-async-tensor-model-parallel-allreduce", "ddp-impl", "local-rank",
    "apply-query-key-layer-scaling", "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32",
    "loss-scale", "initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis",
    "fp16-lm-cross-entropy", "use-mcore-models", "use-legacy-models", "transformer-impl",
    "eod-mask-loss", "reset-position-ids", "reset-attention-mask", "mock-data", "use-env",
    "no-persist-layer-norm", "empty-unused-memory-level", "barrier-with-l1-time", "use-checkpoint-args",
    "max-position-embeddings", "make-vocab-size-divisible-by", "rampup-batch-size", "optimizer",
    "node-rank", "master-addr", "master-port", "standalone", "max-restarts", "rdzv-backend",
    "rdzv-endpoint", "rdzv-id", "rdzv-conf", "monitor-interval", "no-python", "module",
}  # fmt: skip
_IGNORED_PREFIXES = (
    "log-", "tensorboard-", "wandb-", "save-", "load-", "no-load-", "no-save-", "eval-", "exit-",
    "ckpt-", "lr-", "adam-", "data-", "train-data", "valid-data", "test-data", "profile", "timing-",
)  # fmt: skip

_NOT_MODELLED = {
    "swiglu": "SwiGLU MLP (the simulator models a GeLU MLP with ffn_hidden_size)",
    "group-query-attention": "grouped-query attention (multi-head attention is modelled)",
    "num-query-groups": "grouped-query attention (multi-head attention is modelled)",
    "num-experts": "mixture of experts",
    "expert-model-parallel-size": "expert parallelism",
    "context-parallel-size": "context parallelism",
    "use-flash-attn": "flash attention (the paper's unfused attention core is priced and stored)",
    "untie-embeddings-and-output-weights": "untied output layer (tied embeddings are modelled)",
    "normalization": "the norm kind (LayerNorm is modelled)",
    "position-embedding-type": "the position embedding kind (learned absolute is modelled)",
    "disable-bias-linear": "bias-free linears (biases are modelled)",
    "overlap-param-gather": "overlapped parameter all-gather",
    "overlap-p2p-comm": "overlapped pipeline p2p",
    "tp-comm-overlap": "overlapped tensor-parallel communication",
    "distribute-saved-activations": "distributed saved activations",
    "num-microbatches-with-partial-activation-checkpoints": "partial recompute (paper Appendix C)",
    "decoder-first-pipeline-num-layers": "uneven pipeline stages",
    "decoder-last-pipeline-num-layers": "uneven pipeline stages",
    "account-for-embedding-in-pipeline-split": "uneven pipeline stages",
    "pipeline-model-parallel-split-rank": "encoder-decoder pipelines",
    "fp8-format": "FP8 training",
}


@dataclass(frozen=True, slots=True)
class MegatronImport:
    """The scenario mapping (validated) and what happened to every flag."""

    scenario: dict[str, Any]
    notes: tuple[str, ...]
    ignored: tuple[str, ...]
    not_modelled: tuple[str, ...]
    unknown: tuple[str, ...]

    def validated(self) -> Scenario:
        return parse_scenario(self.scenario, SOURCE)

    def comment_lines(self) -> list[str]:
        """What a reader must know about the import, one line each (also printed to stderr)."""
        lines = [f"note: {note}" for note in self.notes]
        if self.ignored:
            lines.append(f"ignored (no effect on the simulation): {' '.join(self.ignored)}")
        for flag in self.not_modelled:
            lines.append(f"not modelled (simulated without it): {flag}")
        if self.unknown:
            lines.append(f"unknown flags (not recognised, not used): {' '.join(self.unknown)}")
        return lines

    def to_yaml(self) -> str:
        header = ["Scenario imported from a Megatron-LM command line by `simcluster import-megatron`."]
        comments = "".join(f"# {line}\n" for line in header + self.comment_lines())
        return comments + yaml.safe_dump(self.scenario, sort_keys=False)


def split_command_line(command: str | Sequence[str]) -> list[str]:
    """Shell words of a command line (backslash-newline continuations joined). A sequence
    is taken as already split, except that items holding spaces are split again. A quote
    left open (shlex's ValueError) is a ConfigError."""
    try:
        if isinstance(command, str):
            return shlex.split(command.replace("\\\n", " "), comments=True)
        return [word for item in command for word in (shlex.split(item) if " " in item else [item])]
    except ValueError as error:  # "No closing quotation", "No escaped character"
        problem = f"command line: {error}; allowed: balanced single and double quotes, no trailing backslash"
        raise ConfigError(SOURCE, [problem]) from None


def _is_flag(word: str) -> bool:
    return word.startswith("--") and len(word) > 2


def collect_flags(words: Sequence[str]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """(flags, repeated flags, other words). A flag's values are the words up to the next
    `--flag`; names are normalised to Megatron's dashed lower case. Words before the first
    flag, a `*.py` script and `$VARIABLES` (python, torchrun, env vars) are not values."""
    flags: dict[str, list[str]] = {}
    repeated: list[str] = []
    launcher: list[str] = []
    current: list[str] | None = None
    for word in words:
        if _is_flag(word):
            name, _, value = word[2:].partition("=")
            name = name.replace("_", "-").lower()
            if name in flags:
                repeated.append(name)
            current = flags[name] = [value] if value else []
        elif word.endswith(".py") or word.startswith("$") or current is None:
            launcher.append(word)
            current = None
        else:
            current.append(word)
    return flags, repeated, launcher


def _bucket(name: str) -> str:
    if name in _MODEL_INTS or name in _USED:
        return "used"
    if name in _NOT_MODELLED or name.startswith(("moe-", "fp8")):
        return "not_modelled"
    if name in _IGNORED or name.startswith(_IGNORED_PREFIXES):
        return "ignored"
    return "unknown"


def _shown(name: str, values: list[str]) -> str:
    return shlex.join([f"--{name}", *values])


class _Reader:
    """Typed access to the collected flags, gathering every problem before failing."""

    def __init__(self, flags: dict[str, list[str]]) -> None:
        self.flags = flags
        self.problems: list[str] = []

    def has(self, name: str) -> bool:
        return name in self.flags

    def switch(self, name: str) -> bool:
        if name in self.flags and self.flags[name]:
            self.problems.append(f"--{name}: takes no value, got {' '.join(self.flags[name])!r}")
        return name in self.flags

    def text(self, name: str) -> str | None:
        values = self.flags.get(name)
        if values is None:
            return None
        if len(values) != 1:
            self.problems.append(f"--{name}: expected one value, got {len(values)}: {values}")
            return None
        return values[0]

    def integer(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            self.problems.append(f"--{name}: value {value!r}: expected an integer")
            return None


def _world_size(read: _Reader, num_gpus: int | None, notes: list[str]) -> int | None:
    if num_gpus is not None:
        return num_gpus
    if read.has("world-size"):
        return read.integer("world-size")
    nodes, per_node = read.text("nnodes"), read.text("nproc-per-node")
    if per_node is None:
        return None
    if nodes is not None and ":" in nodes:
        nodes = nodes.split(":")[-1]
        notes.append(f"torchrun --nnodes is a range; using its maximum, {nodes} nodes")
    try:
        world = int(nodes or 1) * int(per_node)
    except ValueError:
        notes.append(f"no world size from torchrun --nnodes {nodes} --nproc_per_node {per_node}")
        return None
    notes.append(f"world size {world} from torchrun --nnodes {nodes or 1} x --nproc_per_node {per_node}")
    return world


def _data_parallel(read: _Reader, tp: int, pp: int, num_gpus: int | None, notes: list[str]) -> int:
    if read.has("data-parallel-size"):
        return read.integer("data-parallel-size") or 1
    world = _world_size(read, num_gpus, notes)
    if world is None:
        notes.append(
            "dp = 1: no world size given (Megatron derives dp = world size / (tp * pp); "
            "pass --world-size N, or torchrun --nnodes/--nproc_per_node)"
        )
        return 1
    if world % (tp * pp):
        read.problems.append(f"world size {world}: not a multiple of tp * pp ({tp} * {pp} = {tp * pp})")
        return 1
    notes.append(f"dp = {world // (tp * pp)} = world size {world} / (tp {tp} * pp {pp})")
    return world // (tp * pp)


def _virtual_pipeline(read: _Reader, num_layers: int, pp: int) -> int:
    vpp = read.integer("virtual-pipeline-model-parallel-size")
    per_stage = read.integer("num-layers-per-virtual-pipeline-stage")
    if per_stage is None:
        return vpp or 1
    if num_layers % pp or (num_layers // pp) % per_stage:
        read.problems.append(
            f"--num-layers-per-virtual-pipeline-stage: value {per_stage}: must divide the layers "
            f"per pipeline stage (num_layers {num_layers} / pp {pp})"
        )
        return vpp or 1
    derived = num_layers // pp // per_stage
    if vpp is not None and vpp != derived:
        read.problems.append(
            f"--virtual-pipeline-model-parallel-size {vpp} disagrees with "
            f"--num-layers-per-virtual-pipeline-stage {per_stage} (which gives {derived})"
        )
    return derived


def _recompute(read: _Reader, notes: list[str]) -> Recompute:
    granularity = read.text("recompute-granularity")
    if granularity is None and read.switch("recompute-activations"):
        granularity = "selective"  # Megatron: --recompute-activations means selective
    if granularity is None and read.switch("checkpoint-activations"):
        granularity = "full"  # the 2021 flag: full, uniform, one layer per checkpoint
    if granularity is None:
        if read.has("recompute-method"):
            notes.append("--recompute-method without --recompute-granularity full has no effect")
        return Recompute.NONE
    if granularity not in ("full", "selective"):
        read.problems.append(f"--recompute-granularity: value {granularity!r}: allowed: full, selective")
        return Recompute.NONE
    method, group = read.text("recompute-method"), read.integer("recompute-num-layers")
    if granularity == "full" and (method == "block" or (group or 1) > 1):
        notes.append(
            f"--recompute-method {method} --recompute-num-layers {group}: simulated as full "
            "recompute of every layer (per-layer checkpoints)"
        )
    return Recompute(granularity)


def _dtype(read: _Reader, notes: list[str]) -> Dtype:
    bf16, fp16 = read.switch("bf16"), read.switch("fp16")
    if bf16 and fp16:
        read.problems.append("--bf16 and --fp16: choose one")
    if bf16 or fp16:
        return Dtype.BF16 if bf16 else Dtype.FP16
    notes.append("dtype fp32: neither --bf16 nor --fp16 given (Megatron then trains in fp32)")
    return Dtype.FP32


def _model(read: _Reader, notes: list[str]) -> dict[str, Any]:
    model = {key: read.integer(flag) for flag, key in _MODEL_INTS.items() if read.has(flag)}
    if "seq_length" not in model and read.has("encoder-seq-length"):
        model["seq_length"] = read.integer("encoder-seq-length")
    if "vocab_size" not in model:
        model["vocab_size"] = DEFAULT_VOCAB_SIZE
        notes.append(
            f"vocab_size = {DEFAULT_VOCAB_SIZE} (the paper's GPT-2 vocabulary): the size of a "
            "--vocab-file / tokenizer cannot be known from the command line; pass --vocab-size"
        )
    return {key: model[key] for key in _MODEL_INTS.values() if key in model}


def _training(read: _Reader, dp: int, notes: list[str]) -> dict[str, Any]:
    micro = read.integer("micro-batch-size") or 1
    global_batch = read.integer("global-batch-size")
    if global_batch is None:
        global_batch = micro * dp
        notes.append(f"global_batch_size = micro_batch_size * dp = {global_batch} (Megatron's default)")
    return {
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "recompute": _recompute(read, notes).value,
        "schedule": "1f1b",  # Megatron has no GPipe schedule
        "dtype": _dtype(read, notes).value,
        "overlap_grad_reduce": read.switch("overlap-grad-reduce"),
        "use_distributed_optimizer": read.switch("use-distributed-optimizer"),
    }


def _parallel(read: _Reader, num_layers: int, num_gpus: int | None, notes: list[str]) -> dict[str, Any]:
    tp = read.integer("tensor-model-parallel-size") or 1
    pp = read.integer("pipeline-model-parallel-size") or 1
    return {
        "tp": tp,
        "pp": pp,
        "dp": _data_parallel(read, tp, pp, num_gpus, notes),
        "vpp": _virtual_pipeline(read, num_layers, pp),
        "sequence_parallel": read.switch("sequence-parallel"),
    }


def _sort_flags(flags: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    """The flags not read into the scenario, shown as written, by bucket."""
    buckets: dict[str, list[str]] = {"ignored": [], "not_modelled": [], "unknown": []}
    for flag, values in flags.items():
        bucket = _bucket(flag)
        if bucket == "not_modelled":
            buckets[bucket].append(f"{_shown(flag, values)}: {_NOT_MODELLED.get(flag, 'not modelled')}")
        elif bucket != "used":
            buckets[bucket].append(_shown(flag, values))
    return {bucket: tuple(shown) for bucket, shown in buckets.items()}


def parse_megatron_args(
    command: str | Sequence[str],
    hardware: str = DEFAULT_HARDWARE,
    name: str = "megatron-import",
    num_gpus: int | None = None,
) -> MegatronImport:
    """Turn a Megatron-LM launch command line into a validated scenario mapping.

    Raises ConfigError naming every problem (a missing required flag, a bad value, a layout
    the scenario rules reject). `num_gpus` overrides any world size on the command line.
    """
    words = split_command_line(command)
    flags, repeated, _ = collect_flags(words)
    notes = [f"--{flag} given more than once; the last value is used" for flag in repeated]
    notes += [
        f"unexpanded shell variable {w}: expand it before importing" for w in words if w.startswith("$")
    ]
    missing = [f"--{flag}" for flag in _REQUIRED if flag not in flags]
    if "--seq-length" in missing and "encoder-seq-length" in flags:
        missing.remove("--seq-length")
    if missing:
        raise ConfigError(SOURCE, [f"required flag missing: {flag}" for flag in missing])
    read = _Reader(flags)
    model = _model(read, notes)
    parallel = _parallel(read, model.get("num_layers") or 1, num_gpus, notes)
    training = _training(read, parallel["dp"], notes)
    if read.problems:
        raise ConfigError(SOURCE, read.problems)
    scenario = {
        "name": name,
        "hardware": hardware,
        "model": model,
        "parallel": parallel,
        "training": training,
    }
    try:
        parse_scenario(scenario, SOURCE)
    except ConfigError as error:  # show how the offending values were derived
        raise ConfigError(SOURCE, error.problems + [f"note: {note}" for note in notes]) from None
    return MegatronImport(scenario=scenario, notes=tuple(notes), **_sort_flags(flags))


def to_megatron_args(scenario: Scenario, gpus_per_node: int | None = None) -> str:
    """A scenario as a Megatron-LM launch line that `parse_megatron_args` reads back to the
    same scenario (hardware and name aside, which are not Megatron's): a torchrun prefix
    whose world size gives dp, then `pretrain_gpt.py` and the flags of every field.

    `gpus_per_node` sets torchrun's --nproc_per_node (default: one node of all GPUs).
    Raises ConfigError for what Megatron cannot run (the GPipe schedule).
    """
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    if tr.schedule is ScheduleKind.GPIPE:
        raise ConfigError(SOURCE, ["training.schedule: value 'gpipe': Megatron-LM has no GPipe schedule"])
    world = scenario.num_gpus
    per_node = gpus_per_node if gpus_per_node and world % gpus_per_node == 0 else world
    flags: list[str] = ["torchrun", "--nnodes", str(world // per_node), "--nproc_per_node", str(per_node)]
    flags.append("pretrain_gpt.py")
    for flag, key in _MODEL_INTS.items():
        value = getattr(m, key)
        if value is not None:
            flags += [f"--{flag}", str(value)]
    flags += ["--max-position-embeddings", str(m.seq_length)]
    flags += ["--micro-batch-size", str(tr.micro_batch_size)]
    flags += ["--global-batch-size", str(tr.global_batch_size)]
    flags += ["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp)]
    if par.vpp > 1:
        flags += ["--num-layers-per-virtual-pipeline-stage", str(scenario.layers_per_chunk)]
    if par.sequence_parallel:
        flags.append("--sequence-parallel")
    if tr.recompute is Recompute.SELECTIVE:
        flags += ["--recompute-granularity", "selective"]
    elif tr.recompute is Recompute.FULL:
        flags += ["--recompute-granularity", "full"]
        flags += ["--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if tr.dtype is not Dtype.FP32:
        flags.append(f"--{tr.dtype.value}")
    if tr.use_distributed_optimizer:
        flags.append("--use-distributed-optimizer")
    if tr.overlap_grad_reduce:
        flags.append("--overlap-grad-reduce")
    return shlex.join(flags)
