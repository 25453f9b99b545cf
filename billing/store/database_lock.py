"""A lock that holds across hosts: an advisory lock of the catalog's database (PostgreSQL), held by a session of its
own for as long as its holder runs.

The streaming job and a restore of Redis hold `stream:PREFIX`, reconciliation `reconcile:PREFIX` (PREFIX: the Redis
key prefix of the deployment), beside the lock files of the data folder (`attribution.job_lock`), which hold on one
kernel only: two hosts sharing the data folder and the database can never run two jobs, nor two reconciliations.
The database frees the lock when the holder's session ends, however the holder ends. Who holds it is kept in the
table `process_locks`, for the refusal's message.

The session is watched (`LEASE_CHECK_S`): when it breaks (the database restarted), the holder takes the lock again on
a new session as soon as the database answers; if another process took it meanwhile, `on_lost` is called and the
holder must stop (a job stops its query): the lock is a lease that never has two holders at work.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from billing.store.database import CONNECT_TIMEOUT_S, Tables, make_tables

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

LEASE_CHECK_S = 5.0
"""How often a holder checks that its session, and with it the lock, is still there."""

_TABLES = Tables(
    "process_locks",
    """
CREATE TABLE IF NOT EXISTS process_locks (
    name text PRIMARY KEY,
    holder text NOT NULL,
    since_ms bigint NOT NULL
)
""",
)


class DatabaseLockedError(RuntimeError):
    """Another process, on this host or another, holds the lock."""

    def __init__(self, name: str, holder: str) -> None:
        self.name = name
        self.holder = holder
        super().__init__(f"the database lock {name} is held by {holder}")


def lock_key(name: str) -> int:
    """The advisory lock's 64-bit key for `name` (the same on every host)."""
    return int.from_bytes(hashlib.sha256(f"adbill:{name}".encode()).digest()[:8], "big", signed=True)


class DatabaseLock:
    """The advisory lock `name` in the database at `url`, for `holder` (a description: what runs, where)."""

    def __init__(self, url: str, name: str, holder: str, on_lost: Callable[[str], None] | None = None) -> None:
        self.url = url
        self.name = name
        self.holder = f"{holder} on {socket.gethostname()}, pid {os.getpid()}"
        self.on_lost = on_lost
        self._session: psycopg.Connection[Any] | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._holding = False

    @property
    def held(self) -> bool:
        """Whether this process holds the lock (through a moment when its session broke and is being replaced)."""
        return self._holding

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock, waiting up to `wait_s` for its holder to let go; DatabaseLockedError after that."""
        deadline = time.monotonic() + wait_s
        with self._mutex:
            if self._holding:
                return
            while True:
                holder = self._try()
                if holder is None:
                    break
                if time.monotonic() >= deadline:
                    raise DatabaseLockedError(self.name, holder)
                time.sleep(0.5)
            self._holding = True
            self._stop.clear()
            self._watch = threading.Thread(target=self._keep, name=f"lock-{self.name}", daemon=True)
            self._watch.start()

    def release(self) -> None:
        self._stop.set()
        with self._mutex:
            session, self._session = self._session, None
            self._holding = False
        if session is not None:
            try:
                session.execute("DELETE FROM process_locks WHERE name = %s AND holder = %s", (self.name, self.holder))
                session.execute("SELECT pg_advisory_unlock(%s)", (lock_key(self.name),))
            except Exception:  # the session broke: the database freed the lock already
                pass
            finally:
                session.close()

    def _try(self) -> str | None:
        """Take the lock on a new session: None when taken, else who holds it."""
        import psycopg

        session = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            make_tables(self.url, session, _TABLES)
            taken = session.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(self.name),)).fetchone()
            if not (taken and taken[0]):
                row = session.execute("SELECT holder, since_ms FROM process_locks WHERE name = %s", (self.name,))
                found = row.fetchone()
                session.close()
                return f"{found[0]} since {found[1]}" if found else "another process"
            session.execute(
                "INSERT INTO process_locks (name, holder, since_ms) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, since_ms = excluded.since_ms",
                (self.name, self.holder, time.time_ns() // 1_000_000),
            )
        except BaseException:
            session.close()
            raise
        self._session = session
        return None

    def _keep(self) -> None:
        """Check the session every `LEASE_CHECK_S`; when it broke, take the lock again on a new session as soon as
        the database answers, or, when another process took it meanwhile, say it is lost (`on_lost`)."""
        import psycopg

        while not self._stop.wait(LEASE_CHECK_S):
            with self._mutex:
                if self._stop.is_set() or not self._holding:
                    return
                if self._session is not None:
                    try:
                        self._session.execute("SELECT 1")
                        continue
                    except psycopg.Error as exc:
                        with contextlib.suppress(Exception):
                            self._session.close()
                        self._session = None
                        log.warning("the database lock %s: its session broke (%s); taking it again", self.name, exc)
                try:
                    holder = self._try()
                except psycopg.Error:
                    continue  # the database is still away: the next round tries again
                if holder is None:
                    log.warning("the database lock %s is held again", self.name)
                    continue
                self._holding = False
            log.error("the database lock %s was taken by %s while its session was gone", self.name, holder)
            if self.on_lost is not None:
                self.on_lost(holder)
            return
