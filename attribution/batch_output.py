"""One micro-batch's output, as Arrow tables: the ledger, archive and quarantine rows, their Parquet files and the
figures Redis is given (totals; late, clock-ahead and quarantine counts). Pure pyarrow: no Spark, no services.

In: a task's share of the job's output, as `BatchSink` hands it to `PartitionWriter` on an executor (rows of
`KIND` `bill` with the billable columns, rows of `KIND` `intake` with the archive's columns and a `reason` that
is null for a valid event). Out: `BatchOutput` (`split_batch`), written with `write_batch_files`, one file per
task and folder (`part-TTTTT.parquet`, TTTTT the task's partition), and the task's figures (`FIGURES`), which the
driver sums (`batch_figures`):

- ledger: `LEDGER/period=P/batch_id=N/part-TTTTT.parquet`, one row per billed click;
- archive: `ARCHIVE/event_type=T/period=P/batch_id=N/part-TTTTT.parquet`, one row per valid event received,
  `late` when the streaming join's watermark kept it out;
- quarantine: `QUARANTINE/batch_id=N/part-TTTTT.parquet`, one row per bad record;
- unbilled: `UNBILLED/period=P/batch_id=N/part-TTTTT.parquet`, one row per matched click that the catalog (as of
  the batch's version) priced nothing at its time, with the reason (`ad_paused`, `unknown_ad`).

Bills are priced here (`attribution.pricing`), from the catalog version the batch was first priced with, so a
replayed batch bills what its first attempt billed.

Partition columns live in the paths only (hive style), as Spark writes them, so pyarrow, DuckDB and Spark read
the same tables. Each file is written under a dot-name in its folder, flushed to disk and renamed into place, and
its folder flushed: readers skip dot files, a crash leaves no half file, a power loss no missing one, and a
replayed batch replaces its files with the same names. A write that fails (a full disk) removes its dot files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from attribution.pricing import UNBILLED_COLUMNS, price_matches
from billing.catalog import Catalog
from billing.periods import Periods
from billing.store.durable import fsync_folder, make_folder, replace_files
from billing.store.parquet_ledger import ledger_totals
from billing.store.redis_totals import ClockAheadCount, LateCount, QuarantineCount, TotalsRow, UnbilledCount

KIND = "kind"
"""Which branch a row of the job's output comes from: `bill` or `intake`."""

ARCHIVE_COLUMNS = (
    "event_type",
    "event_id",
    "ad_id",
    "user_id",
    "event_time",
    "received_ms",
    "topic",
    "partition",
    "offset",
    "value",
    "late",
    "period_start_ms",
    "period",
    "batch_id",
)
"""One row per valid event received, with its raw bytes (`period` is the event time's); partitioned by
event_type, period, batch_id. The first ten come from the job's intake branch."""

RECEIVED_COLUMNS = ARCHIVE_COLUMNS[:10]

FILE_NAME = "part-00000.parquet"


@dataclass(frozen=True)
class BatchOutput:
    """A micro-batch split into what the sink writes; every table carries `batch_id` and its period columns."""

    bills: pa.Table
    """Ledger rows (`billing.store.parquet_ledger.LEDGER_COLUMNS`)."""
    events: pa.Table
    """Archive rows (`ARCHIVE_COLUMNS`)."""
    bad: pa.Table
    """Quarantine rows (`attribution.decode.QUARANTINE_COLUMNS` and `batch_id`)."""
    unbilled: pa.Table
    """Matched clicks without a price at their time (`UNBILLED_ROWS`)."""


UNBILLED_ROWS = (*UNBILLED_COLUMNS, "period_start_ms", "period", "batch_id")
"""The unbilled table's columns; partitioned by period and batch_id."""


