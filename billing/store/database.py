"""The product's database (PostgreSQL, `ADBILL_DATABASE_URL`): the one place of the records that several processes
and hosts share (the catalog, names, billing profiles, invoice numbers, web accounts and tokens, schema versions).

Every store of it goes through here:
- `connection_pool(url)`: one pool of connections per process and URL (psycopg 3), each connection checked when it
  is taken (a database restarted meanwhile costs no failed change) and in autocommit outside a transaction;
- `connection(url, tables, what)`: a connection from that pool, the store's tables made first when missing (once per
  process, URL and set of tables, under one advisory lock so that two first processes never race), and a database
  that cannot be reached raised as `DatabaseUnavailable` with one line that names it (without its password);
- `Tables`: a store's `CREATE ... IF NOT EXISTS` statements, with what to do once after they are made (take in a data
  folder's old file).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from billing.store.durable import fsync_folder

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

SCHEMA_LOCK = 0x61646269_6C6C0001
"""The advisory lock under which a process makes tables and takes in a data folder's files (one at a time)."""

CONNECT_TIMEOUT_S = 5
"""How long a door waits for the database before it says the database cannot be reached."""

READ_TIMEOUT_S = 1.0
"""How long a reader (a batch of the stream, a page) waits for the database before it goes on with what it holds."""

RETRY_BEHIND_S = 5.0
"""While the database cannot be reached, how often a reader that holds something tries it again; in between, it
answers at once with what it holds."""

POOL_SIZE = 8
"""Connections a process may hold to the database at once (the web's threads, concurrent writers)."""


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached: the message names it (without its password) and why."""


@dataclass(frozen=True)
class Tables:
    """A store's tables: `schema` (idempotent DDL), and `then`, run once in the same transaction after the tables are
    made (to take in a data folder's old file), given the connection; it returns the files it took in, which are set
    aside (renamed `NAME.imported`) once the transaction has committed: a crash before the commit leaves the files
    where they were, taken in again by the next process, and one after it leaves them taken in."""

    name: str
    schema: str
    then: Callable[[psycopg.Connection[Any]], Iterable[Path] | None] | None = field(default=None, compare=False)


_POOLS: dict[tuple[str, int], ConnectionPool] = {}
_POOLS_MUTEX = threading.Lock()
_MADE: set[tuple[str, int, str]] = set()


def connection_pool(url: str) -> ConnectionPool:
    """This process's pool of connections to `url`, shared by every store it opens."""
    from psycopg_pool import ConnectionPool

    key = (url, os.getpid())  # a forked child makes its own
    with _POOLS_MUTEX:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            pool = ConnectionPool(
                url,
                min_size=1,
                max_size=POOL_SIZE,
                open=True,
                timeout=CONNECT_TIMEOUT_S,
                check=ConnectionPool.check_connection,
                kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                name="adbill",
            )
            _POOLS[key] = pool
            _MADE.difference_update({m for m in _MADE if m[:2] == key})
        return pool


@contextmanager
def connection(
    url: str, tables: Tables | None = None, what: str = "database", timeout_s: float = CONNECT_TIMEOUT_S
) -> Iterator[psycopg.Connection[Any]]:
    """A connection to `url` from this process's pool, `tables` made first when this process has not made them yet;
    DatabaseUnavailable ("the WHAT's database URL cannot be reached (why)") when the database does not answer."""
    import psycopg
    from psycopg_pool import PoolTimeout

    try:
        with connection_pool(url).connection(timeout=timeout_s) as taken:
            if tables is not None:
                make_tables(url, taken, tables)
            yield taken
    except (PoolTimeout, psycopg.OperationalError) as exc:
        if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
            raise
        raise unavailable(url, what, exc) from None


def make_tables(url: str, taken: psycopg.Connection[Any], tables: Tables) -> None:
    """Make `tables` (and run their `then`) on `taken`, once per process and URL."""
    key = (url, os.getpid(), tables.name)
    if key in _MADE:
        return
    taken_in: Iterable[Path] | None = None
    with taken.transaction():
        taken.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        taken.execute(tables.schema)
        if tables.then is not None:
            taken_in = tables.then(taken)
    for path in taken_in or ():
        set_aside(path)
    _MADE.add(key)


IMPORTED = ".imported"
"""The suffix a data folder's file gets once the database took it in."""


def set_aside(path: Path) -> None:
    """Rename a file the database took in to `NAME.imported`, beside it (kept, never read again), durably."""
    if path.exists():
        path.rename(path.with_name(path.name + IMPORTED))
        fsync_folder(path.parent)


def unavailable(url: str, what: str, exc: BaseException) -> DatabaseUnavailable:
    return DatabaseUnavailable(f"the {what} {without_password(url)} cannot be reached ({first_line(exc)})")


@dataclass(frozen=True)
class VersionHead:
    """A store's one-row table of its version (0 before its first change): what a reader asks whether it is behind,
    and what a writer locks (`FOR UPDATE`) so that its changes take the versions one after another."""

    table: str

    @property
    def schema(self) -> str:
        """The table's `CREATE` and its first row, to put before the store's own tables."""
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} (\n"
            "    one boolean PRIMARY KEY DEFAULT true CHECK (one),\n"
            "    version bigint NOT NULL CHECK (version >= 0)\n"
            ");\n"
            f"INSERT INTO {self.table} (version) VALUES (0) ON CONFLICT DO NOTHING;\n"
        )

    def version(self, connection: psycopg.Connection[Any], lock: bool = False) -> int:
        """The store's version; with `lock`, the row is held until the transaction ends."""
        row = connection.execute(f"SELECT version FROM {self.table}" + (" FOR UPDATE" if lock else "")).fetchone()
        return int(row[0]) if row else 0

    def set(self, connection: psycopg.Connection[Any], version: int) -> None:
        connection.execute(f"UPDATE {self.table} SET version = %s", (version,))


