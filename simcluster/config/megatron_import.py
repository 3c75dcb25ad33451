"""A Megatron-LM launch command line -> a scenario (`simcluster import-megatron`).

Megatron's argparse names map onto the scenario's keys, which use Megatron's vocabulary;
`megatron_flags` sorts every flag into used / ignored / not modelled / unknown. A flag that
sets a key the simulator does not price yet (`scenario.NOT_MODELLED_YET`) is "not modelled":
the key keeps its default in the scenario (which then loads and runs), and `requested` keeps
the mapping as the command line asked for it. Data parallelism is not a Megatron flag:
Megatron-core derives dp = world size / (tp · cp · pp). The world size comes from
`--world-size`, an explicit `num_gpus`, or torchrun's `--nnodes` × `--nproc_per_node`;
without any, dp = 1 with a note.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from simcluster.config.choices import Dtype, Recompute
from simcluster.config.errors import ConfigError
from simcluster.config.megatron_cmdline import FlagReader, collect_flags, shown, split_command_line
from simcluster.config.megatron_flags import (
    DEFAULT_HARDWARE,
    DEFAULT_VOCAB_DIVISOR,
    DEFAULT_VOCAB_SIZE,
    KEY_FLAGS,
    KEY_REASONS,
    MODEL_INTS,
    NOT_MODELLED,
    REQUIRED,
    SOURCE,
    bucket,
)
from simcluster.config.scenario import (
    NOT_MODELLED_YET_MESSAGE,
    Scenario,
    parse_scenario,
    unpriced_keys,
)

_NORMALIZATION = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
_POSITION = {"learned_absolute": "learned", "rope": "rope"}
# Megatron-core's AttnBackend: flash, fused and auto run one fused kernel per direction.
_ATTENTION = {"flash": "flash", "fused": "flash", "auto": "flash", "unfused": "unfused", "local": "unfused"}
_FP8_FORMATS = ("e4m3", "hybrid")


@dataclass(frozen=True, slots=True)
class MegatronImport:
    """The scenario mapping and what happened to every flag. `requested` is the mapping the
    command line asks for, keys not priced yet included. `scenario` is `requested` with those
    keys at their defaults, validated; where the layout needs them (an uneven pipeline split),
    it is `requested` itself, which `simcluster run` refuses by name (a note says so)."""

    scenario: dict[str, Any]
    notes: tuple[str, ...]
    ignored: tuple[str, ...]
    not_modelled: tuple[str, ...]
    unknown: tuple[str, ...]
    requested: dict[str, Any] = field(default_factory=dict)

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


def _world_size(read: FlagReader, num_gpus: int | None, notes: list[str]) -> int | None:
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


def _data_parallel(
    read: FlagReader, tp: int, cp: int, pp: int, num_gpus: int | None, notes: list[str]
) -> int:
    if read.has("data-parallel-size"):
        return read.integer("data-parallel-size") or 1
    world = _world_size(read, num_gpus, notes)
    shown_sizes = f"tp {tp} * cp {cp} * pp {pp}" if cp > 1 else f"tp {tp} * pp {pp}"
    if world is None:
        notes.append(
            "dp = 1: no world size given (Megatron derives dp = world size / (tp * cp * pp); "
            "pass --world-size N, or torchrun --nnodes/--nproc_per_node)"
        )
        return 1
    if world % (tp * cp * pp):
        read.problems.append(
            f"world size {world}: not a multiple of tp * cp * pp ({shown_sizes} = {tp * cp * pp})"
        )
        return 1
    notes.append(f"dp = {world // (tp * cp * pp)} = world size {world} / ({shown_sizes})")
    return world // (tp * cp * pp)


def _virtual_pipeline(read: FlagReader, num_layers: int, pp: int, extra: int, explicit_split: bool) -> int:
    """vpp from `--num-virtual-stages-per-pipeline-rank` (or the older
    `--virtual-pipeline-model-parallel-size`), or from `--num-layers-per-virtual-pipeline-stage`,
    where Megatron counts the embedding / loss as layers when told to (`extra`)."""
    vpp = read.integer("num-virtual-stages-per-pipeline-rank") or read.integer(
        "virtual-pipeline-model-parallel-size"
    )
    per_stage = read.integer("num-layers-per-virtual-pipeline-stage")
    if per_stage is None:
        return vpp or 1
    if explicit_split:
        read.problems.append(
            "--num-layers-per-virtual-pipeline-stage: cannot be combined with "
            "--decoder-first/last-pipeline-num-layers; allowed: --num-virtual-stages-per-pipeline-rank"
        )
        return vpp or 1
    layers = num_layers + extra
    if layers % pp or (layers // pp) % per_stage:
        counted = f" + {extra} (embedding / loss)" if extra else ""
        read.problems.append(
            f"--num-layers-per-virtual-pipeline-stage: value {per_stage}: must divide the layers "
            f"per pipeline stage (num_layers {num_layers}{counted} / pp {pp})"
        )
        return vpp or 1
    derived = layers // pp // per_stage
    if vpp is not None and vpp != derived:
        read.problems.append(
            f"--num-virtual-stages-per-pipeline-rank {vpp} disagrees with "
            f"--num-layers-per-virtual-pipeline-stage {per_stage} (which gives {derived})"
        )
    return derived


def _recompute(read: FlagReader, notes: list[str], demoted: dict[str, str]) -> Recompute:
    granularity = read.text("recompute-granularity")
    if granularity is None and read.switch("recompute-activations"):
        granularity = "selective"  # Megatron: --recompute-activations means selective
    if granularity is None and read.switch("checkpoint-activations"):
        granularity = "full"  # the 2021 flag: full, uniform, one layer per checkpoint
    modules = read.values("recompute-modules")
    if modules is not None and granularity != "selective":
        notes.append("--recompute-modules without --recompute-granularity selective has no effect")
    if granularity is None:
        if read.has("recompute-method"):
            notes.append("--recompute-method without --recompute-granularity full has no effect")
        return Recompute.NONE
    if granularity not in ("full", "selective"):
        read.problems.append(f"--recompute-granularity: value {granularity!r}: allowed: full, selective")
        return Recompute.NONE
    if granularity == "selective" and modules is not None and set(modules) != {"core_attn"}:
        # Megatron-core's default module list is core_attn, which is what selective prices.
        demoted["recompute-modules"] = "recompute of modules other than core_attn (simulated as core_attn)"
    method, group = read.text("recompute-method"), read.integer("recompute-num-layers")
    if granularity == "full" and (method == "block" or (group or 1) > 1):
        notes.append(
            f"--recompute-method {method} --recompute-num-layers {group}: simulated as full "
            "recompute of every layer (per-layer checkpoints)"
        )
    return Recompute(granularity)


def _dtype(read: FlagReader, notes: list[str]) -> Dtype:
    bf16, fp16 = read.switch("bf16"), read.switch("fp16")
    fp8 = read.text("fp8-format")
    if bf16 and fp16:
        read.problems.append("--bf16 and --fp16: choose one")
    if fp8 is not None:
        if fp8 not in _FP8_FORMATS:
            read.problems.append(f"--fp8-format: value {fp8!r}: allowed: {', '.join(_FP8_FORMATS)}")
        return Dtype.FP8  # Transformer Engine: FP8 GEMMs, bf16 elsewhere
    if bf16 or fp16:
        return Dtype.BF16 if bf16 else Dtype.FP16
    notes.append("dtype fp32: neither --bf16 nor --fp16 given (Megatron then trains in fp32)")
    return Dtype.FP32


def padded_vocab_size(vocab_size: int, divisor: int, tp: int) -> int:
    """Megatron's `_vocab_size_with_padding`: up to a multiple of divisor · tp."""
    multiple = divisor * tp
    return math.ceil(vocab_size / multiple) * multiple


