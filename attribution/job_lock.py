"""Whether the streaming job runs, from something it holds while it runs: an exclusive lock on a file of the data
folder (`DataLayout.job_lock`), taken before its query starts and released when the query ends for good, or by the
operating system when its process ends, however it ends. A restart of the query for new schema versions
(`attribution.schema_follow`) happens under the lock: the next run starts while the job holds it.

`adbill restore-redis` takes the same lock for the time of the restore: it knows the job is stopped (not merely
quiet for a while), and a job started meanwhile waits for the restore instead of counting into a half-restored
Redis. With the catalog's database, both hold the same lock there too (`billing.store.database_lock`), which holds
across hosts: a second job on another host is refused as one on this host is.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from attribution.listener import ProgressListener
from billing.store.database_lock import DatabaseLock, DatabaseLockedError


def stream_lock_name(prefix: str) -> str:
    """The database lock the streaming job and a restore of Redis hold, for the deployment of Redis key `prefix`."""
    return f"stream:{prefix}"


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

    def __init__(self, path: Path, holder: str, database: DatabaseLock | None = None) -> None:
        self.path = path
        self.holder = holder
        self.database = database
        """The same lock in the catalog's database (`billing.store.database_lock`), which holds across hosts: taken
        after the file's, let go with it."""
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
            if self.database is not None:
                try:
                    self.database.acquire(wait_s=max(0.0, deadline - time.monotonic()))
                except DatabaseLockedError as exc:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                    handle.close()
                    raise JobLockedError(self.path, f"{exc.holder} (the database lock {exc.name})") from None
                except BaseException:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                    handle.close()
                    raise
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
            if self.database is not None:
                self.database.release()
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
            with _HELD_MUTEX:
                if _HELD.get(self.path.resolve()) is self:
                    del _HELD[self.path.resolve()]


class JobLock(FileLock, ProgressListener):
    """The streaming job's lock: held from before its query starts until the query ends for good.

    It follows one run of the query (`follow`) by its run id: Spark keeps a query's id across the starts from one
    checkpoint and gives each start a run id of its own, so the end of an earlier run, heard late on the listener
    bus, is not the end of the run the lock follows. A run that ends for a schema switch keeps the lock: the job
    starts the next run under it and follows that one (`attribution.job`)."""

    reads_progress = False

    def __init__(self, path: Path, database_url: str | None = None, prefix: str = "") -> None:
        holder = "the streaming job (adbill stream)"
        database = None
        if database_url:
            database = DatabaseLock(database_url, stream_lock_name(prefix), holder, on_lost=self._lost)
        FileLock.__init__(self, path, holder, database)
        self.run_id: str | None = None
        self.query: Any = None
        self._switching: Callable[[], bool] = lambda: False

    def follow(self, query: Any, switching: Callable[[], bool] = lambda: False) -> None:
        """Release the lock when this run of `query` terminates, unless `switching()` says it stopped for a schema
        switch (the job then starts the next run under the lock)."""
        self.run_id = str(query.runId)
        self.query = query
        self._switching = switching
        if not query.isActive and not switching():  # ended before it was followed: its end was heard as another's
            self.release()

    def in_use(self) -> bool:
        """Held, and the run it follows still active (its stop may not have been reported yet) or stopped for a
        schema switch (the next run is being started)."""
        return self.held and (self.query is None or bool(self.query.isActive) or self._switching())

    def _lost(self, holder: str) -> None:
        """Another job took the database lock while this one's session was gone: this one stops its query."""
        query = self.query
        if query is not None and query.isActive:
            query.stop()

    def onQueryTerminated(self, event: Any) -> None:
        if self.run_id is None or str(event.runId) != self.run_id or self._switching():
            return
        self.run_id = None
        self.release()
