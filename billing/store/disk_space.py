"""A full disk: recognise it, wait for room, go on.

A write that fails with ENOSPC (no space left on the device) or EDQUOT (a quota reached) says nothing about the
data: the same write succeeds once the operator makes room. The streaming job and reconciliation run the steps
that write to the data folder through `retry_while_disk_full`, the one wait of the product: it tries the step
again with a growing pause (1 s up to 15 s), logs a line when the wait starts, one a minute while it lasts and
one when it ends, and reports the wait to `status` (the part's health record in Redis, `PartStatus`). Every
step given to it is idempotent (a batch replayed from the checkpoint replaces its own files, Redis applies a batch
id once, a reconciliation run completes what an earlier one left), so trying it again loses nothing and bills
nothing twice; a write that failed half-way leaves at most a dot-file that readers skip and the next attempt
replaces or removes.

Failures are recognised by their errno (Python's OSError) or, for the JVM's and the Python workers' failures that
reach the driver as text (Spark, Py4J), by the operating system's message.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_MESSAGES = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), "No space left on device")
"""How the operating system says it (`No space left on device`, `Disk quota exceeded`), as Java and Python
print it in the failures Spark hands over as text."""

PAUSES_S = (1.0, 2.0, 5.0, 10.0, 15.0)
"""Pauses between attempts; the last one repeats."""

LOG_EVERY_S = 60.0
"""While a wait lasts, one log line (and one status update) per this many seconds."""

PROBE_BYTES = 4 << 20
"""What `probe_room` writes: room for a small batch's files."""


def is_disk_full(failure: BaseException | str | None) -> bool:
    """Whether `failure` (an exception, with its causes, or a failure's text) says the disk or a quota is full."""
    seen: set[int] = set()
    while failure is not None and id(failure) not in seen:
        if isinstance(failure, str):
            return any(message in failure for message in DISK_FULL_MESSAGES)
        seen.add(id(failure))
        if isinstance(failure, OSError) and failure.errno in DISK_FULL_ERRNOS:
            return True
        if any(message in str(failure) for message in DISK_FULL_MESSAGES):
            return True
        failure = failure.__cause__ or failure.__context__
    return False


def probe_room(folder: Path, size: int = PROBE_BYTES) -> None:
    """Write `size` bytes to a dot-file in `folder`, flush them to disk and remove the file: OSError (ENOSPC) when
    there is not that much room. The file is removed either way."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".disk-probe-{os.getpid()}"
    try:
        with probe.open("wb") as out:
            out.write(b"\0" * size)
            out.flush()
            os.fsync(out.fileno())
    finally:
        probe.unlink(missing_ok=True)


def retry_while_disk_full(
    step: Callable[[], T],
    what: str,
    folder: Path,
    status: Callable[[str | None], None] = lambda message: None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`step()`, tried again for as long as it fails because the disk (of `folder`) is full; any other failure is
    raised at once. `status(message)` hears when the wait starts and each minute while it lasts, `status(None)` when
    the step went through after a wait."""
    started: float | None = None
    reported = 0.0
    attempts = 0
    while True:
        try:
            result = step()
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            now = clock()
            if started is None:
                started = reported = now
                message = f"waiting for disk space in {folder}: {what} failed ({_first_line(exc)}); trying again"
                log.warning("%s until there is room", message)
                status(message)
            elif now - reported >= LOG_EVERY_S:
                reported = now
                message = f"waiting for disk space in {folder} for {now - started:.0f} s: {what}"
                log.warning(message)
                status(message)
            sleep(PAUSES_S[min(attempts, len(PAUSES_S) - 1)])
            attempts += 1
            continue
        if started is not None:
            log.warning("disk space is back in %s after %.0f s: %s done", folder, clock() - started, what)
            status(None)
        return result


def _first_line(exc: BaseException) -> str:
    """The line of a failure's text that names the full disk (Spark's failures are long), else its first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    named = [line for line in lines if any(message in line for message in DISK_FULL_MESSAGES)]
    return (named or lines)[0][:300]