def split_batch(
    batch: pa.Table,
    batch_id: int,
    *,
    late_watermark_ms: int,
    billed_at_ms: int,
    periods: Periods,
    ledger_columns: Sequence[str],
    quarantine_columns: Sequence[str],
    catalog: Catalog,
) -> BatchOutput:
    """The ledger, archive, quarantine and unbilled rows of one collected batch; bills priced by `catalog`.

    A valid event is `late` when its watermark time (`watermark_time_ms`) is at or below `late_watermark_ms`, the
    watermark the join used to drop late input rows of this batch (`attribution.job.late_watermark_ms`)."""
    kind = batch.column(KIND)
    priced = price_matches(batch.filter(pc.equal(kind, "bill")), catalog)
    bills = priced.bills
    unbilled = _with_period(priced.unbilled.select(list(UNBILLED_COLUMNS)), "click_time", periods)
    unbilled = unbilled.append_column("batch_id", _constant(batch_id, unbilled.num_rows))
    intake = batch.filter(pc.equal(kind, "intake"))
    valid = pc.is_null(intake.column("reason"))
    events = intake.filter(valid).select(list(RECEIVED_COLUMNS))
    bad = intake.filter(pc.invert(valid))

    bills = _with_period(bills, "click_time", periods)
    bills = bills.append_column("billed_at_ms", _constant(billed_at_ms, bills.num_rows))
    bills = bills.append_column("batch_id", _constant(batch_id, bills.num_rows))
    late = pc.less_equal(watermark_time_ms(events), pa.scalar(late_watermark_ms, pa.int64()))
    events = events.append_column("late", late)
    events = _with_period(events, "event_time", periods)
    events = events.append_column("batch_id", _constant(batch_id, events.num_rows))
    bad = bad.append_column("batch_id", _constant(batch_id, bad.num_rows))
    return BatchOutput(
        bills=bills.select(list(ledger_columns)),
        events=events.select(list(ARCHIVE_COLUMNS)),
        bad=bad.select([*quarantine_columns, "batch_id"]),
        unbilled=unbilled.select(list(UNBILLED_ROWS)),
    )


def bill_totals(bills: pa.Table) -> list[TotalsRow]:
    """Clicks and micros per period and ad of a batch's ledger rows."""
    return [TotalsRow(**row) for row in ledger_totals(bills)]  # type: ignore[arg-type]


def watermark_time_ms(events: pa.Table) -> pa.Array:
    """The time each event counts at for the stream's watermark: the earlier of its event time and the time Kafka
    received it (`attribution.join.watermarked`, here on archive rows)."""
    return pc.min_element_wise(events.column("event_time"), events.column("received_ms"))


def late_counts(events: pa.Table, advertiser_of: Mapping[str, str]) -> list[LateCount]:
    """Late events per period, ad and event type of a batch's archive rows."""
    return [LateCount(*key) for key in _counts_per_ad(events.filter(events.column("late")), advertiser_of)]


def clock_ahead_counts(events: pa.Table, advertiser_of: Mapping[str, str], tolerance_ms: int) -> list[ClockAheadCount]:
    """Events whose time is more than `tolerance_ms` ahead of the time Kafka received them, per period (of the
    event time, as every count), ad and event type of a batch's archive rows."""
    return [ClockAheadCount(*key) for key in _counts_per_ad(clock_ahead(events, tolerance_ms), advertiser_of)]


def clock_ahead(events: pa.Table, tolerance_ms: int) -> pa.Table:
    """The archive rows whose event time is more than `tolerance_ms` ahead of the time Kafka received them."""
    limit = pc.add(events.column("received_ms"), pa.scalar(tolerance_ms, pa.int64()))
    return events.filter(pc.greater(events.column("event_time"), limit))


def quarantine_counts(bad: pa.Table, advertiser_of: Mapping[str, str]) -> list[QuarantineCount]:
    """Bad records per reason, topic and advertiser (when the ad is known) of a batch's quarantine rows."""
    grouped = bad.group_by(["reason", "topic", "ad_id"]).aggregate([([], "count_all")])
    return [
        QuarantineCount(row["reason"], row["topic"], advertiser_of.get(row["ad_id"] or ""), row["count_all"])
        for row in grouped.to_pylist()
    ]