def _vocab(read: FlagReader, tp: int, notes: list[str]) -> int:
    divisor = read.integer("make-vocab-size-divisible-by") or DEFAULT_VOCAB_DIVISOR
    given = read.integer("vocab-size")
    if given is None:
        notes.append(
            f"vocab_size = {DEFAULT_VOCAB_SIZE} (the paper's GPT-2 vocabulary): the size of a "
            "--vocab-file / tokenizer cannot be known from the command line; pass --vocab-size"
        )
        return DEFAULT_VOCAB_SIZE
    padded = padded_vocab_size(given, divisor, tp)
    if padded != given:
        notes.append(
            f"vocab_size = {padded}: --vocab-size {given} padded to a multiple of "
            f"--make-vocab-size-divisible-by {divisor} * tp {tp} (Megatron's _vocab_size_with_padding)"
        )
    return padded


def _model(read: FlagReader, tp: int, notes: list[str]) -> dict[str, Any]:
    model: dict[str, int | None] = {
        key: read.integer(flag) for flag, key in MODEL_INTS.items() if read.has(flag)
    }
    if "seq_length" not in model and read.has("encoder-seq-length"):
        model["seq_length"] = read.integer("encoder-seq-length")
    model["vocab_size"] = _vocab(read, tp, notes)
    swiglu, squared_relu = read.switch("swiglu"), read.switch("squared-relu")
    if swiglu and squared_relu:
        read.problems.append("--swiglu and --squared-relu: choose one")
    if swiglu and model.get("ffn_hidden_size") is None and (h := model.get("hidden_size")):
        model["ffn_hidden_size"] = int(4 * h * 2 / 3 / 64) * 64
        notes.append(
            f"ffn_hidden_size = {model['ffn_hidden_size']}: Megatron's --swiglu default, int(8h/3/64)*64"
        )
    ordered: dict[str, Any] = {key: model[key] for key in MODEL_INTS.values() if key in model}
    if read.switch("group-query-attention"):
        ordered["num_query_groups"] = read.integer("num-query-groups") or 1  # Megatron's default: 1
    elif read.has("num-query-groups"):
        notes.append("--num-query-groups without --group-query-attention has no effect (Megatron)")
    if swiglu or squared_relu:
        ordered["activation"] = "swiglu" if swiglu else "squared_relu"
    if (norm := read.choice("normalization", _NORMALIZATION)) not in (None, "layernorm"):
        ordered["normalization"] = norm
    position = read.choice("position-embedding-type", _POSITION)
    if read.switch("use-rotary-position-embeddings"):
        position = "rope"
    if position not in (None, "learned"):
        ordered["position_embedding"] = position
    if read.switch("untie-embeddings-and-output-weights"):
        ordered["untie_embeddings_and_output_weights"] = True
    return ordered


