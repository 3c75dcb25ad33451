"""benchmarks/h100_measured.py loaded by path (benchmarks/ is scripts, not a package)."""

import importlib.util

from tests.paths import ROOT

_SPEC = importlib.util.spec_from_file_location("h100_measured", ROOT / "benchmarks" / "h100_measured.py")
assert _SPEC is not None and _SPEC.loader is not None
h100_measured = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(h100_measured)
