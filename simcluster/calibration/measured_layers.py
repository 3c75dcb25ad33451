"""Modern layers measured on a GPU by the scripts beside the measurements -> check records.

`docs/calibration/h100-2026-11-26/measure.py` timed twelve layers eager (`layers`: Llama 3
8B / 70B and GPT-3 175B shards at t 1-8, with the project's real torch layer and
`ShardStandInComm`, exactly as `check-profile` runs the paper grid) and `measure3.py` three
layers at t = 1 eager and under torch.compile (`layers`, medians of 20 forward + backward).
This module turns both into one `records.LayerRun`, the format `check-profile
--measurements` reads, so the modern layers are checked by the same code as the paper grid:

    python -m simcluster.calibration.measured_layers \\
        docs/calibration/h100-2026-11-26 --out docs/calibration/h100-2026-11-26/modern_layer_timing.json

Each layer's name and model fields (GQA groups, MLP width, activation, norm, positions,
attention backend, dropouts) go to `LayerTiming.layer` as `workload.LayerConfig` names
them; a field the file leaves out is the paper layer's (`LayerConfig`'s default). Each
timing carries its `layer_mode`: eager, or fused for measure3.py's torch.compile'd layer.
The device description comes from the same day's `microbench.json` (same GPU, driver,
torch and CUDA); measure3.py recorded no forward time, spread or repeat count apart from
its 20 repeats, so those are None / 20. Standard library only (and `config.choices`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from simcluster.atomic_files import write_text_atomically
from simcluster.calibration.records import (
    LAYER_CONFIG_FIELDS,
    LAYER_DROPOUTS,
    DeviceInfo,
    LayerRun,
    LayerTiming,
)
from simcluster.config.choices import LayerMode

EAGER_FILE = "layers_kernels_gemm_clocks.json"
COMPILED_FILE = "layers_eager_vs_compiled.json"
DEVICE_FILE = "microbench.json"
COMPILED_REPEATS = 20  # measure3.py: median_time(step, dev, n=20)
PAPER_DROPOUT = 0.1  # LayerConfig's default hidden / attention dropout

_MODEL_FIELDS = tuple(key for key in LAYER_CONFIG_FIELDS if key not in LAYER_DROPOUTS)  # dropouts: below


def _layer(row: dict[str, Any]) -> dict[str, Any]:
    """`LayerTiming.layer`: the name and the LayerConfig fields the file gives, the dropouts
    always (the paper layer's 0.1 where the file names none)."""
    model = row["model"]
    return {
        "name": row["name"],
        **{key: model[key] for key in _MODEL_FIELDS if key in model},
        "hidden_dropout": float(model.get("hidden_dropout", PAPER_DROPOUT)),
        "attention_dropout": float(model.get("attention_dropout", PAPER_DROPOUT)),
    }


def _timing(row: dict[str, Any], mode: LayerMode, **times: Any) -> LayerTiming:
    model = row["model"]
    return LayerTiming(
        hidden_size=model["hidden_size"],
        num_attention_heads=model["num_attention_heads"],
        seq_length=row["seq_length"],
        micro_batch_size=row["micro_batch_size"],
        tp=row["tp"],
        sequence_parallel=bool(row.get("sequence_parallel", False)),
        recompute=row.get("recompute", "none"),
        layer=_layer(row),
        layer_mode=mode.value,
        **times,
    )


def eager_timings(data: dict[str, Any]) -> list[LayerTiming]:
    """measure.py's `layers` rows (rows with an `error` were not measured and are left out)."""
    return [
        _timing(
            row,
            LayerMode.EAGER,
            forward_s=row["forward_s"],
            total_s=row["total_s"],
            spread=row["spread"],
            repeats=row["repeats"],
        )
        for row in data["layers"]
        if "error" not in row
    ]


def compiled_timings(data: dict[str, Any]) -> list[LayerTiming]:
    """measure3.py's rows: the eager and the torch.compile'd forward + backward of each layer;
    the compiled one is recorded as `LayerMode.FUSED` (torch.compile of the whole layer fuses
    its memory-bound regions, the GEMMs and flash calls staying library kernels)."""
    out = []
    for row in data["layers"]:
        for mode, key in ((LayerMode.EAGER, "eager_s"), (LayerMode.FUSED, "compiled_s")):
            if key in row:
                times = {"forward_s": None, "total_s": row[key], "spread": None, "repeats": COMPILED_REPEATS}
                out.append(_timing(row, mode, **times))
    return out


def measured_layer_run(folder: Path) -> LayerRun:
    """The modern layers of one measurement folder as a `LayerRun` (module docstring)."""
    eager = json.loads((folder / EAGER_FILE).read_text())
    compiled = json.loads((folder / COMPILED_FILE).read_text())
    device = DeviceInfo(**json.loads((folder / DEVICE_FILE).read_text())["device"])
    if device.name != eager["device"] or device.name != compiled["device"]:
        raise ValueError(
            f"{folder}: device: {eager['device']!r} / {compiled['device']!r} in the layer files, "
            f"{device.name!r} in {DEVICE_FILE}: allowed: one GPU"
        )
    return LayerRun(
        device=device,
        command=f"measure.py --out {EAGER_FILE}; measure3.py --out {COMPILED_FILE} (converted by "
        "python -m simcluster.calibration.measured_layers)",
        grid="modern",
        dtype="bf16",
        dropout_prob=PAPER_DROPOUT,
        timings=[*eager_timings(eager), *compiled_timings(compiled)],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a measurement folder (docs/calibration/<gpu>-<date>)")
    parser.add_argument("--out", type=Path, required=True, help="the LayerRun JSON to write")
    args = parser.parse_args(argv)
    write_text_atomically(args.out, measured_layer_run(args.folder).to_json() + "\n")


if __name__ == "__main__":
    main()