def _attention_backend(read: FlagReader, notes: list[str]) -> str:
    backend = read.choice("attention-backend", _ATTENTION)
    if read.switch("use-flash-attn"):
        backend = "flash"
    if backend is None:
        notes.append(
            "attention_backend = unfused (the paper's kernels): no --attention-backend given; "
            "Megatron-core's default, auto, runs a fused kernel: pass --attention-backend flash"
        )
    return backend or "unfused"


def _training(read: FlagReader, dp: int, notes: list[str], demoted: dict[str, str]) -> dict[str, Any]:
    micro = read.integer("micro-batch-size") or 1
    global_batch = read.integer("global-batch-size")
    if global_batch is None:
        global_batch = micro * dp
        notes.append(f"global_batch_size = micro_batch_size * dp = {global_batch} (Megatron's default)")
    training: dict[str, Any] = {
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "recompute": _recompute(read, notes, demoted).value,
        "schedule": "1f1b",  # Megatron has no GPipe schedule
        "dtype": _dtype(read, notes).value,
        "overlap_grad_reduce": read.switch("overlap-grad-reduce"),
        "use_distributed_optimizer": read.switch("use-distributed-optimizer"),
    }
    if (backend := _attention_backend(read, notes)) != "unfused":
        training["attention_backend"] = backend
    for flag in ("overlap-param-gather", "tp-comm-overlap"):
        if read.switch(flag):
            training[flag.replace("-", "_")] = True
    return training


def _parallel(read: FlagReader, num_layers: int, num_gpus: int | None, notes: list[str]) -> dict[str, Any]:
    tp = read.integer("tensor-model-parallel-size") or 1
    pp = read.integer("pipeline-model-parallel-size") or 1
    cp = read.integer("context-parallel-size") or 1
    embedding = read.switch("account-for-embedding-in-pipeline-split")
    loss = read.switch("account-for-loss-in-pipeline-split")
    first = read.integer("decoder-first-pipeline-num-layers")
    last = read.integer("decoder-last-pipeline-num-layers")
    parallel: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": _data_parallel(read, tp, cp, pp, num_gpus, notes),
        "vpp": _virtual_pipeline(read, num_layers, pp, int(embedding) + int(loss), None not in (first, last)),
        "sequence_parallel": read.switch("sequence-parallel"),
    }
    optional = {
        "cp": cp if cp > 1 else None,
        "account_for_embedding_in_pipeline_split": embedding or None,
        "account_for_loss_in_pipeline_split": loss or None,
        "first_pipeline_num_layers": first,
        "last_pipeline_num_layers": last,
    }
    return parallel | {key: value for key, value in optional.items() if value is not None}


