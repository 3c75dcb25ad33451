"""The options every `python -m simcluster.profiler.bench.<bench>` entry point takes."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def entry_point_parser(description: str, default_out: Path) -> argparse.ArgumentParser:
    """--device, --quick, --threads, --out (the JSON the entry point writes) and --force."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")
    return parser


def parse_entry_point_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parsed arguments, refused before anything is measured when --out names an existing file
    and --force is absent: the same rule as the simcluster commands (simcluster.output_files),
    kept here in the standard library because these entry points run where only torch is
    installed."""
    args = parser.parse_args(argv)
    if args.out.is_dir():
        parser.error(f"--out {args.out}: is a folder; give a file name inside it")
    if args.out.exists() and not args.force:
        parser.error(f"--out {args.out}: the file exists; add --force to replace it")
    return args
