"""`python -m ops.logpipe FILE`: copy standard input to FILE, rolling it over at a size, so a log never grows
without bound.

The local stack's children (Kafka, Redis, the job, the web UI, ...) write their output into a pipe read by one of
these; at `--max-bytes` the file becomes `FILE.1` (`FILE.1` becomes `FILE.2`, and so on; the oldest beyond
`--backups` is deleted) and a new FILE begins. It ends when every writer has closed the pipe (the child and its own
children have ended), so it needs no stopping of its own and outlives an `adbill up --detach` that started it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

CHUNK = 64 * 1024


class RollingFile:
    """Appends to `path`, keeping `backups` old files: a write that would take a file that holds something past
    `max_bytes` rolls it over first, so the current file always holds the newest lines (a reader of its tail never
    meets an empty file after a roll-over). A roll-over never splits a line: when the file ends inside one (a read
    of the pipe can end anywhere), the write's bytes up to the line's end go to the file first. A file passes
    `max_bytes` only by a single write larger than that, or by the rest of the line it ends with."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        if max_bytes < 1 or backups < 0:
            raise ValueError("a log rolls over at a positive size and keeps zero or more old files")
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self.out = path.open("ab")
        self.size = self.out.tell()
        self.mid_line = self.size > 0 and not self._ends_a_line()

    def write(self, data: bytes) -> None:
        if self.size and self.size + len(data) > self.max_bytes:
            if self.mid_line:
                end = data.find(b"\n") + 1
                if not end:  # the whole write continues the line
                    self._append(data)
                    return
                self._append(data[:end])
                data = data[end:]
                if not data:  # the next write rolls over: the current file is never left empty
                    return
            self.roll()
        self._append(data)

    def _append(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()
        self.size += len(data)
        self.mid_line = not data.endswith(b"\n")

    def _ends_a_line(self) -> bool:
        with self.path.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            return existing.read(1) == b"\n"

    def roll(self) -> None:
        self.out.close()
        for n in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if n == self.backups:
                older.unlink(missing_ok=True)
            else:
                newer_name = self.path.with_name(f"{self.path.name}.{n + 1}")
                if older.exists():
                    older.rename(newer_name)
        if self.backups:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self.out = self.path.open("ab")
        self.size = 0
        self.mid_line = False

    def close(self) -> None:
        self.out.close()


def pipe(source: int, target: RollingFile) -> None:
    """Copy from the file descriptor `source` until end of file."""
    while True:
        data = os.read(source, CHUNK)
        if not data:
            return
        target.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.logpipe", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--max-bytes", type=int, default=20_000_000)
    parser.add_argument("--backups", type=int, default=3)
    args = parser.parse_args(argv)
    # The child's end of the pipe decides when this ends: a Ctrl-C or SIGTERM meant for the stack must not stop the
    # log before the child has written its last lines.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    target = RollingFile(args.file, args.max_bytes, args.backups)
    try:
        pipe(sys.stdin.fileno(), target)
    finally:
        target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
