"""The names people give campaigns and ads (`billing.names`) in PostgreSQL (`ADBILL_DATABASE_URL`), shared by the
commands, the web UI and reconciliation's invoices on any host.

Tables (made when missing, `billing.store.database`):
- `names`: one row per campaign or ad ever named (`kind`, `item_id`), its name (NULL once removed: a reader by
  version learns of the removal) and the version of its last change;
- `names_head`: one row, the version of the last change (0: none yet).

A change (`NamesDatabase.set`) locks the head row (`SELECT ... FOR UPDATE`), writes the one row and moves the head,
in one transaction: two admins never lose one another's name, and versions follow one another with no gap.

At a million ads the names are large (tens of MB), so a reader reads what it needs:
- `current()`: every name, read by version: the head (one row) and, when it moved, only the rows changed since;
- `named(kind)`: every name of one kind (an invoice's campaigns, without the ads');
- `names_of(kind, ids)`: the names of a few ids (a command, a page's list);
- `shown(kind, ids)`, `name_of(kind, id)`: the names a page shows, from those this store was asked before, kept
  up to date by version, the others read in one query; a name bills nothing, so while the database cannot be
  reached a page shows the names known, and `behind` says why.

A data folder written before the database (`HOME/names.json`) is taken in once, the first time the store opens a
database that holds no name, and the file is set aside (renamed `.imported`), nothing lost.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.names import KINDS, Names, NamingError, checked_name
from billing.store import database
from billing.store.database import (
    READ_TIMEOUT_S,
    DatabaseUnavailable,
    without_password,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

HEAD = database.VersionHead("names_head")

SCHEMA = (
    HEAD.schema
    + """CREATE TABLE IF NOT EXISTS names (
    kind text NOT NULL CHECK (kind IN ('campaign', 'ad')),
    item_id text NOT NULL CHECK (item_id <> ''),
    name text CHECK (name <> ''),
    version bigint NOT NULL CHECK (version > 0),
    PRIMARY KEY (kind, item_id)
);
CREATE INDEX IF NOT EXISTS names_by_version ON names (version);
"""
)
"""The names' tables (made when missing, `billing.store.database.make_tables`)."""

MAX_KNOWN = 200_000
"""The most names a store keeps for `name_of` (a web worker's pages); past it, it forgets them and asks again."""


