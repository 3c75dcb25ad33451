"""The options every `python -m simcluster.profiler.bench.<bench>` entry point takes."""

from __future__ import annotations

import argparse
from pathlib import Path


def entry_point_parser(description: str, default_out: Path) -> argparse.ArgumentParser:
    """--device, --quick, --threads and --out (the JSON the entry point writes)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    parser.add_argument("--out", type=Path, default=default_out)
    return parser
