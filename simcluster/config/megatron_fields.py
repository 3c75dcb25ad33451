"""Megatron flags -> the scenario's model, parallel and training mappings (Megatron's
defaults and derivations: dp = world / (tp·cp·pp), vpp from layers per virtual stage,
the padded vocabulary, SwiGLU's FFN width)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simcluster.config.choices import Dtype, Recompute
from simcluster.config.megatron_cmdline import FlagReader
from simcluster.config.megatron_flags import (
    DEFAULT_VOCAB_DIVISOR,
    DEFAULT_VOCAB_SIZE,
    FUSED_ATTENTION_OFF,
    MODEL_FLOATS,
    MODEL_INTS,
)
from simcluster.config.megatron_moe import read_recompute_modules
from simcluster.config.pipeline_layout import LayoutError, parse_layout

_NORMALIZATION = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
_POSITION = {"learned_absolute": "learned", "rope": "rope"}
# Megatron-core's AttnBackend: flash, fused and auto run one fused kernel per direction.
_ATTENTION = {"flash": "flash", "fused": "flash", "auto": "flash", "unfused": "unfused", "local": "unfused"}
_FP8_FORMATS = ("e4m3", "hybrid")
# megatron/core/transformer/transformer_config.py fp8_recipe (and fp8_utils.py::get_fp8_recipe); custom
# (a user's quantizer factory) has no model here and is simulated as delayed scaling
_FP8_RECIPES = {
    "delayed": "delayed", "tensorwise": "tensorwise", "mxfp8": "mxfp8",
    "blockwise": "blockwise", "custom": "delayed",
}  # fmt: skip
# transformer_config.py: fp4 (`--fp4-format`) Literal['e2m1'], fp4_recipe Literal['nvfp4', 'custom'];
# custom is simulated as nvfp4
_FP4_FORMATS = ("e2m1",)
_FP4_RECIPES = {"nvfp4": "nvfp4", "custom": "nvfp4"}


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


def _layout_virtual_pipeline(read: FlagReader, layout: str, pp: int) -> int:
    """vpp as Megatron derives it from `--pipeline-model-parallel-layout` (arguments.py: the
    layout's stage count over pp, which must divide it; no other vpp flag beside it). A layout
    that does not parse keeps vpp 1: the scenario loader names what is wrong with it."""
    others = [
        flag
        for flag in ("num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank")
        if read.has(flag)
    ]
    if others:
        read.problems.append(
            f"--pipeline-model-parallel-layout: cannot be combined with --{', --'.join(others)}; "
            "Megatron derives the virtual-pipeline size from the layout's stages"
        )
    try:
        stages = parse_layout(layout).num_stages
    except LayoutError:
        return 1
    if stages % pp:
        read.problems.append(
            f"--pipeline-model-parallel-layout: value {layout!r}: has {stages} stages, which must be "
            f"divisible by --pipeline-model-parallel-size ({pp})"
        )
        return 1
    return stages // pp


def _recompute(read: FlagReader, notes: list[str]) -> Recompute:
    granularity = read.text("recompute-granularity")
    if granularity is None and read.switch("recompute-activations"):
        granularity = "selective"  # Megatron: --recompute-activations means selective
    if granularity is None and read.switch("checkpoint-activations"):
        granularity = "full"  # the 2021 flag: full, uniform, one layer per checkpoint
    if read.switch("moe-layer-recompute"):  # deprecated: selective with the `moe` module
        if granularity == "full":
            read.problems.append("--moe-layer-recompute with --recompute-granularity full: Megatron raises")
        granularity = granularity or "selective"
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
    method, group = read.text("recompute-method"), read.integer("recompute-num-layers")
    if granularity == "full" and (method == "block" or (group or 1) > 1):
        notes.append(
            f"--recompute-method {method} --recompute-num-layers {group}: simulated as full "
            "recompute of every layer (per-layer checkpoints)"
        )
    return Recompute(granularity)


def _dtype(read: FlagReader, notes: list[str]) -> Dtype:
    bf16, fp16 = read.switch("bf16"), read.switch("fp16")
    fp8, fp4 = read.text("fp8-format"), read.text("fp4-format")
    if bf16 and fp16:
        read.problems.append("--bf16 and --fp16: choose one")
    if fp4 is not None:
        # megatron/training/arguments.py: "--fp4-format and --fp8-format cannot be used
        # simultaneously. Please choose one."
        if fp8 is not None:
            read.problems.append("--fp4-format and --fp8-format: choose one (Megatron refuses both)")
        if fp4 not in _FP4_FORMATS:
            read.problems.append(f"--fp4-format: value {fp4!r}: allowed: {', '.join(_FP4_FORMATS)}")
        return Dtype.FP4  # Transformer Engine NVFP4BlockScaling: FP4 GEMMs, bf16 elsewhere
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


def read_model(read: FlagReader, tp: int, notes: list[str]) -> dict[str, Any]:
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
    for flag, key in MODEL_FLOATS.items():
        if read.has(flag):
            ordered[key] = read.number(flag)
    # TransformerConfig.add_bias_linear (default True; `--disable-bias-linear` is its argparse
    # name, megatron/core/transformer/transformer_config.py @d98e8a64): the dense linears'
    # biases here, the router's and the experts' in `megatron_moe` from the same flag
    if read.switch("disable-bias-linear"):
        ordered["add_bias_linear"] = False
    return ordered


def _attention_backend(read: FlagReader, notes: list[str]) -> str:
    backend = read.choice("attention-backend", _ATTENTION)
    if read.switch("use-flash-attn"):
        backend = "flash"
    if backend is None and (read.integer("context-parallel-size") or 1) > 1:
        # Megatron-core's default `auto` runs TE's fused attention, the only backend with
        # context parallelism (the unfused DotProductAttention asserts cp == 1): the line runs
        # in Megatron, so it must not import as a layout `run` refuses.
        notes.append(
            "attention_backend = flash: no --attention-backend given; Megatron-core's default, "
            "auto, runs TE's fused attention, the only backend with --context-parallel-size > 1"
        )
        return "flash"
    if backend is None and read.has("multi-latent-attention"):
        # the same default `auto` runs MLA in TE's fused attention; the simulator prices MLA
        # with the flash backend only
        notes.append(
            "attention_backend = flash: no --attention-backend given; Megatron-core's default, "
            "auto, runs multi-latent attention in TE's fused attention"
        )
        return "flash"
    if backend is None:
        notes.append(
            "attention_backend = unfused (the paper's kernels): no --attention-backend given; "
            "Megatron-core's default, auto, runs a fused kernel: pass --attention-backend flash"
        )
    return backend or "unfused"


def read_environment(launcher: list[str], training: dict[str, Any], notes: list[str]) -> None:
    """Environment assignments before the launcher that change what is priced: with
    `NVTE_FUSED_ATTN=0` a flash backend runs FlashAttention-2 (`attention_kernel`)."""
    if FUSED_ATTENTION_OFF not in launcher:
        return
    if training.get("attention_backend") != "flash":
        notes.append(f"{FUSED_ATTENTION_OFF} has no effect here: the attention is unfused")
        return
    training["attention_kernel"] = "flash_attn_2"
    notes.append(
        f"attention_kernel = flash_attn_2: {FUSED_ATTENTION_OFF} turns off TE's cuDNN attention, so TE "
        "runs flash-attn's kernels (priced as FlashAttention-2; with FlashAttention-3 installed set "
        "attention_kernel: auto, whose cuDNN rates are close to FA3's)"
    )


def read_training(read: FlagReader, dp: int, notes: list[str], demoted: dict[str, str]) -> dict[str, Any]:
    micro = read.integer("micro-batch-size") or 1
    global_batch = read.integer("global-batch-size")
    if global_batch is None:
        global_batch = micro * dp
        notes.append(f"global_batch_size = micro_batch_size * dp = {global_batch} (Megatron's default)")
    training: dict[str, Any] = {
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "recompute": _recompute(read, notes).value,
        "schedule": "1f1b",  # Megatron has no GPipe schedule
        "dtype": _dtype(read, notes).value,
        "overlap_grad_reduce": read.switch("overlap-grad-reduce"),
        "use_distributed_optimizer": read.switch("use-distributed-optimizer"),
    }
    if (modules := read_recompute_modules(read, training["recompute"], demoted)) is not None:
        training["recompute_modules"] = modules
    if (backend := _attention_backend(read, notes)) != "unfused":
        training["attention_backend"] = backend
    switches = ("overlap-param-gather", "tp-comm-overlap", "grad-reduce-in-bf16", "fp8-param-gather")
    for flag in (*switches, "fp4-param-gather"):
        if read.switch(flag):
            training[flag.replace("-", "_")] = True
    if (recipe := _recipe(read, _FP8_RECIPE, training["dtype"], notes, demoted)) != "delayed":
        training["fp8_recipe"] = recipe
    if (fp4_recipe := _recipe(read, _FP4_RECIPE, training["dtype"], notes, demoted)) != "nvfp4":
        training["fp4_recipe"] = fp4_recipe
    if (graph := _cuda_graph_impl(read, notes, demoted)) != "none":
        training["cuda_graph_impl"] = graph
        if graph != "full_iteration" and (scope := _cuda_graph_scope(read, demoted)):
            training["cuda_graph_scope"] = scope
    return training


_CUDA_GRAPH_IMPLS = {name: name for name in ("none", "local", "transformer_engine", "full_iteration")}
_WHOLE_LAYER_MODULES = ("full",)  # Megatron's deprecated "full": the whole layer, as an empty list
_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")  # config.graph_scope.CudaGraphScope


def _cuda_graph_impl(read: FlagReader, notes: list[str], demoted: dict[str, str]) -> str:
    """Megatron-LM's CUDA-graph flags (megatron/training/arguments.py::validate_args): the
    deprecated `--enable-cuda-graph` is `--cuda-graph-impl local`, `--external-cuda-graph`
    is `transformer_engine` (neither with --cuda-graph-impl, nor both); the module list
    (`--cuda-graph-modules`, formerly `--cuda-graph-scope`) value full_iteration turns a
    local impl into `full_iteration`. A partial module list (attn, mlp, moe_router, ...) is
    `training.cuda_graph_scope` (`_cuda_graph_scope`)."""
    impl = read.choice("cuda-graph-impl", _CUDA_GRAPH_IMPLS)
    legacy = [flag for flag in ("enable-cuda-graph", "external-cuda-graph") if read.switch(flag)]
    if len(legacy) == 2 or (legacy and impl is not None):
        given = " and ".join(f"--{flag}" for flag in (*legacy, *(["cuda-graph-impl"] if impl else [])))
        read.problems.append(f"{given}: give one of them (Megatron asserts)")
    elif legacy:
        impl = "local" if legacy[0] == "enable-cuda-graph" else "transformer_engine"
    impl = impl or "none"
    for flag in ("cuda-graph-modules", "cuda-graph-scope"):
        modules = read.values(flag) or []
        if "full_iteration" in modules and impl in ("none", "local", "full_iteration"):
            impl = "full_iteration"
            notes.append(f"cuda_graph_impl = full_iteration: --{flag} full_iteration (Megatron migrates it)")
    return impl


def _cuda_graph_scope(read: FlagReader, demoted: dict[str, str]) -> list[str]:
    """`--cuda-graph-modules` (or the deprecated `--cuda-graph-scope`) entries the scenario's
    `training.cuda_graph_scope` holds; "full" is the whole layer (the empty list); others
    (mamba, ...) are listed as not modelled and left out."""
    scope: list[str] = []
    for flag in ("cuda-graph-modules", "cuda-graph-scope"):
        modules = [m for m in read.values(flag) or [] if m not in (*_WHOLE_LAYER_MODULES, "full_iteration")]
        if unknown := [m for m in modules if m not in _SCOPES]:
            demoted[flag] = f"CUDA-graph capture of {', '.join(unknown)} (not modelled; left out)"
        scope += [m for m in modules if m in _SCOPES and m not in scope]
    return scope


@dataclass(frozen=True)
class _Recipe:
    """One low-precision format's `--fpN-recipe` flag: the format it needs, Megatron's
    default, and what a `custom` recipe (a quantizer factory) is simulated as."""

    flag: str
    choices: Any
    dtype: Dtype
    default: str
    label: str
    custom_as: str


# Megatron-core `--fp8-recipe` (fp8_utils.py) and `--fp4-recipe` (fp4_utils.py::get_fp4_recipe:
# nvfp4 is TE's NVFP4BlockScaling)
_FP8_RECIPE = _Recipe("fp8-recipe", _FP8_RECIPES, Dtype.FP8, "delayed", "FP8", "delayed scaling")
_FP4_RECIPE = _Recipe("fp4-recipe", _FP4_RECIPES, Dtype.FP4, "nvfp4", "FP4", "nvfp4")


def _recipe(read: FlagReader, recipe: _Recipe, dtype: str, notes: list[str], demoted: dict[str, str]) -> str:
    """The recipe the line sets, or the default where it sets none or trains without the
    format (a note says the flag had no effect)."""
    chosen = read.choice(recipe.flag, recipe.choices)
    if chosen is None:
        return recipe.default
    if dtype != recipe.dtype.value:
        fmt = recipe.flag.replace("recipe", "format")
        notes.append(
            f"--{recipe.flag} without --{fmt} has no effect (Megatron trains without {recipe.label})"
        )
        return recipe.default
    if read.text(recipe.flag) == "custom":
        demoted[recipe.flag] = f"the custom {recipe.label} recipe (simulated as {recipe.custom_as})"
    return chosen


def read_parallel(
    read: FlagReader, num_layers: int, num_gpus: int | None, notes: list[str]
) -> dict[str, Any]:
    tp = read.integer("tensor-model-parallel-size") or 1
    pp = read.integer("pipeline-model-parallel-size") or 1
    cp = read.integer("context-parallel-size") or 1
    embedding = read.switch("account-for-embedding-in-pipeline-split")
    loss = read.switch("account-for-loss-in-pipeline-split")
    first = read.integer("decoder-first-pipeline-num-layers")
    last = read.integer("decoder-last-pipeline-num-layers")
    layout = read.text("pipeline-model-parallel-layout")
    vpp = (
        _virtual_pipeline(read, num_layers, pp, int(embedding) + int(loss), None not in (first, last))
        if layout is None
        else _layout_virtual_pipeline(read, layout, pp)
    )
    parallel: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": _data_parallel(read, tp, cp, pp, num_gpus, notes),
        "vpp": vpp,
        "sequence_parallel": read.switch("sequence-parallel"),
    }
    optional = {
        "cp": cp if cp > 1 else None,
        "account_for_embedding_in_pipeline_split": embedding or None,
        "account_for_loss_in_pipeline_split": loss or None,
        "first_pipeline_num_layers": first,
        "last_pipeline_num_layers": last,
        "pipeline_layout": layout,
    }
    return parallel | {key: value for key, value in optional.items() if value is not None}
