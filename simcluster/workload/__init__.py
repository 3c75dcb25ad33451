"""Config -> per-rank op graph, memory and FLOPs formulas. Pure; knows nothing of SimPy."""
