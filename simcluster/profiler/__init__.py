"""The real layer in torch, and the benchmarks that time it: the only package that imports
torch (imported lazily, per module). Needs torch and the standard library only, so that it
runs on a bare GPU machine; what it measures is written as `simcluster.calibration.records`
(torch-free dataclasses, JSON in and out), over the grids of `simcluster.calibration.shapes`.

`layer/`: the real tensor + sequence-parallel transformer layer (Figures 2-5).
- `spec`         LayerSpec: the simulator's `LayerConfig` plus dropout and layer-norm epsilon.
- `parallel`     Comm (DistributedComm, ShardStandInComm) and the f / f̄ / g / ḡ operators of
                 Figures 4-5; column- and row-parallel linears.
- `ops`          fused scale-mask-softmax, 1-byte-mask dropout, dropout mask sources.
- `weights`      deterministic serial init and Megatron sharding.
- `context_parallel` zig-zag sequence chunks and TE's p2p K/V ring attention (cp > 1).
- `transformer`  ParallelTransformerLayer and its builders (serial, sharded, local shapes).
- `checks`       sharded layer vs serial layer, operator definitions.
- `accounting`   bytes saved for backward vs Table 2 (measure_saved_bytes, table2_bytes).

`bench/`: the measuring harness and its entry points.
- `microbench`   `python -m simcluster.profiler.bench.microbench`: the layer's kernels, timed
                 for `simcluster calibrate` (`kernels`, `sites`, `timing`, `device_info`).
- `layer_timing` `python -m simcluster.profiler.bench.layer_timing`: the real layer at
                 held-out shapes, for `simcluster check-profile`.
- `gpu_memory`   `python -m simcluster.profiler.bench.gpu_memory`: allocated bytes of a layer stack.
- `netbench`     all-reduce bus bandwidth for `simcluster calibrate --network`.
- `launch`       run_distributed: t processes in one gloo (or NCCL) group.
- `progress`, `command_line`: progress lines and the entry points' shared options.
"""