def integrity_errors() -> tuple[type[Exception], ...]:
    import psycopg

    return (psycopg.errors.IntegrityError,)


def constraint_message(exc: Exception) -> str:
    """A refused write's message with the database's detail (which row, which constraint)."""
    diagnostic = getattr(exc, "diag", None)
    detail = getattr(diagnostic, "message_detail", None) or ""
    return f"{first_line(exc)} {detail}".strip()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def without_password(url: str) -> str:
    """The URL as a person reads it in a message: its password replaced by `***`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class StoreTables:
    """A store's tables: their `name` (`Tables.name`, with the store's `imports`), the statements that make them
    (`Tables.schema`), the database as a message names it ("names' database"), and what the store's connections
    raise when the database cannot be reached."""

    name: str
    schema: str
    what: str
    unavailable: type[DatabaseUnavailable] = DatabaseUnavailable


class Store:
    """A part of the product kept in its own tables of the database at `url` (`TABLES`), made when missing, with
    `imports`, the file of a data folder written before the database, taken in once (`_take_in`)."""

    TABLES: ClassVar[StoreTables] = StoreTables("", "", "database")

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None) -> None:
        self.url = url
        self.imports = Path(imports) if imports is not None else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"

    @property
    def where(self) -> str:
        """The database, as a person reads it in a message (no password)."""
        return without_password(self.url)

    @contextmanager
    def _connection(self, timeout_s: float = CONNECT_TIMEOUT_S) -> Iterator[psycopg.Connection[Any]]:
        """A connection from the process's pool, the tables made and the data folder's file taken in first;
        `TABLES.unavailable` when the database cannot be reached."""
        own = self.TABLES
        tables = Tables(f"{own.name}:{self.imports}", own.schema, self._take_in)
        try:
            with connection(self.url, tables, own.what, timeout_s) as taken:
                yield taken
        except DatabaseUnavailable as exc:
            if own.unavailable is DatabaseUnavailable:
                raise
            raise own.unavailable(str(exc)) from None

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in the data folder's file (under the lock of `make_tables`, which sets the files returned aside once
        this commits): none here."""
        return []

    def _file_to_take_in(self, holds_some: Callable[[], bool], what: str, log: logging.Logger) -> Path | None:
        """The data folder's file to take in: None when there is none, or when the database holds `what` already
        (`holds_some`, asked only when there is a file): a file beside them is left alone, and said in `log`."""
        if self.imports is None or not self.imports.exists():
            return None
        if holds_some():
            log.warning("the %s file %s is not taken in: %s holds %s already", what, self.imports, self.where, what)
            return None
        return self.imports


class HeldReader(Store):
    """A store of what it read from its database: while the database cannot be reached its readers go on with what it
    holds, and `behind` says why; it tries the database again every RETRY_BEHIND_S, answering at once in between."""

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None) -> None:
        super().__init__(url, imports)
        self._next_try = 0.0
        self.behind: str | None = None
        """Why what is held may be behind the database (it cannot be reached), or None."""

    def waiting(self) -> bool:
        """Whether the database went away less than RETRY_BEHIND_S ago: what is held is the answer, without a try."""
        return self.behind is not None and time.monotonic() < self._next_try

    def unreached(self, exc: BaseException) -> bool:
        """Record that the database cannot be reached (`exc` says why) and when to try it again; whether it was
        reached until now (the one failure a reader says in the log)."""
        first = self.behind is None
        self.behind = str(exc)
        self._next_try = time.monotonic() + RETRY_BEHIND_S
        return first
