"""One micro-batch's output, as Arrow tables on the driver: the ledger, archive and quarantine rows, their Parquet
files and the figures Redis is given (totals; late, clock-ahead and quarantine counts). Pure pyarrow: no Spark, no
services.

In: the batch as `BatchSink` collects it (`DataFrame.toArrow()` of the job's output: rows of `KIND` `bill` with
the billable columns, rows of `KIND` `intake` with the archive's columns and a `reason` that is null for a valid
event). Out: `BatchOutput` (`split_batch`), written with `write_batch_files`:

- ledger: `LEDGER/period=P/batch_id=N/part-00000.parquet`, one row per billed click;
- archive: `ARCHIVE/event_type=T/period=P/batch_id=N/part-00000.parquet`, one row per valid event received,
  `late` when the streaming join's watermark kept it out;
- quarantine: `QUARANTINE/batch_id=N/part-00000.parquet`, one row per bad record.

Partition columns live in the paths only (hive style), as Spark writes them, so pyarrow, DuckDB and Spark read
the same tables. Each file is written under a dot-name in its folder, flushed to disk and renamed into place, and
its folder flushed: readers skip dot files, a crash leaves no half file, a power loss no missing one, and a
replayed batch replaces its files with the same names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.periods import Periods
from billing.store.durable import fsync_folder, make_folder, replace_files
from billing.store.parquet_ledger import ledger_totals
from billing.store.redis_totals import ClockAheadCount, LateCount, QuarantineCount, TotalsRow

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


def split_batch(
    batch: pa.Table,
    batch_id: int,
    *,
    late_watermark_ms: int,
    billed_at_ms: int,
    periods: Periods,
    ledger_columns: Sequence[str],
    quarantine_columns: Sequence[str],
) -> BatchOutput:
    """The ledger, archive and quarantine rows of one collected batch.

    A valid event is `late` when its watermark time (`watermark_time_ms`) is at or below `late_watermark_ms`, the
    watermark the join used to drop late input rows of this batch (`attribution.job.late_watermark_ms`)."""
    kind = batch.column(KIND)
    bills = batch.filter(pc.equal(kind, "bill"))
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
    limit = pc.add(events.column("received_ms"), pa.scalar(tolerance_ms, pa.int64()))
    ahead = events.filter(pc.greater(events.column("event_time"), limit))
    return [ClockAheadCount(*key) for key in _counts_per_ad(ahead, advertiser_of)]


def quarantine_counts(bad: pa.Table, advertiser_of: Mapping[str, str]) -> list[QuarantineCount]:
    """Bad records per reason, topic and advertiser (when the ad is known) of a batch's quarantine rows."""
    grouped = bad.group_by(["reason", "topic", "ad_id"]).aggregate([([], "count_all")])
    return [
        QuarantineCount(row["reason"], row["topic"], advertiser_of.get(row["ad_id"] or ""), row["count_all"])
        for row in grouped.to_pylist()
    ]


def write_batch_files(table: pa.Table, root: Path, partitions: Sequence[str]) -> list[Path]:
    """`table` as one Parquet file per combination of `partitions` values, under `root/k=v/.../`; the files written.

    The partition columns are left out of the files (they are in the paths). The Parquet files already in a
    folder written to are replaced, so writing a replayed batch again leaves what one write leaves. Every file
    and folder written is flushed to disk before this returns (`billing.store.durable`): a batch that Spark or Redis
    counts as done is on disk, whatever happens to the machine after."""
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
    for part, folder in parts:
        touched += make_folder(folder)
        staging = folder / f".{FILE_NAME}.{os.getpid()}.tmp"
        pq.write_table(part, staging, compression="snappy")
        moves.append((staging, folder / FILE_NAME))
    replace_files(moves, touched)
    # A batch's folder holds its one file: anything else there is from an earlier attempt at the same batch
    # (one written by an older version of the job, under another name).
    for _, folder in parts:
        stale = [other for other in folder.glob("*.parquet") if other.name != FILE_NAME]
        for other in stale:
            other.unlink()
        if stale:
            fsync_folder(folder)
    return [target for _, target in moves]


def _counts_per_ad(events: pa.Table, advertiser_of: Mapping[str, str]) -> list[tuple[str, int, str, str, str, int]]:
    """(period, period start, advertiser, ad, event type, events) of archive rows."""
    grouped = events.group_by(["period", "period_start_ms", "ad_id", "event_type"]).aggregate([([], "count_all")])
    return [
        (
            row["period"],
            row["period_start_ms"],
            advertiser_of[row["ad_id"]],
            row["ad_id"],
            row["event_type"],
            row["count_all"],
        )
        for row in grouped.to_pylist()
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
