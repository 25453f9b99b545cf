"""The books' rows of each closed period counted by ad and price, a file a UTC day
(`index/price-counts/YYYYMMDD.parquet`), so that an ad's clicks by price over a month
(`billing.store.click_story.ClickStories.by_price`, the ad's page and its API document) read a few rows per period
instead of the month's ledger and exports.

A period's counts are the rows `billing.store.click_files.ClickFiles.book_rows` finds in its folder (ledger,
corrections, the export's click rows), without the click ids: how many rows of each (ad, kind, period, booked period,
amount, sign). `billing.story.by_price` weighs them by that count; the answer is the one the rows themselves give.

Like a day filter's part (`billing.store.click_filters`), a period's counts **cover** the files they were counted
from (path under the data folder, size, modification time, in the file's metadata): where the period's files are
not the ones covered (a correction booked to it after, a compaction, a file rewritten), its rows are read as they
are, so the counts can never change an answer. Written by reconciliation with the day filters
(`ClickFiles.refresh_filters`) and by `adbill click-filters`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from billing.layout import DataLayout
from billing.store.click_filters import Stamp, stamp
from billing.store.columns import schema
from billing.store.durable import write_whole_bytes

COVERS_KEY = b"adbill.covers"
"""The file's metadata entry: period -> {path under the data folder: [size, mtime_ns]}."""

ROW_GROUP_ROWS = 65_536
"""Rows per row group; the file is sorted by ad, so a lookup of one ad reads the row groups whose statistics hold it."""

COUNT_SCHEMA = schema(("ad_id", "kind", "period", "booked_period", "amount_micros", "sign", "rows"))
"""A period's counts: how many book rows share an ad, kind, period (the click's), booked period, amount and sign."""

STATISTICS = ("ad_id",)
"""The columns whose row-group statistics are written: the one a lookup prunes by (the file is sorted by it); the
others' would only lengthen the footer every lookup parses (a day of a million ads: 48 M rows in 733 row groups)."""

SCHEMA = schema(("folder", *COUNT_SCHEMA.names))
"""A day's file: the counts of each period (`folder`, the period whose files they were counted from)."""


@dataclass(frozen=True)
class Counted:
    """How many book rows of a period's folder share an ad, kind, period (the click's), booked period, amount and
    sign."""

    ad_id: str
    kind: str
    period: str | None
    booked_period: str | None
    amount_micros: int
    sign: int
    rows: int


@dataclass(frozen=True)
class PeriodCounts:
    """One period's counts (a table of `COUNT_SCHEMA`, no two rows with the same key) and the files they cover (path
    under the data folder -> `Stamp`)."""

    counted: pa.Table
    covers: dict[str, Stamp]


def read_covers(path: Path) -> dict[str, dict[str, Stamp]] | None:
    """The periods a day's file holds, each with the files it covers; None when there is no file or it does not read
    (its periods are then read from their files)."""
    try:
        metadata = pq.read_metadata(path).metadata or {}
        covers = json.loads(metadata[COVERS_KEY])
        return {period: {k: (int(v[0]), int(v[1])) for k, v in files.items()} for period, files in covers.items()}
    except (OSError, pa.ArrowException, KeyError, ValueError, TypeError, IndexError):
        return None


def read_counts(path: Path, periods: Iterable[str], ad_id: str) -> dict[str, list[Counted]] | None:
    """The counts of `ad_id` in `periods` of a day's file (a period with none of its rows: an empty list); None when
    the file does not read."""
    wanted = sorted(set(periods))
    try:
        table = pq.read_table(path, filters=[("ad_id", "=", ad_id), ("folder", "in", wanted)])
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return None
    out: dict[str, list[Counted]] = {period: [] for period in wanted}
    for row in table.to_pylist():
        out[row["folder"]].append(
            Counted(
                row["ad_id"],
                row["kind"],
                row["period"],
                row["booked_period"],
                int(row["amount_micros"]),
                int(row["sign"]),
                int(row["rows"]),
            )
        )
    return out


def write_counts_day(layout: DataLayout, day: str, new: dict[str, PeriodCounts]) -> Path:
    """Write `day`'s file with the counts of `new` in place of those periods', every other period the file held kept
    as it was. The file's path."""
    path = layout.price_counts_day(day)
    kept: list[pa.Table] = []
    covers: dict[str, dict[str, Stamp]] = {}
    old = read_covers(path) if path.exists() else None
    if old is not None:
        others = [period for period in old if period not in new]
        try:
            if others:
                kept.append(pq.read_table(path, filters=[("folder", "in", others)]).cast(SCHEMA))
            covers.update({period: old[period] for period in others})
        except (OSError, pa.ArrowException, KeyError, ValueError):
            kept, covers = [], {}  # a file that does not read is written anew from what is given
    for period, counts in new.items():
        kept.append(_table(period, counts.counted))
        covers[period] = counts.covers
    table = pa.concat_tables(kept) if kept else SCHEMA.empty_table()
    table = table.sort_by([("ad_id", "ascending"), ("folder", "ascending")])
    metadata = {COVERS_KEY: json.dumps({p: {k: list(v) for k, v in f.items()} for p, f in sorted(covers.items())})}
    table = table.replace_schema_metadata(metadata)
    write_whole_bytes(
        path,
        lambda out: pq.write_table(table, out, row_group_size=ROW_GROUP_ROWS, write_statistics=list(STATISTICS)),
    )
    return path


def _table(period: str, counted: pa.Table) -> pa.Table:
    counted = counted.select(COUNT_SCHEMA.names).cast(COUNT_SCHEMA)
    return counted.add_column(0, SCHEMA.field("folder"), pa.repeat(pa.scalar(period, pa.string()), counted.num_rows))


def stamps_of(root: Path, files: Iterable[Path]) -> dict[str, Stamp]:
    """The stamps of `files`, keyed as covers (a file gone is left out)."""
    out = {}
    for path in files:
        now = stamp(path)
        if now is not None:
            out[path.relative_to(root).as_posix()] = now
    return out
