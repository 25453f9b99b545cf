"""The advertisers' billing profiles in PostgreSQL (`ADBILL_DATABASE_URL`), shared by the commands, the web UI and
reconciliation on any host.

Tables (made when missing, `billing.store.database`):
- `billing_profiles`: one row per entry of an advertiser's history (`billing.profiles.BillingProfile`), numbered by
  `version` with no gap; at most one entry of an advertiser per effective time;
- `billing_profiles_head`: one row, the version of the newest entry (0: none yet).

A change (`ProfileDatabase.change`) locks the head row (`SELECT ... FOR UPDATE`), so changes are numbered one after
the other and none is lost; it reads "now" under that lock (a change that waited never takes effect in the past),
reads the request into an entry, checks it against the advertiser's history with the domain's rule
(`BillingProfiles.with_profile`: never in the past, never at the time of another entry), inserts it, moves the head
and commits. A reader (`ProfileDatabase.current`) reads the head (one row) and, when it moved, only the entries made
since the version it holds: a web worker pays for the changes, not for the history, on each page.

A data folder written before the database (`HOME/billing-profiles.json`) is taken in once, the first time the store
opens a database that holds no profile, and the file is set aside (renamed `.imported`), nothing lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.profiles import BillingProfile, BillingProfiles, ProfileError
from billing.store import database
from billing.store.database import constraint_message, integrity_errors, without_password

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

HEAD = database.VersionHead("billing_profiles_head")

SCHEMA = (
    HEAD.schema
    + """CREATE TABLE IF NOT EXISTS billing_profiles (
    version bigint PRIMARY KEY CHECK (version > 0),
    advertiser_id text NOT NULL CHECK (advertiser_id <> ''),
    effective_from bigint NOT NULL,
    name text NOT NULL,
    address text NOT NULL,
    tax_id text NOT NULL,
    tax_rate text NOT NULL,
    made_by text,
    door text,
    made_at bigint,
    UNIQUE (advertiser_id, effective_from)
);
"""
)
"""The profiles' tables (made when missing, `billing.store.database.make_tables`)."""

_COLUMNS = "advertiser_id, name, address, tax_id, tax_rate, effective_from, version, made_by, door, made_at"
"""The columns of an entry, in the order of `BillingProfile`'s fields."""

ProfileRequest = Callable[[int], BillingProfile]
"""A person's request read into a profile entry, given "now" (read under the lock)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ProfileDatabase(database.Store):
    """The billing profiles' tables at `url`: `current()` reads them by version, `change()` adds an entry.

    `imports`: the profiles file of a data folder written before the database (`HOME/billing-profiles.json`), taken
    in when the database holds no profile yet."""

    TABLES = database.StoreTables("billing_profiles", SCHEMA, "billing profiles' database")

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None) -> None:
        super().__init__(url, imports)
        self._mutex = threading.Lock()
        self._entries: list[BillingProfile] = []
        self._held = BillingProfiles()
        self._read = False

    def current(self) -> BillingProfiles:
        """Every advertiser's history as the database holds it now: the head row, then only the entries made since
        the version held (none when it did not move). DatabaseUnavailable when the database cannot be reached."""
        with self._mutex, self._connection() as connection:
            version = HEAD.version(connection)
            if self._read and version == self._held.version:
                return self._held
            if version < self._held.version:  # the database was restored from an older copy: read it whole
                self._entries, self._held = [], BillingProfiles()
            rows = connection.execute(
                f"SELECT {_COLUMNS} FROM billing_profiles WHERE version > %s AND version <= %s ORDER BY version",
                (self._held.version, version),
            ).fetchall()
            # Every entry up to the head was committed before the head moved past it (one writer at a time holds
            # the head row until it commits), so this reads the history as of `version`, whole.
            self._entries += [_entry(row) for row in rows]
            self._held = BillingProfiles(self._entries, version)
            self._read = True
            return self._held

    def change(self, request: ProfileRequest, clock: Callable[[], int] = wall_clock_ms) -> BillingProfile:
        """Add the entry `request` makes (from "now" read under the head row's lock) and return it as kept (with its
        version and when it was made); ProfileError when refused, and the tables are left as they were."""
        with self._connection() as connection:
            try:
                with connection.transaction():
                    version = HEAD.version(connection, lock=True)
                    now_ms = clock()
                    entry = request(now_ms)
                    rows = connection.execute(
                        f"SELECT {_COLUMNS} FROM billing_profiles WHERE advertiser_id = %s", (entry.advertiser_id,)
                    ).fetchall()
                    changed = BillingProfiles([_entry(row) for row in rows], version).with_profile(entry, now_ms)
                    kept = next(e for e in changed.history(entry.advertiser_id) if e.version == changed.version)
                    _insert(connection, kept)
                    HEAD.set(connection, kept.version)
            except integrity_errors() as exc:
                raise ProfileError(f"the billing profiles refused the change: {constraint_message(exc)}") from None
        return kept

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in a data folder's profiles file when the database holds no profile yet (once, under the lock of
        `database.make_tables`); a file beside profiles already there is left alone, and said."""
        source = self._file_to_take_in(lambda: HEAD.version(connection) > 0, "billing profiles", log)
        if source is None:
            return []
        try:
            profiles = BillingProfiles.from_json(source.read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot take in the billing profiles {source}: {exc}") from exc
        entries = [e for a in profiles.advertiser_ids for e in profiles.history(a)]
        for entry in sorted(entries, key=lambda e: e.version):
            _insert(connection, entry)
        version = max([profiles.version, *(e.version for e in entries)])
        HEAD.set(connection, version)
        log.warning(
            "took the billing profiles file %s (version %d, %d entries) into %s; the file is set aside as %s.imported",
            source,
            version,
            len(entries),
            without_password(self.url),
            source.name,
        )
        return [source]


def _entry(row: tuple[Any, ...]) -> BillingProfile:
    return BillingProfile(*row)


def _insert(connection: psycopg.Connection[Any], entry: BillingProfile) -> None:
    connection.execute(
        f"INSERT INTO billing_profiles ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            entry.advertiser_id,
            entry.name,
            entry.address,
            entry.tax_id,
            entry.tax_rate,
            entry.effective_from,
            entry.version,
            entry.made_by,
            entry.door,
            entry.made_at,
        ),
    )
