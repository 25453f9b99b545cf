"""Files that are on disk once written: flushed, renamed into place, and their folder flushed too.

A rename makes a file appear whole or not at all to readers, but only `fsync` makes it survive a power loss: the
file's bytes, and the folder entry that names it, sit in the page cache until flushed. The ledger, archive,
quarantine and finance files are written through here before the batch or the period that they belong to is
committed anywhere else (the Spark checkpoint, Redis, the reconciliation state file).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path


def fsync_file(path: Path) -> None:
    """Flush the bytes of the file `path` to disk."""
    with open(path, "rb") as data:
        os.fsync(data.fileno())


def fsync_folder(folder: Path) -> None:
    """Flush the entries of `folder` (files created, renamed or removed in it) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folder(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; returns the folders whose entries changed (the parents of those
    created), to flush once the files in them are written."""
    created = []
    walk = folder
    while not walk.exists():
        created.append(walk)
        walk = walk.parent
    folder.mkdir(parents=True, exist_ok=True)
    return [path.parent for path in reversed(created)]


def replace_file(staging: Path, target: Path) -> None:
    """Flush `staging`, rename it to `target` (same file system, usually the same folder) and flush the folder."""
    replace_files([(staging, target)])


def replace_files(moves: Iterable[tuple[Path, Path]], touched: Iterable[Path] = ()) -> None:
    """Flush every staged file, rename each to its target, then flush the targets' folders and the folders in
    `touched` (those `make_folder` created entries in). The flushes run side by side: each waits on the disk, and
    a micro-batch writes several files."""
    moves = list(moves)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fsync_file, [staging for staging, _ in moves]))
        for staging, target in moves:
            os.replace(staging, target)
        folders = {target.parent for _, target in moves} | set(touched)
        list(pool.map(fsync_folder, sorted(folders)))


@contextmanager
def staged(staging: Path) -> Iterator[Path]:
    """`staging`, a dot-file to write and then rename into place, removed when the block fails (a full disk): no
    half-written staging file is left to hold the room the next attempt needs."""
    try:
        yield staging
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
