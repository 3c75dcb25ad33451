"""Parameter sweeps: a spec's axes expanded with `product()`, filtered by the scenario
loader's rules, pruned by memory, simulated in parallel, and streamed to Parquet."""

from simcluster.sweep.expand import Expansion, SweepConfig, config_id, expand
from simcluster.sweep.run import SweepOutcome, best_by_mfu, best_rows, execute_sweep, run_sweep
from simcluster.sweep.spec import SweepSpec, load_sweep_spec, parse_sweep_spec

__all__ = [
    "Expansion",
    "SweepConfig",
    "SweepOutcome",
    "SweepSpec",
    "best_by_mfu",
    "best_rows",
    "config_id",
    "execute_sweep",
    "expand",
    "load_sweep_spec",
    "parse_sweep_spec",
    "run_sweep",
]
