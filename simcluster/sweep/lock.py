"""One sweep at a time per output: a lock file beside `--out`, held with `flock`.

Two sweeps writing the same table would mix their part files and each combine them into a
table of only their own rows, so half the rows vanish. The second sweep is refused instead,
naming the first one's pid. The kernel drops a `flock` when its process dies, however it
dies, so a lock file left by a killed sweep never blocks the next one: the file is only
where the pid is written for the message.
POSIX only (fcntl), like the process pool's fork.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from simcluster.config.errors import ConfigError


def lock_path(out: Path) -> Path:
    return out.with_name(f"{out.name}.lock")


class SweepLock:
    """`with SweepLock(out):` holds the lock on `out` for the block; ConfigError if another
    live process holds it. The lock file is removed on release."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = lock_path(self.out)
        self._fd: int | None = None

    def _holder(self, fd: int) -> str:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        return f"pid {text}" if text.isdigit() else "a process"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder(fd)
                os.close(fd)
                raise ConfigError(
                    self.out,
                    [f"--out: another sweep ({holder}) is writing this table (lock {self.path}); "
                     "wait for it to finish (then --resume), or give another --out"],
                ) from None  # fmt: skip
            # The holder before us removes the file while it holds the lock: if we opened
            # that file, our lock is on a file nobody else will open; start again.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # remove while still holding the lock (see acquire), then let go
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> SweepLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
