#!/usr/bin/env bash
# Calibrate the GPU of this machine, check the profile on held-out shapes, measure the
# layer's activation memory: everything issue 4 asks a GPU for, in one device call.
#
#   bash scripts/gpu_calibrate.sh            # full grids (several minutes on an H100)
#   bash scripts/gpu_calibrate.sh --quick    # tiny grids: a smoke test of the CUDA path
#   DEVICE=cpu bash scripts/gpu_calibrate.sh --quick   # the same steps on a CPU (a dry run)
#
# Run it from the repository root (the device tool does). Results go to $OUT (default
# out/gpu), at most 8 files, the device tool's limit:
#   microbench.json    raw kernel timings, fused attention (SDPA) included
#                                             (python -m simcluster.profiler.bench.microbench;
#                                             ATTENTION_HEAD_DIM=96 also times the layer's head dim)
#   layer_timing.json  raw real-layer timings (python -m simcluster.profiler.bench.layer_timing)
#   gpu_memory.csv/md  allocated bytes vs Table 2 (python -m simcluster.profiler.bench.gpu_memory)
#   <name>.yaml        the fitted profile             } only where pydantic, simpy, typer,
#   <name>-cuda.csv/md the check-profile report      } yaml and numpy import (see below)
#   run.log            versions, nvidia-smi, every step's output
# The measuring steps need torch and the standard library only. The fit needs the
# simulator's dependencies; without them (pydantic and simpy are not in the GPU image),
# fit on your own machine from the two JSON files:
#   simcluster calibrate --device cuda --measurements microbench.json --out hwprofiles/
#   simcluster check-profile hwprofiles/<name>.yaml --device cuda \
#       --measurements layer_timing.json --out-dir hwprofiles/reports
# or carry wheels: a folder `wheels/` in the repository root holding pydantic, pydantic-core,
# annotated-types, typing-inspection and simpy wheels for the machine's Python is
# installed offline into /tmp/pydeps first.
set -uo pipefail

QUICK=""
[[ "${1:-}" == "--quick" ]] && QUICK="--quick"
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
LOG="$OUT/run.log"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
: > "$LOG"

step() {  # step NAME COMMAND...: run, log everything, print one status line
    local name="$1"; shift
    local start=$SECONDS
    echo "== $name: $*" >> "$LOG"
    if "$@" >> "$LOG" 2>&1; then
        echo "ok   $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name ($((SECONDS - start)) s), see $LOG"
        return 1
    fi
}

{
    date -u
    nvidia-smi || true
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); \
        torch.cuda.is_available() and print(torch.cuda.get_device_properties(0))"
} >> "$LOG" 2>&1

HEAD_DIM=()
[[ -n "${ATTENTION_HEAD_DIM:-}" ]] && HEAD_DIM=(--attention-head-dim "$ATTENTION_HEAD_DIM")
step microbench "$PY" -m simcluster.profiler.bench.microbench --device "$DEVICE" $QUICK ${HEAD_DIM[@]+"${HEAD_DIM[@]}"} \
    --out "$OUT/microbench.json"
step layer_timing "$PY" -m simcluster.profiler.bench.layer_timing --device "$DEVICE" $QUICK --out "$OUT/layer_timing.json"
if [[ -n "$QUICK" ]]; then
    step gpu_memory "$PY" -m simcluster.profiler.bench.gpu_memory --hidden-size 1024 --num-attention-heads 16 \
        --seq-length 512 --micro-batch-size 2 --tp 2 --num-layers 2 --device "$DEVICE" --out-dir "$OUT"
else
    step gpu_memory "$PY" -m simcluster.profiler.bench.gpu_memory --device "$DEVICE" --out-dir "$OUT"
fi

if [[ -d wheels ]]; then
    step wheels "$PY" -m pip install --no-index --find-links wheels --target /tmp/pydeps \
        pydantic simpy && export PYTHONPATH="/tmp/pydeps${PYTHONPATH:+:$PYTHONPATH}"
fi
CLI=("$PY" -c "from simcluster.cli import main; main()")
if "$PY" -c "import pydantic, simpy, typer, yaml, numpy" >> "$LOG" 2>&1; then
    step calibrate "${CLI[@]}" calibrate --device "$DEVICE" --measurements "$OUT/microbench.json" --out "$OUT"
    PROFILE=$(ls "$OUT"/*-measured.yaml 2>/dev/null | head -n 1)
    if [[ -n "$PROFILE" ]]; then
        step check-profile "${CLI[@]}" check-profile "$PROFILE" --device "$DEVICE" \
            --measurements "$OUT/layer_timing.json" --out-dir "$OUT"
        sed -n '/^```$/,/^```$/p' "$OUT"/*-"$DEVICE".md
    fi
else
    echo "fit skipped: pydantic/simpy/typer/yaml/numpy missing here; fit locally from" \
         "$OUT/microbench.json and $OUT/layer_timing.json (see the header of this script)"
fi
ls -la "$OUT"
