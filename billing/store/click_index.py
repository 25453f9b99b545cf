"""The click index: which files and rows of the data folder name each click id, so that a click's story is found in
milliseconds instead of a scan of a month of Parquet (`HOME/index/clicks.sqlite`, `DataLayout.click_index`).

What it holds (SQLite, standard library):

- `files`: every Parquet file of the folders a story reads, with its kind, period, batch, identity (size, mtime,
  inode) and, for the archive, the span of event times it holds: the archive of the click's user and ad around its
  time is read from the few files whose span meets the window, not from every file of the period;
- `rows`: one line per row that names a click id: the archive's click copies, the quarantine, released records,
  id conflicts, the ledger, `unbilled/`, `not_charged/`, corrections, and the exports' `billing.parquet` and
  `not_charged.parquet`; the books' rows (ledger, corrections, exports' click rows) with their ad, campaign,
  period, time, amount and sign, so that a campaign's day (a budget) and an ad's clicks by price are added up here;
- `folders`: every folder looked at, with its modification time.

**Kept up to date lazily**, by whoever reads it (a story, the ad page's clicks by price) and by `adbill reconcile`
after each run, under a lock file (`clicks.sqlite.lock`; one refresher at a time, readers never wait): every file is
written into place by a rename (`billing.store.durable`), so a folder's modification time changes whenever a file or
a sub-folder appears, goes or is replaced. A refresh stats each period folder (a few thousand for a month), lists
the ones that changed, and indexes the new files; a batch's folder changes after it was first seen only while it is
one of the newest batches (a replayed batch rewrites its files; reconciliation releases records into the last
committed batch), so those are looked at again each time (`HOT_BATCHES`), and the corrections of every period (a
run adds a file to a closed period's folder). Folders moved away (a new checkpoint epoch sets batches aside) drop
their rows. A row read back is checked against its click id: should a file have been rewritten in another order,
the file is searched instead.

A closed period's batch folders compacted into one file (`billing.store.compaction`) leave its period folder: the
folder of the newest batch, which holds the compacted file, is looked at again, and the folders gone drop their rows.
A row read from a compacted file carries the batch that wrote it (`source_batch_id`), and should a compaction be
under way (or stopped mid-way) the rows of the files a compacted file holds are passed over (`compaction.superseded`).

The index is a cache: removing the file rebuilds it from the data folder at the next refresh (a month of the
benchmark's data in a few minutes: `make bench-stories`).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.layout import DataLayout
from billing.store.compaction import SOURCE_BATCH, superseded
from billing.store.export_files import MANIFEST_FILE, NOT_CHARGED_FILE, PARQUET_FILE
from billing.story import BookRow

SCHEMA_VERSION = "1"

HOT_BATCHES = 3
"""A batch's folders are looked at again while the batch is one of this many newest (a replay of the last batch
rewrites its files; reconciliation releases records into the last committed one)."""

COMMIT_EVERY = 500
"""Files indexed between two commits of a long refresh (the first one over a month of data)."""

LOCK_WAIT_S = 2.0
"""How long a refresh waits for another one to end before it reads the index as it is."""

ARCHIVE_CLICK = "archive_click"
ARCHIVE_IMPRESSION = "archive_impression"
LEDGER = "ledger"
UNBILLED = "unbilled"
NOT_CHARGED = "not_charged"
QUARANTINE = "quarantine"
RELEASED = "released"
CONFLICTS = "conflicts"
CORRECTION = "correction"
EXPORT = "export"
EXPORT_NOT_CHARGED = "export_not_charged"

ID_COLUMN = {
    ARCHIVE_CLICK: "event_id",
    QUARANTINE: "event_id",
    RELEASED: "event_id",
    CONFLICTS: "event_id",
}
"""The column that holds the click id, where it is not `click_id`."""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS folders (
    path TEXT PRIMARY KEY, parent TEXT, tree TEXT NOT NULL, leaf INTEGER NOT NULL, batch_id INTEGER, mtime_ns INTEGER
);
CREATE INDEX IF NOT EXISTS folders_parent ON folders(parent);
CREATE INDEX IF NOT EXISTS folders_batch ON folders(tree, batch_id);
CREATE INDEX IF NOT EXISTS folders_pending ON folders(tree, mtime_ns);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, folder TEXT NOT NULL, kind TEXT NOT NULL, period TEXT,
    batch_id INTEGER, size INTEGER, mtime_ns INTEGER, ino INTEGER, min_time INTEGER, max_time INTEGER
);
CREATE INDEX IF NOT EXISTS files_folder ON files(folder);
CREATE INDEX IF NOT EXISTS files_kind_period ON files(kind, period);
CREATE TABLE IF NOT EXISTS rows (
    click_id TEXT NOT NULL, file INTEGER NOT NULL, row INTEGER NOT NULL, ad_id TEXT, campaign_id TEXT, period TEXT,
    click_time INTEGER, amount INTEGER, sign INTEGER, booked TEXT
);
CREATE INDEX IF NOT EXISTS rows_click ON rows(click_id);
CREATE INDEX IF NOT EXISTS rows_file ON rows(file);
CREATE INDEX IF NOT EXISTS rows_ad ON rows(ad_id, period) WHERE sign IS NOT NULL;
CREATE INDEX IF NOT EXISTS rows_campaign ON rows(campaign_id, period) WHERE sign IS NOT NULL;
INSERT OR IGNORE INTO meta VALUES ('schema', '{SCHEMA_VERSION}');
"""


