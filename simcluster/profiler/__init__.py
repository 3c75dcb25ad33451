"""The real layer in torch: the only package that imports torch (imported lazily, per module).

- `spec`        LayerSpec: shape, tp, sequence parallelism, recompute, dtype, dropout.
- `parallel`    Comm (DistributedComm, ShardStandInComm) and the f / f̄ / g / ḡ operators of
                Figures 4-5; column- and row-parallel linears.
- `ops`         fused scale-mask-softmax, 1-byte-mask dropout, dropout mask sources.
- `weights`     deterministic serial init and Megatron sharding.
- `layer`       ParallelTransformerLayer and its builders (serial, sharded, local shapes).
- `launch`      run_distributed: t processes in one gloo (or NCCL) group.
- `checks`      sharded layer vs serial layer, operator definitions.
- `accounting`  bytes saved for backward vs Table 2 (measure_saved_bytes, table2_bytes).
- `gpu_memory`  `python -m simcluster.profiler.gpu_memory`: allocated bytes of a layer stack.
- `microbench`  `python -m simcluster.profiler.microbench`: the layer's kernels, timed for
                `simcluster calibrate` (`kernels`, `sites`, `timing`, `device_info`, `netbench`).
- `layer_timing` `python -m simcluster.profiler.layer_timing`: the real layer at held-out
                shapes, for `simcluster check-profile` (`shapes` lists both grids).
- `records`     what those two measure, as torch-free dataclasses (JSON in, JSON out).
"""
