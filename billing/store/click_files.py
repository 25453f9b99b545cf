"""A click's rows found in the data folder's Parquet files themselves, read with DuckDB (`ClickFiles`: `rows_of`,
`archive_files`, `book_rows`, `closed_periods`, `export_folder`, `manifest_path`, `refresh`, the interface of the
SQLite click index it replaced) with no file of its own, so that any host that shares the data folder reads the same
stories (docs/click-stories-at-scale.md, "What is built").

Where a click's rows lie, by the layout (`billing.layout`): the archive's copies, the ledger, `unbilled/` and
`not_charged/` in the batch folders of the click's period (`period=P/batch_id=N/`, or a compacted file there:
`billing.store.compaction`), its corrections in `corrections/period=P/`, its id conflicts in `conflicts/period=P`,
the export of P, and the adjustments of later periods' exports that correct P; the quarantine and `released/` by
batch only. A lookup:

- **with the click's day** reads the periods of that day (their keys begin with the day), newest first, a day in
  one query per kind;
- **without it** reads the periods the folders hold, a day at a time, newest day first, until a day holds the
  click's own rows (the newer days' exports read on the way are those that could hold an adjustment of it), back to
  `since` when given (the story's horizon, `story_days`);
- **past the horizon, with the day** (`export_rows_of`) reads only the exports: the day's, and the later ones'
  adjustments;
- then the exports of the periods after the click's own (adjustments booked later), and the quarantine and
  `released/` (bad input only): their batch files not compacted yet, and the compacted chunks whose filter may hold
  the click (`refresh_chunk_filters`; narrowing them to the day's batches is still to build).

Each period read by a click id asks its day filter first (`billing.store.click_filters`, written by reconciliation
for closed periods: `write_filters`, `stale_filters`): where the filter says the id is not there, only the period's
files its part does not cover are read, so a lookup without a day reads a few small files a day, not every period.

Compaction's rule for readers that take no lock holds (`compaction.superseded`, through `live_files`): a compacted
file stands for the batch files of its span beside it; a file gone between a listing and its reading (a compaction
removed it) makes the lookup list again. A row found is named by its kind, file, position, period and batch
(`Located`) and read back by `read_located`, which takes each row's own batch from a compacted file.
Nothing is kept between lookups but one in-memory DuckDB connection per thread.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from billing.layout import DataLayout
from billing.store.click_filters import DayFilters, Stamp, days_of, period_ids, ruled_out, stamp, write_day
from billing.store.compaction import SOURCE_BATCH, batch_of, compacted_span, live_files
from billing.store.export_files import MANIFEST_FILE, NOT_CHARGED_FILE, PARQUET_FILE
from billing.store.price_counts import (
    COUNT_SCHEMA,
    PeriodCounts,
    read_counts,
    read_covers,
    stamps_of,
    write_counts_day,
)
from billing.story import BookRow

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
"""The kinds of rows that name a click id (a story's `found_in`)."""

ID_COLUMN = {
    ARCHIVE_CLICK: "event_id",
    QUARANTINE: "event_id",
    RELEASED: "event_id",
    CONFLICTS: "event_id",
}
"""The column that holds the click id, where it is not `click_id`."""

BATCHED = (ARCHIVE_CLICK, LEDGER, UNBILLED, NOT_CHARGED)
"""The kinds written per batch and period (`period=P/batch_id=N/`), compacted once their period is closed."""

OWN = (*BATCHED, CORRECTION, CONFLICTS, EXPORT_NOT_CHARGED)
"""The kinds that lie in the click's own period only (an export's rows may correct an earlier period)."""

FILTERED = (*OWN, EXPORT)
"""The kinds a period's part of its day filter covers (`billing.store.click_filters`): those a lookup reads by
period."""

COUNTED = (LEDGER, CORRECTION, EXPORT)
"""The kinds whose rows a period's price counts hold (`billing.store.price_counts`): those of `ClickFiles.book_rows`."""

CHUNK_FILTERS = {QUARANTINE: "quarantine-chunks", RELEASED: "released-chunks"}
"""The filter files (`index/click-days/NAME.bloom`) of the quarantine's and `released/`'s compacted chunks: a part
per chunk file, keyed by its path, so that a lookup reads only the chunks that may hold the click."""

RECENT_FILTER_DAYS = 2
"""The newest days of closed periods whose filters reconciliation checks against their files at each run."""

FILTER_MAX_FILES = 200
"""A period's files a filter part covers at most: more, and its batch files are not compacted yet."""

TRIES = 3
"""Listings of one read when files listed are gone before they are read (a compaction removed them)."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Located:
    """A row of a file that names a click id."""

    click_id: str
    kind: str
    path: Path
    row: int
    period: str | None
    batch_id: int | None


def parse_day(text: str) -> dt.date:
    """A click's day as people give it (`YYYY-MM-DD`, UTC); ValueError otherwise."""
    try:
        return dt.datetime.strptime(text, "%Y-%m-%d").date()
    except ValueError:
        raise ValueError(f"{text!r} is not a day such as 2026-01-01") from None


@dataclass(frozen=True)
class FilterRefresh:
    """What `ClickFiles.refresh_filters` did."""

    written: list[str]
    """The closed periods whose parts it wrote."""
    hashed: int
    """Click ids put in them."""
    waiting: list[str]
    """Closed periods without a part whose batch files are not compacted yet (oldest first)."""
    counted: list[str] = field(default_factory=list)
    """The closed periods whose price counts it wrote (`billing.store.price_counts`)."""
    chunks: int = 0
    """The quarantine's and `released/`'s compacted chunks whose filters it wrote."""

    def describe(self) -> str:
        head = (
            f"click filters: {len(self.written)} period(s) written ({self.hashed:,} click ids), "
            f"{self.written[0]} to {self.written[-1]}"
            if self.written
            else "click filters: up to date"
        )
        if self.counted:
            head += f"; price counts of {len(self.counted)} period(s)"
        if self.chunks:
            head += f"; the filters of {self.chunks} quarantine chunk(s)"
        if self.waiting:
            head += f"; {len(self.waiting)} closed period(s) wait for their compaction, the oldest {self.waiting[0]}"
        return head


class ClickFiles:
    """The finder of one data folder (module doc)."""

    def __init__(self, layout: DataLayout) -> None:
        self.layout = layout
        self.root = layout.root
        self._local = threading.local()
        self.filters = DayFilters(layout)
        self._covers: dict[str, tuple[Stamp, dict[str, dict[str, Stamp]]]] = {}

    # --- The folders ------------------------------------------------------------------------------------------

    def _folder(self, kind: str) -> Path:
        return {
            ARCHIVE_CLICK: self.layout.archive_of("click"),
            ARCHIVE_IMPRESSION: self.layout.archive_of("impression"),
            LEDGER: self.layout.ledger,
            UNBILLED: self.layout.unbilled,
            NOT_CHARGED: self.layout.not_charged,
            CORRECTION: self.layout.corrections,
        }[kind]

    def periods(self) -> list[str]:
        """Every period the folders hold (batch kinds, corrections, conflicts, exports), newest first."""
        found: set[str] = set()
        for kind in (*BATCHED, CORRECTION):
            found |= _names(self._folder(kind), "period=")
        found |= {name.removesuffix(".parquet") for name in _names(self.layout.conflicts, "period=")}
        found |= _names(self.layout.exports, "")
        return sorted((p for p in found if _is_key(p)), reverse=True)

    def files(self, kind: str, period: str) -> list[Path]:
        """The files of `kind` that hold rows of `period`'s clicks (but an export's adjustments of earlier ones):
        a batch kind's live files (a compacted file, not the batch files it stands for)."""
        if kind in (*BATCHED, ARCHIVE_IMPRESSION):
            return live_files(self._folder(kind) / f"period={period}", depth=1)
        if kind == CORRECTION:
            return _parquet_in(self.layout.corrections_of(period))
        if kind == CONFLICTS:
            path = self.layout.conflicts_of(period)
            return [path] if path.is_file() else []
        if kind in (EXPORT, EXPORT_NOT_CHARGED):
            path = self.layout.export(period) / (PARQUET_FILE if kind == EXPORT else NOT_CHARGED_FILE)
            return [path] if path.is_file() else []
        raise ValueError(f"{kind} is not kept by period")

    def _lister(
        self, kind: str, periods: Sequence[str], skip: dict[str, Callable[[Path], bool] | None] | None = None
    ) -> Callable[[], list[Path]]:
        """Lists the files of `kind` in `periods` each time it is called (`_query` may list again); with `skip`
        (`_skips`), without the files a period's day filter says need not be read."""
        skip = skip or {}

        def listed() -> list[Path]:
            out = []
            for period in periods:
                passed = skip.get(period)
                out += [path for path in self.files(kind, period) if passed is None or not passed(path)]
            return out

        return listed

    def _skips(self, periods: Sequence[str], click_id: str) -> dict[str, Callable[[Path], bool] | None]:
        """For each of `periods`, which files a lookup of `click_id` need not read (`DayFilters.skippable`)."""
        return {period: self.filters.skippable(period, click_id) for period in periods}

    # --- The day filters (billing.store.click_filters) ---------------------------------------------------------

    def filter_files(self, period: str) -> list[tuple[Path, str]]:
        """The files a part of `period` covers, each with its id column."""
        return [(path, ID_COLUMN.get(kind, "click_id")) for kind in FILTERED for path in self.files(kind, period)]

    def write_filters(self, periods: Iterable[str], progress: Callable[[str], None] = lambda message: None) -> int:
        """Write the parts of `periods` in their days' files, each from its files as they are now; ids hashed."""
        hashed = 0
        for day, of_day in sorted(days_of(sorted(set(periods))).items()):
            parts = {period: period_ids(self.filter_files(period)) for period in of_day}
            hashed += sum(len(ids) for ids, _ in parts.values())
            write_day(self.layout, day, parts)
            progress(f"click filters of {day}: {len(of_day)} period(s), {hashed:,} ids so far")
        return hashed

    def refresh_filters(self, closed: Iterable[str], recent_days: int = RECENT_FILTER_DAYS) -> FilterRefresh:
        """Write the parts of the closed periods that have none, and of those of the `recent_days` newest days whose
        files changed since (a correction booked to them later), each once its files are few (compacted, at most
        `FILTER_MAX_FILES`; the others wait); the periods' price counts (`billing.store.price_counts`) the same way.
        A correction booked to an older period is read beside its filter and counts until `adbill click-filters`
        writes its day again."""
        closed = sorted(set(closed))
        days = sorted({p[:8] for p in closed})[-recent_days:] if recent_days > 0 else []
        due, waiting = self._due(closed, days, self._has_part, self.filter_files, self._stale)
        written = self.write_filters(due) if due else 0
        counts_due, _ = self._due(closed, days, self._has_counts, self.count_files, self._counts_stale)
        counted = self.write_counts(counts_due) if counts_due else []
        return FilterRefresh(due, written, waiting, counted, self.refresh_chunk_filters())

    @staticmethod
    def _due(
        closed: Sequence[str],
        recent: Sequence[str],
        has: Callable[[str], bool],
        files_of: Callable[[str], Sequence[Any]],
        stale: Callable[[str, Any], bool],
    ) -> tuple[list[str], list[str]]:
        """Of `closed`, those to write (none yet, or of a `recent` day and `stale`) once their files are few, and
        those without one whose files are not (waiting)."""
        due, waiting = [], []
        for period in closed:
            held = has(period)
            if held and period[:8] not in recent:
                continue
            files = files_of(period)
            if len(files) > FILTER_MAX_FILES:
                if not held:
                    waiting.append(period)  # its batch files are not compacted yet: a later run writes it
                continue
            if not held or stale(period, files):
                due.append(period)
        return due, waiting

    def _has_part(self, period: str) -> bool:
        day_filter = self.filters.of(period[:8])
        return day_filter is not None and period in day_filter.parts

    def stale_filters(self, periods: Iterable[str]) -> list[str]:
        """Those of `periods` whose day filter has no part, or a part that does not cover their files as they are."""
        return [period for period in periods if self._stale(period, self.filter_files(period))]

    def _stale(self, period: str, files: list[tuple[Path, str]]) -> bool:
        """Whether `period` has no part in its day filter, or one that does not cover `files` as they are now."""
        day_filter = self.filters.of(period[:8])
        part = day_filter.parts.get(period) if day_filter is not None else None
        return part is None or stamps_of(self.root, (path for path, _ in files)) != part.covers

    # --- The price counts (billing.store.price_counts) ------------------------------------------------------------

    def count_files(self, period: str) -> list[Path]:
        """The files a period's price counts cover."""
        return [path for kind in COUNTED for path in self.files(kind, period)]

    def _counts_covers(self, day: str) -> dict[str, dict[str, Stamp]]:
        """What `day`'s counts file covers (period -> files), read again when the file changed; {} without one."""
        path = self.layout.price_counts_day(day)
        now = stamp(path)
        if now is None:
            return {}
        held = self._covers.get(day)
        if held is None or held[0] != now:
            held = (now, read_covers(path) or {})
            self._covers[day] = held
        return held[1]

    def _has_counts(self, period: str) -> bool:
        return period in self._counts_covers(period[:8])

    def _counts_stale(self, period: str, files: Sequence[Path]) -> bool:
        return self._counts_covers(period[:8]).get(period) != stamps_of(self.root, files)

    def period_counts(self, period: str) -> PeriodCounts | None:
        """`period`'s book rows (those `book_rows` reads in its folder) counted by ad, kind, period, booked period,
        amount and sign (`COUNT_SCHEMA`), with the files they cover; None when its files changed while they were
        read. Counted by DuckDB into Arrow: a period of a million ads is a million rows that never become Python
        objects."""
        before = stamps_of(self.root, self.count_files(period))
        # Each kind's rows grouped by the very expressions kept (GROUP BY ALL), so no two rows of a kind share a key.
        tables = [
            self._query_arrow(
                self._lister(LEDGER, [period]),
                "SELECT ad_id, 'ledger' AS kind, $period AS period, NULL::VARCHAR AS booked_period, "
                "coalesce(amount_micros, 0) AS amount_micros, 1 AS sign, count(*) AS rows FROM {files} "
                "WHERE ad_id IS NOT NULL GROUP BY ALL",
                {"period": period},
            ),
            self._query_arrow(
                self._lister(CORRECTION, [period]),
                "SELECT ad_id, 'correction' AS kind, corrects_period AS period, booked_period, "
                "abs(coalesce(amount_micros, 0)) AS amount_micros, CASE WHEN f.kind = 'addition' THEN 1 ELSE -1 END "
                "AS sign, count(*) AS rows FROM {files} AS f WHERE ad_id IS NOT NULL GROUP BY ALL",
                {},
            ),
            self._query_arrow(
                self._lister(EXPORT, [period]),
                "SELECT ad_id, 'export' AS kind, corrects_period AS period, booked_period, "
                "coalesce(amount_micros, 0) AS amount_micros, CASE WHEN status = 'retracted' THEN 0 ELSE 1 END "
                "AS sign, count(*) AS rows FROM {files} "
                "WHERE ad_id IS NOT NULL AND record_type = 'click' AND click_id IS NOT NULL GROUP BY ALL",
                {},
            ),
        ]
        if stamps_of(self.root, self.count_files(period)) != before:
            return None  # rewritten while read: left out, so its rows are read as they are
        counted = [table.cast(COUNT_SCHEMA) for table in tables if table is not None]
        return PeriodCounts(pa.concat_tables(counted) if counted else COUNT_SCHEMA.empty_table(), before)

    def write_counts(self, periods: Iterable[str], progress: Callable[[str], None] = lambda message: None) -> list[str]:
        """Write the price counts of `periods` in their days' files, each from its files as they are now; the periods
        written."""
        written: list[str] = []
        for day, of_day in sorted(days_of(sorted(set(periods))).items()):
            counts = {period: self._counts_or_none(period) for period in of_day}
            new = {period: c for period, c in counts.items() if c is not None}
            if new:
                write_counts_day(self.layout, day, new)
                written += sorted(new)
            progress(f"price counts of {day}: {len(new)} period(s)")
        return written

    def _counts_or_none(self, period: str) -> PeriodCounts | None:
        """`period_counts`, None when a file does not read (a broken file): the period is read as it is."""
        try:
            return self.period_counts(period)
        except (duckdb.Error, OSError):
            return None

    def price_rows(self, first_period: str, last_period: str, ad_id: str) -> list[tuple[BookRow, int]]:
        """The books' rows of `ad_id` whose click lies in `first_period` to `last_period`, each with how many rows it
        stands for: a period's price counts where they cover its files as they are, its rows (`book_rows`) where
        not. For the arithmetic of `billing.story.by_price_counted`."""
        periods = [p for p in self.periods() if first_period <= p <= last_period]
        out: list[tuple[BookRow, int]] = []
        read: list[str] = []
        for day, of_day in days_of(periods).items():
            covers = self._counts_covers(day)
            held = [p for p in of_day if p in covers and covers[p] == stamps_of(self.root, self.count_files(p))]
            counts = read_counts(self.layout.price_counts_day(day), held, ad_id) if held else {}
            if counts is None:
                counts = {}
            for period in of_day:
                if period not in counts:
                    read.append(period)
                    continue
                out += [
                    (BookRow("", c.kind, c.period, c.amount_micros, c.sign, c.booked_period), c.rows)  # type: ignore[arg-type]
                    for c in counts[period]
                ]
        out += [(row, 1) for row in self._book_rows(read, "ad_id", ad_id)]
        return out

    def _batch_only(self, kind: str, click_id: str | None = None) -> list[Path]:
        """The quarantine's or `released/`'s files (`batch_id=N/`), every batch; a chunk's compacted file stands for
        the batch files it holds (`live_files`; `billing.store.compaction.compact_quarantine`). With `click_id`,
        without the chunks whose filter says the id is not there (`refresh_chunk_filters`)."""
        folder = self.layout.quarantine if kind == QUARANTINE else self.layout.released
        files = live_files(folder, depth=1)
        if click_id is None:
            return files
        chunk_filter = self.filters.of(CHUNK_FILTERS[kind])
        if chunk_filter is None:
            return files
        return [path for path in files if not ruled_out(chunk_filter, self.root, path, click_id)]

    def refresh_chunk_filters(self) -> int:
        """Write a part for each compacted chunk of the quarantine and `released/` that has none or whose file
        changed (the chunk under way, merged again by each open pass), and drop the parts of chunk files gone; the
        chunks written."""
        written = 0
        for kind, name in CHUNK_FILTERS.items():
            chunk_filter = self.filters.of(name)
            held = chunk_filter.parts if chunk_filter is not None else {}
            chunks = {
                path.relative_to(self.root).as_posix(): path
                for path in self._batch_only(kind)
                if compacted_span(path.name) is not None
            }
            new = {
                key: period_ids([(path, ID_COLUMN[kind])])
                for key, path in chunks.items()
                if key not in held or held[key].covers.get(key) != stamp(path)
            }
            if new or set(held) - set(chunks):
                write_day(self.layout, name, new, keep=chunks.__contains__)
                written += len(new)
        return written

    # --- Reading ----------------------------------------------------------------------------------------------

    def _db(self) -> duckdb.DuckDBPyConnection:
        """This thread's in-memory connection (made on first use, kept)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = duckdb.connect(":memory:")
            self._local.db = db
        return db

    def _query(self, files: Callable[[], Sequence[Path]], sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """`sql` over `read_parquet($files, ...)` (written `{files}` in it) with the files listed now; listed and
        read again when a file listed is gone before it is read."""
        return self._run(files, sql, params, lambda db, query, values: db.execute(query, values).fetchall()) or []

    def _query_arrow(self, files: Callable[[], Sequence[Path]], sql: str, params: dict[str, Any]) -> pa.Table | None:
        """`_query`'s answer as an Arrow table; None when there are no files."""
        return self._run(files, sql, params, lambda db, query, values: db.sql(query, params=values).to_arrow_table())

    def _run(
        self,
        files: Callable[[], Sequence[Path]],
        sql: str,
        params: dict[str, Any],
        fetch: Callable[[duckdb.DuckDBPyConnection, str, dict[str, Any]], _T],
    ) -> _T | None:
        for attempt in range(TRIES):
            paths = [str(path) for path in files()]
            if not paths:
                return None
            source = (
                "read_parquet($files, filename = true, file_row_number = true, hive_partitioning = false, "
                "union_by_name = true)"
            )
            try:
                return fetch(self._db(), sql.format(files=source), {"files": paths, **params})
            except duckdb.IOException:
                if attempt == TRIES - 1 or all(Path(path).exists() for path in paths):
                    raise
        raise AssertionError("unreachable")

    def _located(self, kind: str, files: Callable[[], Sequence[Path]], click_id: str) -> list[Located]:
        column = ID_COLUMN.get(kind, "click_id")
        sql = f"SELECT filename, file_row_number FROM {{files}} WHERE {column} = $id"  # nosec B608: constants
        found = self._query(files, sql + " ORDER BY filename, file_row_number", {"id": click_id})
        return [
            Located(click_id, kind, Path(name), int(row), _period_of(Path(name)), _batch_of(Path(name)))
            for name, row in found
        ]

    def rows_of(self, click_id: str, day: dt.date | None = None, since: dt.date | None = None) -> list[Located]:
        """Every row of the data folder that names `click_id` (module doc): in `day`'s periods when given, else in
        the newest day that holds the click's own rows (no older than `since` when given: the story's horizon);
        with the later exports, the quarantine and `released/`."""
        periods = self.periods()
        if day is not None:
            prefix = day.strftime("%Y%m%d")
            periods = [p for p in periods if p.startswith(prefix)]
        elif since is not None:
            first = since.strftime("%Y%m%d")
            periods = [p for p in periods if p[:8] >= first]
        found: list[Located] = []
        read_exports: set[str] = set()
        own: str | None = None
        for day_periods in _by_day(periods):
            skips = self._skips(day_periods, click_id)
            for kind in (*OWN, EXPORT):
                found += self._located(kind, self._lister(kind, day_periods, skips), click_id)
            read_exports |= set(day_periods)
            own = _own_period(found)
            if own is not None:
                break
        if own is not None:
            later = [p for p in self.periods() if p > own and p not in read_exports]
            found += self._located(EXPORT, self._lister(EXPORT, later, self._skips(later, click_id)), click_id)
        for kind in (QUARANTINE, RELEASED):
            found += self._located(kind, functools.partial(self._batch_only, kind, click_id), click_id)
        return sorted(found, key=lambda item: (str(item.path), item.row))

    def export_rows_of(self, click_id: str, day: dt.date) -> list[Located]:
        """The rows of the exports that name `click_id` as a click of `day` (the story past its horizon): the click
        and not-charged rows of the day's periods' exports, and the adjustments of later exports that correct one of
        those periods (a row found names its period; whether an adjustment corrects the day is read from the row)."""
        prefix = day.strftime("%Y%m%d")
        exported = self.exported_periods(day)
        skips = self._skips(exported, click_id)
        found = [
            *self._located(EXPORT, self._lister(EXPORT, exported, skips), click_id),
            *self._located(EXPORT_NOT_CHARGED, self._lister(EXPORT_NOT_CHARGED, exported, skips), click_id),
        ]
        later = [p for p in self.periods() if p[:8] > prefix]
        found += self._located(EXPORT, self._lister(EXPORT, later, self._skips(later, click_id)), click_id)
        return sorted(found, key=lambda item: (str(item.path), item.row))

    def exported_periods(self, day: dt.date) -> list[str]:
        """The periods of `day` (UTC) with an export, oldest first."""
        prefix = day.strftime("%Y%m%d")
        return sorted(p for p in self.closed_periods() if p.startswith(prefix))

    def archive_files(self, kind: str, periods: Sequence[str], low_ms: int, high_ms: int) -> list[Path]:
        """The archive's live files of `kind` in `periods` whose event times may meet [low_ms, high_ms] (by their
        statistics; a file without them is kept)."""
        out = []
        for period in periods:
            for path in self.files(kind, period):
                span = _event_time_span(path)
                if span is None or (span[0] <= high_ms and span[1] >= low_ms):
                    out.append(path)
        return out

    def book_rows(
        self, first_period: str, last_period: str, *, ad_id: str | None = None, campaign_id: str | None = None
    ) -> list[BookRow]:
        """The books' rows (ledger, corrections, exports' click rows) of an ad or a campaign whose click lies in the
        periods `first_period` to `last_period` (keys sort as time), with the click's time (a correction's from the
        archive)."""
        column, value = ("ad_id", ad_id) if ad_id is not None else ("campaign_id", campaign_id)
        return self._book_rows([p for p in self.periods() if first_period <= p <= last_period], column, value)

    def _book_rows(self, periods: Sequence[str], column: str, value: str | None) -> list[BookRow]:
        """`book_rows` of `periods` whose `column` is `value`."""
        rows: list[BookRow] = []
        where = f"WHERE {column} = $v"
        ledger = "SELECT filename, click_id, amount_micros, click_time FROM {files} " + where
        for period in sorted(periods):
            for name, click, amount, at in self._query(self._lister(LEDGER, [period]), ledger, {"v": value}):
                rows.append(BookRow(click, "ledger", _period_of(Path(name)) or period, amount or 0, 1, None, at))
            corrections = self._query(
                self._lister(CORRECTION, [period]),
                "SELECT click_id, corrects_period, amount_micros, kind, booked_period FROM {files} " + where,
                {"v": value},
            )
            times = self._click_times(period, {row[0] for row in corrections})
            for click, corrects, amount, kind, booked in corrections:
                sign = 1 if kind == "addition" else -1
                rows.append(BookRow(click, "correction", corrects, abs(amount or 0), sign, booked, times.get(click)))
            for click, corrects, amount, status, booked, at in self._query(
                self._lister(EXPORT, [period]),
                "SELECT click_id, corrects_period, amount_micros, status, booked_period, click_time FROM {files} "
                f"{where} AND record_type = 'click' AND click_id IS NOT NULL",
                {"v": value},
            ):
                sign = 0 if status == "retracted" else 1
                rows.append(BookRow(click, "export", corrects, amount or 0, sign, booked, at))
        return rows

    def _click_times(self, period: str, click_ids: Iterable[str]) -> dict[str, int]:
        """The earliest archive time of each click id among the clicks of `period`."""
        ids = sorted(click_ids)
        if not ids:
            return {}
        found = self._query(
            self._lister(ARCHIVE_CLICK, [period]),
            "SELECT event_id, min(event_time) FROM {files} WHERE event_id IN (SELECT unnest($ids)) GROUP BY event_id",
            {"ids": ids},
        )
        return {click: at for click, at in found}

    def closed_periods(self) -> set[str]:
        """The periods with an export (closed)."""
        return {
            p
            for p in _names(self.layout.exports, "")
            if (self.layout.export(p) / PARQUET_FILE).is_file() or (self.layout.export(p) / NOT_CHARGED_FILE).is_file()
        }

    def export_folder(self, period: str) -> Path:
        return self.layout.export(period)

    def manifest_path(self, period: str) -> Path:
        return self.layout.export(period) / MANIFEST_FILE

    def refresh(self) -> bool:
        """Nothing to bring up to date: every lookup reads the files as they are (always True)."""
        return True


def _names(folder: Path, prefix: str) -> set[str]:
    """The names of `folder`'s entries that begin with `prefix`, without it (not dot files)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return set()
    return {e.name.removeprefix(prefix) for e in entries if e.name.startswith(prefix) and not e.name.startswith(".")}


def _is_key(name: str) -> bool:
    return len(name) == 14 and name[8] == "T" and name.endswith("Z") and name[:8].isdigit()


def _parquet_in(folder: Path) -> list[Path]:
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    return sorted(Path(e.path) for e in entries if e.name.endswith(".parquet") and not e.name.startswith("."))


def _by_day(periods: Sequence[str]) -> list[list[str]]:
    """`periods` (newest first) in groups of one UTC day each, in the same order."""
    days: dict[str, list[str]] = {}
    for period in periods:
        days.setdefault(period[:8], []).append(period)
    return list(days.values())


def _period_of(path: Path) -> str | None:
    """The period a file's path names: `period=P` folders, a conflicts file `period=P.parquet`, an export's folder."""
    for part in reversed(path.parts):
        if part.startswith("period="):
            return part.removeprefix("period=").removesuffix(".parquet")
    if path.name in (PARQUET_FILE, NOT_CHARGED_FILE):
        return path.parent.name
    return None


def _batch_of(path: Path) -> int | None:
    return batch_of(path.parent.name)


def _own_period(found: Sequence[Located]) -> str | None:
    """The click's own period among rows found: the newest that holds a row of a kind kept in its own period."""
    own = [item.period for item in found if item.kind in OWN and item.period is not None]
    return max(own) if own else None


def _event_time_span(path: Path) -> tuple[int, int] | None:
    """The least and greatest `event_time` of a Parquet file from its row groups' statistics; None when they do not
    say (or the file does not read: it is read, and passed over, with the rest)."""
    try:
        metadata = pq.read_metadata(path)
        index = metadata.schema.to_arrow_schema().get_field_index("event_time")
    except (OSError, pa.ArrowException):
        return None
    if index < 0 or not metadata.num_row_groups:
        return None
    low = high = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return (low, high) if low is not None and high is not None else None


def read_located(located: Sequence[Located], drop: Sequence[str] = ("value",)) -> list[dict[str, Any]]:
    """The rows `located` names, each with `found_in` (its kind), `file` (its path), `row`, `period` and `batch_id`;
    a row whose id is not the one asked for (a file rewritten since it was found: a replayed batch) is searched for
    in its file. A file gone since is passed over."""
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