@dataclass(frozen=True)
class Tree:
    """A folder of the data folder the index covers: its files' kinds and how deep they lie."""

    name: str
    folder: Path
    depth: int
    """Folder levels between `folder` and the files: 2 (period, batch), 1 (batch, or period), 0 (files)."""
    kind_of: Callable[[str], str | None]
    """A file's kind from its name; None: not indexed."""
    leaves_change: bool = False
    """Its leaf folders get new files at any time (corrections: a run adds one to a closed period's folder)."""


def _parquet(kind: str) -> Callable[[str], str | None]:
    return lambda name: kind if name.endswith(".parquet") and not name.startswith(".") else None


def _export_file(name: str) -> str | None:
    return {PARQUET_FILE: EXPORT, NOT_CHARGED_FILE: EXPORT_NOT_CHARGED}.get(name)


def trees(layout: DataLayout) -> list[Tree]:
    """The folders the index covers, the archive first (a correction's click time is read from it)."""
    return [
        Tree(ARCHIVE_CLICK, layout.archive_of("click"), 2, _parquet(ARCHIVE_CLICK)),
        Tree(ARCHIVE_IMPRESSION, layout.archive_of("impression"), 2, _parquet(ARCHIVE_IMPRESSION)),
        Tree(LEDGER, layout.ledger, 2, _parquet(LEDGER)),
        Tree(UNBILLED, layout.unbilled, 2, _parquet(UNBILLED)),
        Tree(NOT_CHARGED, layout.not_charged, 2, _parquet(NOT_CHARGED)),
        Tree(QUARANTINE, layout.quarantine, 1, _parquet(QUARANTINE)),
        Tree(RELEASED, layout.released, 1, _parquet(RELEASED)),
        Tree(CORRECTION, layout.corrections, 1, _parquet(CORRECTION), leaves_change=True),
        Tree(CONFLICTS, layout.conflicts, 0, _parquet(CONFLICTS)),
        Tree(EXPORT, layout.exports, 1, _export_file),
    ]


@dataclass(frozen=True, slots=True)
class Located:
    """A row of a file that names a click id."""

    click_id: str
    kind: str
    path: Path
    row: int
    period: str | None
    batch_id: int | None


