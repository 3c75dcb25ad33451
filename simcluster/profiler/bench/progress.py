"""Progress on stderr for long measurements: tqdm where installed, else a line per 10%."""

from __future__ import annotations

import sys
from typing import Any, Protocol


class Progress(Protocol):
    """Where a long run reports: `start(total)`, then `step(label)` per item."""

    def start(self, total: int) -> None: ...

    def step(self, label: str) -> None: ...


class StderrProgress:
    """tqdm on stderr where installed, else one line per 10% (bare GPU machines)."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self._bar: Any = None
        self._done = self._total = 0

    def start(self, total: int) -> None:
        self._total = max(total, 1)
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, file=sys.stderr, desc=self.desc, unit="run", leave=False)

    def step(self, label: str) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label[:40], refresh=False)
            self._bar.update(1)
        elif self._done * 10 // self._total != (self._done - 1) * 10 // self._total:
            print(f"{self.desc}: {self._done}/{self._total}", file=sys.stderr)

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
