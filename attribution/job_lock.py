"""Whether the streaming job runs, from something it holds while it runs: an exclusive lock on a file of the data
folder (`DataLayout.job_lock`), taken before its query starts and released when the query ends, or by the operating
system when its process ends, however it ends.

`adbill restore-redis` takes the same lock for the time of the restore: it knows the job is stopped (not merely
quiet for a while), and a job started meanwhile waits for the restore instead of counting into a half-restored
Redis.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from attribution.listener import ProgressListener


class JobLockedError(RuntimeError):
    """Another process holds the lock: the streaming job runs (or a restore of Redis does)."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"{path} is held by {holder}")


_HELD: dict[Path, FileLock] = {}
"""The locks this process holds, by file."""
_HELD_MUTEX = threading.Lock()


class FileLock:
    """An exclusive `flock` on one file, with the holder's description written in it.

    Between processes the lock is exclusive. Within one process a later holder takes it over from an earlier one that
    is no longer in use (`in_use`): a query stopped in this process lets go of the job's lock only when Spark's
    listener bus reports the stop, a moment later or, when the bus drops the event, never; the process's own next
    start (or restore) must not wait for that."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        self._handle: IO[str] | None = None
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self._handle is not None

    def in_use(self) -> bool:
        """Whether what the lock guards still goes on (a plain lock: as long as it is held)."""
        return self.held

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock, waiting up to `wait_s` for its holder to let go; JobLockedError after that. Taking a lock
        this object holds already does nothing."""
        deadline = time.monotonic() + wait_s
        with self._mutex:
            if self._handle is not None:
                return
            with _HELD_MUTEX:
                earlier = _HELD.get(self.path.resolve())
            if earlier is not None and earlier is not self and not earlier.in_use():
                earlier.release()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a+")
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        handle.seek(0)
                        holder = handle.read().strip() or "another process"
                        handle.close()
                        raise JobLockedError(self.path, holder) from None
                    time.sleep(0.2)
            handle.seek(0)
            handle.truncate()
            handle.write(f"{self.holder}, pid {os.getpid()} since {int(time.time() * 1000)}")
            handle.flush()
            self._handle = handle
            with _HELD_MUTEX:
                _HELD[self.path.resolve()] = self

    def release(self) -> None:
        with self._mutex:
            if self._handle is None:
                return
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
            with _HELD_MUTEX:
                if _HELD.get(self.path.resolve()) is self:
                    del _HELD[self.path.resolve()]


class JobLock(FileLock, ProgressListener):
    """The streaming job's lock: held from before its query starts until that query terminates (`follow`)."""

    reads_progress = False

    def __init__(self, path: Path) -> None:
        FileLock.__init__(self, path, "the streaming job (adbill stream)")
        self.query_id: str | None = None
        self.query: Any = None

    def follow(self, query_id: str, query: Any = None) -> None:
        """Release the lock when the query with this id terminates."""
        self.query_id = query_id
        self.query = query

    def in_use(self) -> bool:
        """Held, and the query it follows is still active (its stop may not have been reported yet)."""
        return self.held and (self.query is None or bool(self.query.isActive))

    def onQueryTerminated(self, event: Any) -> None:
        if self.query_id is not None and str(event.id) == self.query_id:
            self.query_id = None
            self.release()