class ClickIndex:
    """The index of one data folder (module doc)."""

    def __init__(self, layout: DataLayout, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.layout = layout
        self.root = layout.root
        self.path = layout.click_index
        self.lock_wait_s = lock_wait_s
        self._trees = trees(layout)
        self._local = threading.local()

    # --- Reading ----------------------------------------------------------------------------------------------

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection (made on first use, kept: a lookup asks several questions)."""
        db = getattr(self._local, "db", None)
        if db is None or not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        yield db

    def rows_of(self, click_id: str) -> list[Located]:
        """Every indexed row that names `click_id`."""
        with self._connect() as db:
            if not _has_schema(db):
                return []
            found = db.execute(
                "SELECT f.kind, f.path, r.row, f.period, f.batch_id FROM rows r JOIN files f ON f.id = r.file "
                "WHERE r.click_id = ? ORDER BY f.path, r.row",
                (click_id,),
            ).fetchall()
        located = [
            Located(click_id, kind, self.root / path, row, period, batch) for kind, path, row, period, batch in found
        ]
        gone = superseded(item.path for item in located)
        return [item for item in located if item.path not in gone]

    def archive_files(self, kind: str, periods: Sequence[str], low_ms: int, high_ms: int) -> list[Path]:
        """The archive's files of `kind` in `periods` whose event times meet [low_ms, high_ms]."""
        if not periods:
            return []
        marks = ",".join("?" * len(periods))
        with self._connect() as db:
            if not _has_schema(db):
                return []
            found = db.execute(
                f"SELECT path FROM files WHERE kind = ? AND period IN ({marks}) AND min_time <= ? AND max_time >= ?",  # nosec B608: only marks
                (kind, *periods, high_ms, low_ms),
            ).fetchall()
        paths = [self.root / path for (path,) in found]
        gone = superseded(paths)
        return [path for path in paths if path not in gone]

    def book_rows(
        self, first_period: str, last_period: str, *, ad_id: str | None = None, campaign_id: str | None = None
    ) -> list[BookRow]:
        """The books' rows (ledger, corrections, exports' click rows) of an ad or a campaign whose click lies in the
        periods `first_period` to `last_period` (keys sort as time), with the click's time (a correction's from the
        archive)."""
        column, value = ("ad_id", ad_id) if ad_id is not None else ("campaign_id", campaign_id)
        with self._connect() as db:
            if not _has_schema(db):
                return []
            found = db.execute(
                "SELECT f.path, r.click_id, f.kind, r.period, r.amount, r.sign, r.booked, coalesce(r.click_time, ("
                "  SELECT min(a.click_time) FROM rows a JOIN files fa ON fa.id = a.file"
                f"  WHERE a.click_id = r.click_id AND fa.kind = '{ARCHIVE_CLICK}')) "
                f"FROM rows r JOIN files f ON f.id = r.file WHERE r.{column} = ? AND r.period BETWEEN ? AND ? "  # nosec B608: constants
                "AND r.sign IS NOT NULL",
                (value, first_period, last_period),
            ).fetchall()
        kinds = {LEDGER: "ledger", CORRECTION: "correction", EXPORT: "export"}
        gone = {str(path.relative_to(self.root)) for path in superseded(self.root / row[0] for row in found)}
        return [
            BookRow(click, kinds[kind], period, amount or 0, sign, booked, at)
            for path, click, kind, period, amount, sign, booked, at in found
            if kind in kinds and path not in gone
        ]

    def closed_periods(self) -> set[str]:
        """The periods with an export (closed)."""
        with self._connect() as db:
            if not _has_schema(db):
                return set()
            return {p for (p,) in db.execute("SELECT DISTINCT period FROM files WHERE kind = ?", (EXPORT,))}

    def export_folder(self, period: str) -> Path:
        return self.layout.export(period)

    def manifest_path(self, period: str) -> Path:
        return self.layout.export(period) / MANIFEST_FILE

    # --- Keeping it up to date ---------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Index what changed since the last refresh (module doc); False when another refresh held the lock for
        longer than `lock_wait_s` (the index is read as it is)."""
        with self._lock() as held:
            if not held:
                return False
            with self._connect() as db:
                self._check_schema(db)
                Refresh(self, db).run()
            return True

    @contextmanager
    def _lock(self) -> Iterator[bool]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+") as handle:
            deadline = time.monotonic() + self.lock_wait_s
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.02)
            try:
                yield True
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _check_schema(self, db: sqlite3.Connection) -> None:
        """Make the tables; an index of another schema, or one that does not read, is started afresh."""
        try:
            found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() if _has_schema(db) else None
        except sqlite3.DatabaseError:
            found = ("broken",)
        if found is not None and found[0] != SCHEMA_VERSION:
            for table in ("rows", "files", "folders", "meta"):
                db.execute(f"DROP TABLE IF EXISTS {table}")  # nosec B608: constants
        db.executescript(_SCHEMA)

    def trees(self) -> list[Tree]:
        return self._trees


def _has_schema(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rows'").fetchone() is not None


class Refresh:
    """One refresh of the index, in one write transaction committed every `COMMIT_EVERY` files. Paths are text
    relative to the data folder's root; the folders above the leaves are read in one query."""

    def __init__(self, index: ClickIndex, db: sqlite3.Connection) -> None:
        self.index = index
        self.db = db
        self.root = index.root
        self.base = str(index.root) + os.sep
        self.indexed = 0
        self.groups: dict[str, tuple[str | None, int | None]] = {}
        """Every folder above the leaves: path -> (parent, modification time)."""

    def run(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            newest = self.db.execute("SELECT max(batch_id) FROM folders").fetchone()[0]
            hot_from = (newest if newest is not None else 0) - HOT_BATCHES + 1
            self.groups = {
                path: (parent, mtime)
                for path, parent, mtime in self.db.execute("SELECT path, parent, mtime_ns FROM folders WHERE leaf = 0")
            }
            for tree in self.index.trees():
                self._tree(tree, hot_from)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _tree(self, tree: Tree, hot_from: int) -> None:
        top = tree.folder.relative_to(self.root).as_posix()
        if tree.depth == 0:
            known = self.db.execute("SELECT mtime_ns FROM folders WHERE path = ?", (top,)).fetchone()
            self._leaf(tree, top, None, known[0] if known else None)
            return
        self._children(tree, top, None, leaves=tree.depth == 1)
        if tree.depth == 2:
            for group in [path for path, (parent, _) in self.groups.items() if parent == top]:
                self._children(tree, group, top, leaves=True)
        leaves = self.db.execute(
            "SELECT path, parent, mtime_ns FROM folders WHERE tree = ? AND mtime_ns IS NULL AND leaf = 1", (tree.name,)
        ).fetchall()
        leaves += self.db.execute(
            "SELECT path, parent, mtime_ns FROM folders WHERE tree = ? AND batch_id >= ? AND leaf = 1",
            (tree.name, hot_from),
        ).fetchall()
        if tree.leaves_change:
            leaves += self.db.execute(
                "SELECT path, parent, mtime_ns FROM folders WHERE parent = ? AND leaf = 1", (top,)
            ).fetchall()
        for path, (parent, mtime) in {path: (parent, mtime) for path, parent, mtime in leaves}.items():
            self._leaf(tree, path, parent, mtime)

    def _children(self, tree: Tree, rel: str, parent: str | None, leaves: bool) -> None:
        """Record the sub-folders of `rel` when its modification time changed: new ones to be indexed, gone ones
        forgotten."""
        mtime = _mtime(self.base + rel)
        known = self.groups.get(rel)
        if mtime is None:
            if known is not None:
                self._forget(rel)
            return
        if known is not None and known[1] == mtime:
            return
        names = {e.name for e in os.scandir(self.base + rel) if e.is_dir() and not e.name.startswith(".")}
        recorded = {
            p.rsplit("/", 1)[-1]: known_mtime
            for p, known_mtime in self.db.execute("SELECT path, mtime_ns FROM folders WHERE parent = ?", (rel,))
        }
        for gone in recorded.keys() - names:
            self._forget(f"{rel}/{gone}")
        if leaves and recorded.keys() - names:
            # Batch folders gone from a period: compacted (`billing.store.compaction`), the file that holds them
            # written into the newest one's folder, which is looked at again.
            for name in names & recorded.keys():
                if recorded[name] is not None and _mtime(f"{self.base}{rel}/{name}") != recorded[name]:
                    self.db.execute("UPDATE folders SET mtime_ns = NULL WHERE path = ?", (f"{rel}/{name}",))
        for name in sorted(names - recorded.keys()):
            child = f"{rel}/{name}"
            self.db.execute(
                "INSERT OR REPLACE INTO folders VALUES (?, ?, ?, ?, ?, NULL)",
                (child, rel, tree.name, int(leaves), _batch_of(name)),
            )
            if not leaves:
                self.groups[child] = (rel, None)
        if _mtime(self.base + rel) != mtime:
            mtime = None  # a folder made while this one was read: listed again at the next refresh
        self.db.execute(
            "INSERT OR REPLACE INTO folders VALUES (?, ?, ?, 0, ?, ?)",
            (rel, parent, tree.name, _batch_of(rel.rsplit("/", 1)[-1]), mtime),
        )
        self.groups[rel] = (parent, mtime)

    def _leaf(self, tree: Tree, rel: str, parent: str | None, known: int | None) -> None:
        """Index the files of a leaf folder whose modification time changed (new, replaced and gone files)."""
        mtime = _mtime(self.base + rel)
        if mtime is None:
            self._forget(rel)
            return
        if known == mtime:
            return
        held = {
            path: (file_id, size, file_mtime, ino)
            for file_id, path, size, file_mtime, ino in self.db.execute(
                "SELECT id, path, size, mtime_ns, ino FROM files WHERE folder = ?", (rel,)
            )
        }
        present = set()
        complete = True
        for entry in os.scandir(self.base + rel):
            kind = tree.kind_of(entry.name) if entry.is_file() else None
            if kind is None:
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:  # removed since the folder was listed (a compaction): looked at again
                complete = False
                continue
            path = f"{rel}/{entry.name}"
            present.add(path)
            identity = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
            if path in held and held[path][1:] == identity:
                continue
            if path in held:
                self._drop_file(held[path][0])
            if not self._index_file(kind, Path(entry.path), path, rel, identity):
                complete = False
        for path, (file_id, *_) in held.items():
            if path not in present:
                self._drop_file(file_id)
        # A file renamed in while the folder was read: looked at again at the next refresh.
        complete = complete and _mtime(self.base + rel) == mtime
        self.db.execute(
            "INSERT OR REPLACE INTO folders VALUES (?, ?, ?, 1, ?, ?)",
            (rel, parent, tree.name, _batch_of(rel.rsplit("/", 1)[-1]), mtime if complete else None),
        )

    def _index_file(self, kind: str, path: Path, rel: str, folder: str, identity: tuple[int, int, int]) -> bool:
        """Index one file's rows; False when it does not read (it is tried again at the next refresh)."""
        period = _period_of(path)
        batch = _batch_of(path.parent.name)
        try:
            table, low, high = _read_for_index(kind, path)
        except (OSError, pa.ArrowException):
            return False
        cursor = self.db.execute(
            "INSERT INTO files (path, folder, kind, period, batch_id, size, mtime_ns, ino, min_time, max_time) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rel, folder, kind, period, batch, *identity, low, high),
        )
        file_id = int(cursor.lastrowid or 0)
        if table is not None and table.num_rows:
            self.db.executemany(
                "INSERT INTO rows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _index_rows(kind, table, file_id, period)
            )
        self.indexed += 1
        if self.indexed % COMMIT_EVERY == 0:
            self.db.execute("COMMIT")
            self.db.execute("BEGIN IMMEDIATE")
        return True

    def _drop_file(self, file_id: int) -> None:
        self.db.execute("DELETE FROM rows WHERE file = ?", (file_id,))
        self.db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    def _forget(self, rel: str) -> None:
        """A folder that is gone: its files, their rows and its sub-folders."""
        prefix = rel + "/"
        for (file_id,) in self.db.execute(
            "SELECT id FROM files WHERE folder = ? OR substr(folder, 1, ?) = ?", (rel, len(prefix), prefix)
        ).fetchall():
            self._drop_file(file_id)
        self.db.execute("DELETE FROM folders WHERE path = ? OR substr(path, 1, ?) = ?", (rel, len(prefix), prefix))


def _mtime(folder: str) -> int | None:
    try:
        return os.stat(folder).st_mtime_ns
    except FileNotFoundError:
        return None


def _batch_of(name: str) -> int | None:
    if name.startswith("batch_id="):
        try:
            return int(name.removeprefix("batch_id="))
        except ValueError:
            return None
    return None


def _period_of(path: Path) -> str | None:
    """The period a file's path names: `period=P` folders, a conflicts file `period=P.parquet`, an export's folder."""
    for part in reversed(path.parts):
        if part.startswith("period="):
            return part.removeprefix("period=").removesuffix(".parquet")
    if path.name in (PARQUET_FILE, NOT_CHARGED_FILE):
        return path.parent.name
    return None


_COLUMNS = {
    ARCHIVE_CLICK: ("event_id", "ad_id", "event_time"),
    ARCHIVE_IMPRESSION: ("event_time",),
    LEDGER: ("click_id", "ad_id", "campaign_id", "click_time", "amount_micros"),
    UNBILLED: ("click_id", "ad_id", "click_time"),
    NOT_CHARGED: ("click_id", "ad_id", "campaign_id", "click_time", "amount_micros"),
    QUARANTINE: ("event_id", "ad_id", "event_time"),
    RELEASED: ("event_id", "ad_id"),
    CONFLICTS: ("event_id", "ad_id", "event_time"),
    CORRECTION: ("click_id", "ad_id", "campaign_id", "corrects_period", "booked_period", "amount_micros", "kind"),
    EXPORT: (
        "click_id",
        "ad_id",
        "campaign_id",
        "click_time",
        "amount_micros",
        "record_type",
        "status",
        "corrects_period",
        "booked_period",
    ),
    EXPORT_NOT_CHARGED: ("click_id", "ad_id", "campaign_id", "click_time", "amount_micros"),
}


def _read_for_index(kind: str, path: Path) -> tuple[pa.Table | None, int | None, int | None]:
    """The columns the index keeps of a file (None for the impressions' archive), and its span of event times (the
    archive's)."""
    parquet = pq.ParquetFile(path)
    names = set(parquet.schema_arrow.names)
    if kind == ARCHIVE_IMPRESSION:
        low, high = _span_of(parquet, "event_time")
        if low is None and parquet.metadata.num_rows:
            times = parquet.read(columns=["event_time"]).column("event_time")
            low, high = pc.min(times).as_py(), pc.max(times).as_py()
        return None, low, high
    table = parquet.read(columns=[c for c in _COLUMNS[kind] if c in names])
    if kind == ARCHIVE_CLICK and table.num_rows:
        times = table.column("event_time")
        return table, pc.min(times).as_py(), pc.max(times).as_py()
    return table, None, None


def _span_of(parquet: pq.ParquetFile, column: str) -> tuple[int | None, int | None]:
    """The least and greatest value of `column` from the row groups' statistics, when they hold them."""
    metadata = parquet.metadata
    try:
        index = parquet.schema_arrow.get_field_index(column)
    except KeyError:
        return None, None
    if index < 0:
        return None, None
    low = high = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return low, high


def _column(table: pa.Table, name: str) -> list[Any]:
    return table.column(name).to_pylist() if name in table.column_names else [None] * table.num_rows


def _index_rows(kind: str, table: pa.Table, file_id: int, period: str | None) -> Iterator[tuple[Any, ...]]:
    """(click_id, file, row, ad_id, campaign_id, period, click_time, amount, sign, booked) per row naming a click."""
    ids = _column(table, ID_COLUMN.get(kind, "click_id"))
    ads = _column(table, "ad_id")
    campaigns = _column(table, "campaign_id")
    times = _column(table, "click_time" if "click_time" in table.column_names else "event_time")
    amounts = _column(table, "amount_micros")
    periods = _column(table, "corrects_period") if kind in (CORRECTION, EXPORT) else [period] * table.num_rows
    booked = _column(table, "booked_period")
    signs: list[int | None]
    if kind == CORRECTION:
        signs = [1 if k == "addition" else -1 for k in _column(table, "kind")]
        amounts = [None if a is None else abs(a) for a in amounts]
        times = [None] * table.num_rows
    elif kind == EXPORT:
        types, statuses = _column(table, "record_type"), _column(table, "status")
        signs = [(0 if s == "retracted" else 1) if t == "click" else None for t, s in zip(types, statuses, strict=True)]
    elif kind == LEDGER:
        signs = [1] * table.num_rows
    else:
        signs = [None] * table.num_rows
        if kind not in (NOT_CHARGED, EXPORT_NOT_CHARGED):
            campaigns = [None] * table.num_rows
    for row, click_id in enumerate(ids):
        if click_id is None:
            continue
        yield (
            click_id,
            file_id,
            row,
            ads[row],
            campaigns[row],
            periods[row],
            times[row],
            amounts[row],
            signs[row],
            booked[row],
        )


def read_located(located: Sequence[Located], drop: Sequence[str] = ("value",)) -> list[dict[str, Any]]:
    """The rows `located` names, each with `found_in` (its kind), `file` (its path), `row`, `period` and `batch_id`;
    a row whose id is not the one asked for (a file rewritten since it was indexed) is searched for in its file. A
    file gone since is passed over."""
    out: list[dict[str, Any]] = []
    by_file: dict[Path, list[Located]] = {}
    for item in located:
        by_file.setdefault(item.path, []).append(item)
    for path, items in by_file.items():
        try:
            parquet = pq.ParquetFile(path)
            table = parquet.read(columns=[n for n in parquet.schema_arrow.names if n not in drop])
        except (OSError, pa.ArrowException):
            continue
        id_column = ID_COLUMN.get(items[0].kind, "click_id")
        ids = table.column(id_column).to_pylist() if id_column in table.column_names else []
        for item in items:
            rows = [item.row] if item.row < len(ids) else []
            if not rows or ids[item.row] != item.click_id:
                rows = [n for n, value in enumerate(ids) if value == item.click_id]
            for row in rows:
                record = {name: table.column(name)[row].as_py() for name in table.column_names}
                record.setdefault("period", item.period)
                source = record.pop(SOURCE_BATCH, None)  # a compacted file's: the batch that wrote the row
                record["batch_id"] = source if source is not None else record.get("batch_id", item.batch_id)
                out.append({**record, "found_in": item.kind, "file": str(path), "row": row})
    return out