def _sort_flags(flags: dict[str, list[str]], demoted: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """The flags not read into the scenario, shown as written, by bucket."""
    buckets: dict[str, list[str]] = {"ignored": [], "not_modelled": [], "unknown": []}
    for flag, values in flags.items():
        kind = "not_modelled" if flag in demoted else bucket(flag)
        if kind == "not_modelled":
            reason = demoted.get(flag) or NOT_MODELLED.get(flag, "not modelled")
            buckets[kind].append(f"{shown(flag, values)}: {reason}")
        elif kind != "used":
            buckets[kind].append(shown(flag, values))
    return {kind: tuple(flags_shown) for kind, flags_shown in buckets.items()}


def _checked(requested: dict[str, Any], notes: list[str]) -> Scenario:
    """The requested mapping under every rule but the refusal of keys not priced yet."""
    try:
        return parse_scenario(requested, SOURCE, refuse_unpriced=False)
    except ConfigError as error:  # show how the offending values were derived
        raise ConfigError(SOURCE, error.problems + [f"note: {note}" for note in notes]) from None


def _without_unpriced(
    requested: dict[str, Any], scenario: Scenario, flags: dict[str, list[str]], demoted: dict[str, str]
) -> dict[str, Any]:
    """The mapping with each key the simulator does not price yet back at its default; the
    flags that set it become "not modelled"."""
    runnable = copy.deepcopy(requested)
    for key in unpriced_keys(scenario):
        section, name = key.split(".")
        if key == "training.dtype":
            runnable[section][name] = Dtype.BF16.value  # FP8 keeps bf16 outside its GEMMs
        else:
            runnable[section].pop(name, None)
        for flag in KEY_FLAGS[key]:
            if flag in flags:
                demoted[flag] = f"{KEY_REASONS[key]}; {key} is {NOT_MODELLED_YET_MESSAGE}"
    return runnable


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
    missing = [f"--{flag}" for flag in REQUIRED if flag not in flags]
    if "--seq-length" in missing and "encoder-seq-length" in flags:
        missing.remove("--seq-length")
    if missing:
        raise ConfigError(SOURCE, [f"required flag missing: {flag}" for flag in missing])
    read = FlagReader(flags)
    demoted: dict[str, str] = {}
    tp = read.integer("tensor-model-parallel-size") or 1
    model = _model(read, tp, notes)
    parallel = _parallel(read, model.get("num_layers") or 1, num_gpus, notes)
    training = _training(read, parallel["dp"], notes, demoted)
    if read.problems:
        raise ConfigError(SOURCE, read.problems)
    requested = {
        "name": name,
        "hardware": hardware,
        "model": model,
        "parallel": parallel,
        "training": training,
    }
    full = _checked(requested, notes)
    scenario = _without_unpriced(requested, full, flags, demoted)
    if scenario != requested:
        if full.parallel.cp > 1 and "cp" not in scenario["parallel"]:
            notes.append(
                f"cp {full.parallel.cp} is not simulated yet: {full.num_gpus // full.parallel.cp} "
                f"of the run's {full.num_gpus} GPUs (tp * pp * dp) are"
            )
        try:
            parse_scenario(scenario, SOURCE)
        except ConfigError as error:  # e.g. 126 layers on pp 16 x vpp 8 need the uneven split
            notes.append(
                f"the run cannot be simulated without the keys not priced yet ({'; '.join(error.problems)}): "
                "the scenario keeps them as given, and `simcluster run` refuses it until they are priced"
            )
            scenario = copy.deepcopy(requested)
    return MegatronImport(
        scenario=scenario, notes=tuple(notes), requested=requested, **_sort_flags(flags, demoted)
    )
