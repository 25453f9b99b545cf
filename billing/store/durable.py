"""Files that are on disk once written: flushed, renamed into place, and their folder flushed too.

`write_whole` is the one way the product writes a file whole (a record, a kept list, a catalog file, an invoice, a
simulated run's files): readers see the old file or the new one, never half of one, a power loss keeps whichever was
renamed last, and a writer that fails leaves no staging file behind.

A rename makes a file appear whole or not at all to readers, but only `fsync` makes it survive a power loss: the
file's bytes, and the folder entry that names it, sit in the page cache until flushed. The ledger, archive,
quarantine and finance files are written through here before the batch or the period that they belong to is
committed anywhere else (the Spark checkpoint, Redis, the reconciliation state file).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


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


STEPS = ("staged", "flushed", "renamed")
"""The points between `write_whole`'s steps: the staging file written, flushed to disk, renamed into place (the
folder's flush follows)."""

step_hook: Callable[[str, Path], None] | None = None
"""Called with each of `STEPS` and the target, when set: how a test stops a writer between its steps."""


def write_whole(target: Path, write: str | Callable[[IO[str]], None], mode: int | None = None) -> None:
    """Write `target` whole: `write` (a text, or a function given the open text file) into a hidden staging file in
    the same folder, flushed, renamed over `target`, the folder flushed (with the folders made for it). `mode`: the
    file's permissions (the staging file is 0600 until then). The staging file is removed when any step fails."""
    if isinstance(write, str):
        text = write
        _write_whole(target, "w", lambda out: out.write(text), mode)
    else:
        _write_whole(target, "w", write, mode)


def write_whole_bytes(target: Path, write: Callable[[IO[bytes]], None], mode: int | None = None) -> None:
    """`write_whole` of a binary file: `write` is given the open staging file."""
    _write_whole(target, "wb", write, mode)


def _write_whole(target: Path, open_mode: str, write: Callable[[IO[Any]], Any], mode: int | None) -> None:
    touched = make_folder(target.parent)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    staging = Path(name)
    with staged(staging):
        with os.fdopen(fd, open_mode, encoding=None if "b" in open_mode else "utf-8") as out:
            write(out)
            _step("staged", target)
            out.flush()
            os.fsync(out.fileno())
        _step("flushed", target)
        if mode is not None:
            os.chmod(staging, mode)
        os.replace(staging, target)
    _step("renamed", target)
    for folder in {target.parent, *touched}:
        fsync_folder(folder)


def _step(name: str, target: Path) -> None:
    if step_hook is not None:
        step_hook(name, target)