class NamesDatabase(database.HeldReader):
    """The names' tables at `url`: read (`current`, `named`, `names_of`, `name_of`) and changed (`set`).

    `imports`: the names file of a data folder written before the database (`HOME/names.json`), taken in when the
    database holds no name yet."""

    TABLES = database.StoreTables("names", SCHEMA, "names' database")

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None) -> None:
        super().__init__(url, imports)
        self._mutex = threading.Lock()
        self._held = Names()
        self._held_version: int | None = None
        self._known: dict[tuple[str, str], str] = {}
        self._known_version: int | None = None

    # --- Reading ---------------------------------------------------------------------------------------------

    def current(self) -> Names:
        """Every name as the database holds it now: the head row and, when it moved, only the rows changed since
        the version held. DatabaseUnavailable when the database cannot be reached."""
        with self._mutex, self._connection() as connection:
            version = HEAD.version(connection)
            if version == self._held_version:
                return self._held
            since = self._held_version if self._held_version is not None and version > self._held_version else 0
            campaigns = dict(self._held.campaigns) if since else {}
            ads = dict(self._held.ads) if since else {}
            for kind, item_id, name in _changed_since(connection, since):
                named = campaigns if kind == "campaign" else ads
                if name is None:
                    named.pop(item_id, None)
                else:
                    named[item_id] = name
            self._held, self._held_version = Names(campaigns, ads), version
            return self._held

    def named(self, kind: str) -> dict[str, str]:
        """Every name of `kind` (`campaign`, `ad`): an invoice's campaign names, without reading the ads'."""
        _check_kind(kind)
        with self._connection() as connection:
            rows = connection.execute(
                "SELECT item_id, name FROM names WHERE kind = %s AND name IS NOT NULL", (kind,)
            ).fetchall()
        return dict(rows)

    def names_of(self, kind: str, item_ids: Iterable[str]) -> dict[str, str]:
        """The names of the campaigns or ads `item_ids` that have one, read now in one query (a command).
        DatabaseUnavailable when the database cannot be reached."""
        _check_kind(kind)
        wanted = sorted(set(item_ids))
        if not wanted:
            return {}
        with self._connection() as connection:
            return _read_names(connection, kind, wanted)

    def shown(self, kind: str, item_ids: Iterable[str], check: bool = True) -> dict[str, str]:
        """The names of `item_ids` that have one, for a page: from the names this store was asked before, brought
        up to date first when `check` (the head row, and the rows changed since it moved), the others read in one
        query. Never raises for the database: while it cannot be reached, the names known, and `behind` says why."""
        _check_kind(kind)
        wanted = set(item_ids)
        with self._mutex:
            check = check or self._known_version is None
            asks = check or any((kind, i) not in self._known for i in wanted)
            if asks and not self.waiting():
                try:
                    with self._connection(READ_TIMEOUT_S) as connection:
                        if check:
                            self._catch_up(connection)
                        missing = sorted(i for i in wanted if (kind, i) not in self._known)
                        if missing:
                            found = _read_names(connection, kind, missing)
                            self._remember({(kind, i): found.get(i, "") for i in missing})
                    self.behind = None
                except DatabaseUnavailable as exc:
                    if self.unreached(exc):
                        log.warning("%s; the pages show the names known meanwhile", exc)
            return {i: n for i in wanted if (n := self._known.get((kind, i)))}

    def name_of(self, kind: str, item_id: str, check: bool = True) -> str:
        """The name of one campaign or ad (empty: none), for a page (`shown`)."""
        return self.shown(kind, [item_id], check).get(item_id, "")

    def version(self) -> int:
        """The version of the last change of a name (0: none yet): one row."""
        with self._connection() as connection:
            return HEAD.version(connection)

    # --- Changing --------------------------------------------------------------------------------------------

    def set(self, kind: str, item_id: str, name: str) -> str:
        """Name a campaign or an ad (an empty name removes it) in one transaction under the head row's lock; the
        name as kept. NamingError when refused, and the tables are left as they were."""
        kept = checked_name(kind, name)
        if not item_id:
            raise NamingError(f"a {kind} to name needs its id")
        with self._connection() as connection, connection.transaction():
            version = HEAD.version(connection, lock=True) + 1
            if kept:
                changed = connection.execute(
                    "INSERT INTO names (kind, item_id, name, version) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (kind, item_id) DO UPDATE SET name = EXCLUDED.name, version = EXCLUDED.version "
                    "WHERE names.name IS DISTINCT FROM EXCLUDED.name",
                    (kind, item_id, kept, version),
                ).rowcount
            else:
                changed = connection.execute(
                    "UPDATE names SET name = NULL, version = %s WHERE kind = %s AND item_id = %s AND name IS NOT NULL",
                    (version, kind, item_id),
                ).rowcount
            if changed:
                HEAD.set(connection, version)
        with self._mutex:
            self._remember({(kind, item_id): kept})  # this worker's next page shows it at once
        return kept

    # --- Inside ----------------------------------------------------------------------------------------------

    def _catch_up(self, connection: psycopg.Connection[Any]) -> None:
        """Bring the names known for `name_of` up to the head: the rows changed since the version known."""
        version = HEAD.version(connection)
        known = self._known_version
        if known is not None and version == known:
            return
        if known is None or version < known or version - known > MAX_KNOWN:
            self._known.clear()  # nothing known yet, a database restored from an older copy, or too much changed
        else:
            self._remember({(k, i): n or "" for k, i, n in _changed_since(connection, known)})
        self._known_version = version

    def _remember(self, names: dict[tuple[str, str], str]) -> None:
        if len(self._known) + len(names) > MAX_KNOWN:
            self._known.clear()
        self._known.update(names)

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in a data folder's names file when the database holds no name yet (once, under the lock of
        `database.make_tables`); a file beside names already there is left alone, and said."""
        source = self._file_to_take_in(lambda: HEAD.version(connection) > 0, "names", log)
        if source is None:
            return []
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
            rows = [
                (kind, str(item_id), checked_name(kind, str(name)))
                for kind, key in (("campaign", "campaigns"), ("ad", "ads"))
                for item_id, name in dict(data.get(key, {})).items()
            ]
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"cannot take in the names file {source}: {exc}") from exc
        rows = [row for row in rows if row[1] and row[2]]
        with connection.cursor() as cursor, cursor.copy("COPY names (kind, item_id, name, version) FROM STDIN") as copy:
            for row in rows:
                copy.write_row((*row, 1))
        HEAD.set(connection, 1)
        log.warning(
            "took the names file %s (%d campaigns, %d ads) into %s; the file is set aside as %s.imported",
            source,
            sum(1 for r in rows if r[0] == "campaign"),
            sum(1 for r in rows if r[0] == "ad"),
            without_password(self.url),
            source.name,
        )
        return [source]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise NamingError(f"a name is given to a campaign or an ad, not to a {kind!r}")


def _read_names(connection: psycopg.Connection[Any], kind: str, item_ids: list[str]) -> dict[str, str]:
    rows = connection.execute(
        "SELECT item_id, name FROM names WHERE kind = %s AND item_id = ANY(%s) AND name IS NOT NULL", (kind, item_ids)
    ).fetchall()
    return {str(i): str(n) for i, n in rows}


def _changed_since(connection: psycopg.Connection[Any], version: int) -> list[tuple[str, str, str | None]]:
    """The rows changed after `version` (their name now, NULL when removed). A row changed again meanwhile is read
    with its newest name, which is what a reader brought up to a later head holds too."""
    rows = connection.execute(
        "SELECT kind, item_id, name FROM names WHERE version > %s" + ("" if version else " AND name IS NOT NULL"),
        (version,),
    ).fetchall()
    return [(str(k), str(i), n) for k, i, n in rows]