def write_batch_files(
    table: pa.Table, root: Path, partitions: Sequence[str], file_name: str = FILE_NAME, prune: bool = True
) -> list[Path]:
    """`table` as one Parquet file named `file_name` per combination of `partitions` values, under
    `root/k=v/.../`; the files written.

    The partition columns are left out of the files (they are in the paths). A file of the same name is replaced,
    and with `prune` every other Parquet file in a folder written to is removed (`prune_batch_folders`), so
    writing a replayed batch again leaves what one write leaves. Every file and folder written is flushed to disk
    before this returns (`billing.store.durable`): a batch that Spark or Redis counts as done is on disk, whatever
    happens to the machine after."""
    if table.num_rows == 0:
        return []
    parts: list[tuple[pa.Table, Path]] = []
    if not partitions:
        parts.append((table, root))
    else:
        keys = table.select(list(partitions)).group_by(list(partitions)).aggregate([]).to_pylist()
        for key in keys:
            mask = None
            for name, value in key.items():
                match = pc.equal(table.column(name), pa.scalar(value, table.schema.field(name).type))
                mask = match if mask is None else pc.and_(mask, match)
            folder = root.joinpath(*(f"{name}={value}" for name, value in key.items()))
            parts.append((table.filter(mask).drop_columns(list(partitions)), folder))
    moves: list[tuple[Path, Path]] = []
    touched: list[Path] = []
    try:
        for part, folder in parts:
            touched += make_folder(folder)
            staging = folder / f".{file_name}.{os.getpid()}.tmp"
            moves.append((staging, folder / file_name))
            pq.write_table(part, staging, compression="snappy")
        replace_files(moves, touched)
    except BaseException:
        # A failed write (a full disk) leaves no staging file behind: readers skip them, but they hold the room
        # the next attempt needs. Files already renamed into place are replaced when the batch is written again.
        for staging, _ in moves:
            staging.unlink(missing_ok=True)
        raise
    written = [target for _, target in moves]
    if prune:
        prune_batch_folders(written)
    return written


def prune_batch_folders(written: Sequence[Path]) -> list[Path]:
    """Remove every Parquet file, in the folders of `written`, that is not in `written`; the files removed.

    A batch's folders hold the files of its last attempt only: anything else there is from an earlier attempt at
    the same batch (one written by an older version of the job, or with the batch's rows spread otherwise)."""
    keep = set(written)
    removed: list[Path] = []
    for folder in sorted({path.parent for path in written}):
        stale = [other for other in folder.glob("*.parquet") if other not in keep]
        for other in stale:
            other.unlink()
        if stale:
            fsync_folder(folder)
        removed += stale
    return removed


def _counts_per_ad(events: pa.Table, advertiser_of: Mapping[str, str]) -> list[tuple[str, int, str, str, str, int]]:
    """(period, period start, advertiser, ad, event type, events) of archive rows."""
    return _per_ad(_count(events, PER_AD), advertiser_of)


def _per_ad(rows: list[dict[str, Any]], advertiser_of: Mapping[str, str]) -> list[tuple[str, int, str, str, str, int]]:
    """Counts per `PER_AD` as (period, period start, advertiser, ad, event type, events), advertisers named."""
    return [
        (r["period"], r["period_start_ms"], advertiser_of.get(r["ad_id"], ""), r["ad_id"], r["event_type"], r["rows"])
        for r in rows
    ]


def _with_period(table: pa.Table, time_column: str, periods: Periods) -> pa.Table:
    """`table` with `period_start_ms` and `period` (the key) of the epoch-ms column `time_column`."""
    length = pa.scalar(periods.length_ms, pa.int64())
    times = table.column(time_column).cast(pa.int64())
    starts = pc.multiply(pc.divide(times, length), length)  # event times are positive: divide truncates down
    unique = pc.unique(starts).to_pylist()
    names = pa.array([periods.key(start) for start in unique], pa.string())
    keys = pc.take(names, pc.index_in(starts, value_set=pa.array(unique, pa.int64())))
    return table.append_column("period_start_ms", starts).append_column("period", keys)


def _constant(value: int, rows: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.int64()), rows)


FIGURES = pa.schema(
    [
        ("kind", pa.string()),
        ("period", pa.string()),
        ("period_start_ms", pa.int64()),
        ("advertiser_id", pa.string()),
        ("campaign_id", pa.string()),
        ("ad_id", pa.string()),
        ("event_type", pa.string()),
        ("reason", pa.string()),
        ("topic", pa.string()),
        ("path", pa.string()),
        ("rows", pa.int64()),
        ("micros", pa.int64()),
    ]
)
"""What a task that wrote its share of a micro-batch tells the driver, one row per figure (`kind`): `bill`
(clicks as `rows`, and micros, per period and ad), `late` and `clock_ahead` (events per period, ad and type),
`unbilled` (matched clicks without a price, per period, ad and reason),
`quarantine` (records per reason, topic and ad), `archived` (the task's archive rows) and `file` (a file it
wrote). Small: a few rows per ad and period, never one per event."""

FIGURES_DDL = ", ".join(f"{field.name} {'string' if field.type == pa.string() else 'bigint'}" for field in FIGURES)


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one task's share of micro-batch `batch_id` and returns its figures (`FIGURES`); runs on the
    executors, so no event crosses to the driver.

    The task's files are named after its partition (`part-NNNNN.parquet`) in the batch's folders: the rows of a
    micro-batch fall in the same partitions when it is replayed (the join's state partitions by key, the intake
    by Kafka partition), so a replayed task replaces its own file, and the driver prunes what an earlier attempt
    left beside the files of this one (`prune_batch_folders`)."""

    batch_id: int
    late_watermark_ms: int
    billed_at_ms: int
    period_ms: int
    clock_tolerance_ms: int
    ledger_dir: Path
    archive_dir: Path
    quarantine_dir: Path
    ledger_columns: tuple[str, ...]
    quarantine_columns: tuple[str, ...]
    unbilled_dir: Path
    catalog: Catalog
    """The catalog as of the version the batch is priced with (`attribution.job.BatchSink`)."""

    def write(self, batch: pa.Table, partition: int) -> tuple[BatchOutput, pa.Table]:
        """Split `batch` (one task's rows), write its files, and return its output and figures."""
        out = split_batch(
            batch,
            self.batch_id,
            late_watermark_ms=self.late_watermark_ms,
            billed_at_ms=self.billed_at_ms,
            periods=Periods(self.period_ms),
            ledger_columns=self.ledger_columns,
            quarantine_columns=self.quarantine_columns,
            catalog=self.catalog,
        )
        name = f"part-{partition:05d}.parquet"
        files = [
            *write_batch_files(out.bills, self.ledger_dir, ("period", "batch_id"), name, prune=False),
            *write_batch_files(out.events, self.archive_dir, ("event_type", "period", "batch_id"), name, prune=False),
            *write_batch_files(out.bad, self.quarantine_dir, ("batch_id",), name, prune=False),
            *write_batch_files(out.unbilled, self.unbilled_dir, ("period", "batch_id"), name, prune=False),
        ]
        return out, partition_figures(out, files, self.clock_tolerance_ms)


def partition_figures(out: BatchOutput, files: Sequence[Path], clock_tolerance_ms: int) -> pa.Table:
    """The figures (`FIGURES`) of one task's output and files."""
    rows: list[dict[str, object]] = [
        {"kind": "bill", **{k: v for k, v in total.items() if k != "clicks"}, "rows": total["clicks"]}
        for total in ledger_totals(out.bills)
    ]
    late = out.events.filter(out.events.column("late"))
    for kind, events in (("late", late), ("clock_ahead", clock_ahead(out.events, clock_tolerance_ms))):
        rows += [{"kind": kind, **row} for row in _count(events, PER_AD)]
    rows += [{"kind": "quarantine", **row} for row in _count(out.bad, ["reason", "topic", "ad_id"])]
    rows += [{"kind": "unbilled", **row} for row in _count(out.unbilled, UNBILLED_PER_AD)]
    rows.append({"kind": "archived", "rows": out.events.num_rows})
    rows += [{"kind": "file", "path": str(path)} for path in files]
    return pa.Table.from_pylist(rows, schema=FIGURES)


PER_AD = ["period", "period_start_ms", "ad_id", "event_type"]
"""The keys late and clock-ahead events are counted by."""

UNBILLED_PER_AD = ["period", "period_start_ms", "advertiser_id", "ad_id", "reason"]
"""The keys unbilled clicks are counted by: the advertiser is the one the catalog named when the stream priced the
click (none for an ad it did not know), so a count restored later is the count the stream made."""


def unbilled_counts(unbilled: pa.Table) -> list[UnbilledCount]:
    """Matched clicks without a price per period, advertiser, ad and reason."""
    return _unbilled(_count(unbilled, UNBILLED_PER_AD))


def _unbilled(rows: list[dict[str, Any]]) -> list[UnbilledCount]:
    return [
        UnbilledCount(r["period"], r["period_start_ms"], r["advertiser_id"] or "", r["ad_id"], r["reason"], r["rows"])
        for r in rows
    ]


def _count(table: pa.Table, keys: list[str]) -> list[dict[str, Any]]:
    """Rows of `table` per combination of `keys`, as `rows`."""
    if table.num_rows == 0:
        return []
    grouped = table.group_by(keys).aggregate([([], "count_all")])
    return [{**{k: row[k] for k in keys}, "rows": row["count_all"]} for row in grouped.to_pylist()]


@dataclass(frozen=True)
class BatchFigures:
    """A micro-batch's figures summed over its tasks, for Redis and the log (`batch_figures`)."""

    totals: list[TotalsRow]
    late: list[LateCount]
    clock_ahead: list[ClockAheadCount]
    quarantined: list[QuarantineCount]
    unbilled: list[UnbilledCount]
    bills: int
    events: int
    bad: int
    files: list[Path]


def batch_figures(figures: pa.Table, advertiser_of: Mapping[str, str]) -> BatchFigures:
    """The tasks' figures (`FIGURES`) of a micro-batch, summed per key, advertisers named from the catalog."""

    def summed(kind: str, keys: list[str]) -> list[dict[str, Any]]:
        rows = figures.filter(pc.equal(figures.column("kind"), kind))
        if rows.num_rows == 0:
            return []
        grouped = rows.group_by(keys).aggregate([("rows", "sum"), ("micros", "sum")])
        return [
            {**{k: row[k] for k in keys}, "rows": row["rows_sum"], "micros": row["micros_sum"]}
            for row in grouped.to_pylist()
        ]

    keys = ["period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id"]
    totals = [
        TotalsRow(
            r["period"], r["period_start_ms"], r["advertiser_id"], r["campaign_id"], r["ad_id"], r["rows"], r["micros"]
        )
        for r in summed("bill", keys)
    ]

    quarantined = [
        QuarantineCount(r["reason"], r["topic"], advertiser_of.get(r["ad_id"] or ""), r["rows"])
        for r in summed("quarantine", ["reason", "topic", "ad_id"])
    ]
    files = figures.filter(pc.equal(figures.column("kind"), "file")).column("path").to_pylist()
    archived = figures.filter(pc.equal(figures.column("kind"), "archived")).column("rows")
    return BatchFigures(
        totals=totals,
        late=[LateCount(*row) for row in _per_ad(summed("late", PER_AD), advertiser_of)],
        clock_ahead=[ClockAheadCount(*row) for row in _per_ad(summed("clock_ahead", PER_AD), advertiser_of)],
        quarantined=quarantined,
        unbilled=_unbilled(summed("unbilled", UNBILLED_PER_AD)),
        bills=sum(t.clicks for t in totals),
        events=pc.sum(archived).as_py() or 0,
        bad=sum(q.records for q in quarantined),
        files=[Path(path) for path in files],
    )
