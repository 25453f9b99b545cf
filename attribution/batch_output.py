"""One micro-batch's intake, as Arrow tables: the archive and quarantine rows, their Parquet files and the figures
Redis is given (late, clock-ahead and quarantine counts), and the batch's matched clicks and valid clicks handed on
to the driver's charging step (`attribution.charging`). Pure pyarrow: no Spark, no services.

In: a task's share of the job's output, as `BatchSink` hands it to `PartitionWriter` on an executor (rows of
`KIND` `bill` with the matched clicks' columns, rows of `KIND` `intake` with the archive's columns and a `reason`
that is null for a valid event). Out: `BatchOutput` (`split_batch`), written with `write_batch_files`, one file per
task and folder (`part-TTTTT.parquet`, TTTTT the task's partition), and the task's figures (`FIGURES`), which the
driver sums (`batch_figures`):

- archive: `ARCHIVE/event_type=T/period=P/batch_id=N/part-TTTTT.parquet`, one row per valid event received,
  `late` when the streaming join's watermark kept it out;
- quarantine: `QUARANTINE/batch_id=N/part-TTTTT.parquet`, one row per bad record;
- the matched clicks (`kind` `bill`) and every valid click's id, ad, user and time (`kind` `click`), as rows of
  the figures: the driver prices, judges and charges them (`attribution.charging`), so that each campaign's budget
  and each user's recent clicks are seen whole, and writes the ledger, `unbilled/` and `not_charged/`.

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

from billing.periods import Periods
from billing.store.archive import ARCHIVE_COLUMNS
from billing.store.columns import schema
from billing.store.durable import fsync_folder, make_folder, replace_files
from billing.store.parquet_ledger import ledger_totals
from billing.store.redis_totals import ClockAheadCount, LateCount, QuarantineCount, TotalsRow, UnbilledCount

KIND = "kind"
"""Which branch a row of the job's output comes from: `bill` or `intake`."""

RECEIVED_COLUMNS = ARCHIVE_COLUMNS[:12]
"""The archive's columns that come from the job's intake branch."""

FILE_NAME = "part-00000.parquet"


@dataclass(frozen=True)
class BatchOutput:
    """A task's share of a micro-batch split into what it writes and hands on; archive and quarantine rows carry
    `batch_id` (and the archive its period columns)."""

    bills: pa.Table
    """Matched clicks (`BILL_COLUMNS`), to be charged on the driver."""
    events: pa.Table
    """Archive rows (`ARCHIVE_COLUMNS`)."""
    bad: pa.Table
    """Quarantine rows (`attribution.decode.QUARANTINE_COLUMNS` and `batch_id`)."""

    @property
    def clicks(self) -> pa.Table:
        """The valid clicks' ids, ads, users and times (`CLICK_KEYS`), for the invalid traffic rules."""
        clicks = self.events.filter(pc.equal(self.events.column("event_type"), "click"))
        return clicks.select(["event_id", "ad_id", "user_id", "event_time"]).rename_columns(list(CLICK_KEYS))


MATCHED_CLICK_COLUMNS = (
    "click_id",
    "impression_id",
    "ad_id",
    "user_id",
    "click_time",
    "impression_time",
    "click_received_ms",
)
"""A matched click's ids and times (epoch ms): `attribution.join.MATCH_COLUMNS` without its timestamp."""

BILL_COLUMNS = (*MATCHED_CLICK_COLUMNS, "ip", "user_agent")
"""A matched click as the job hands it to the sink: `MATCHED_CLICK_COLUMNS`, the click's `ip` and `user_agent`
(matched against the crawler list by the driver's charging step)."""

CLICK_KEYS = ("click_id", "ad_id", "user_id", "event_time")
"""What the invalid traffic rules read of every valid click (`attribution.charging.CLICK_KEY_COLUMNS`)."""


def split_batch(
    batch: pa.Table,
    batch_id: int,
    *,
    late_watermark_ms: int,
    periods: Periods,
    quarantine_columns: Sequence[str],
) -> BatchOutput:
    """The matched clicks, archive and quarantine rows of one task's share of a batch.

    A valid event is `late` when its watermark time (`watermark_time_ms`) is at or below `late_watermark_ms`, the
    watermark the join used to drop late input rows of this batch (`attribution.job.late_watermark_ms`)."""
    kind = batch.column(KIND)
    bills = batch.filter(pc.equal(kind, "bill")).select(list(BILL_COLUMNS))
    intake = batch.filter(pc.equal(kind, "intake"))
    valid = pc.is_null(intake.column("reason"))
    events = intake.filter(valid).select(list(RECEIVED_COLUMNS))
    bad = intake.filter(pc.invert(valid))
    late = pc.less_equal(watermark_time_ms(events), pa.scalar(late_watermark_ms, pa.int64()))
    events = events.append_column("late", late)
    events = with_period(events, "event_time", periods)
    events = events.append_column("batch_id", constant_column(batch_id, events.num_rows))
    bad = bad.append_column("batch_id", constant_column(batch_id, bad.num_rows))
    return BatchOutput(
        bills=bills,
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


def with_period(table: pa.Table, time_column: str, periods: Periods) -> pa.Table:
    """`table` with `period_start_ms` and `period` (the key) of the epoch-ms column `time_column`."""
    length = pa.scalar(periods.length_ms, pa.int64())
    times = table.column(time_column).cast(pa.int64())
    starts = pc.multiply(pc.divide(times, length), length)  # event times are positive: divide truncates down
    unique = pc.unique(starts).to_pylist()
    names = pa.array([periods.key(start) for start in unique], pa.string())
    keys = pc.take(names, pc.index_in(starts, value_set=pa.array(unique, pa.int64())))
    return table.append_column("period_start_ms", starts).append_column("period", keys)


def constant_column(value: int, rows: int) -> pa.Array:
    """`value` in each of `rows` rows, as int64."""
    return pa.repeat(pa.scalar(value, pa.int64()), rows)


FIGURES = schema(
    (
        "kind", "period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id", "event_type", "reason", "topic",
        "path", "rows", "micros", "click_id", "impression_id", "user_id", "click_time", "impression_time",
        "click_received_ms", "ip", "user_agent",
    )
)  # fmt: skip
"""What a task that wrote its share of a micro-batch tells the driver, one row per figure (`kind`): `late` and
`clock_ahead` (events per period, ad and type), `quarantine` (records per reason, topic and ad), `archived` (the
task's archive rows), `file` (a file it wrote); and what the driver charges: `bill` (one matched click, in the
`BILL_COLUMNS`) and `click` (one valid click's `CLICK_KEYS`, its time as `click_time`). The figures are a few rows
per ad and period; the clicks are a few columns each."""

_DDL_TYPES = {pa.string(): "string", pa.int64(): "bigint", pa.bool_(): "boolean"}
FIGURES_DDL = ", ".join(f"{field.name} {_DDL_TYPES[field.type]}" for field in FIGURES)


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one task's share of micro-batch `batch_id` (archive, quarantine) and returns its figures (`FIGURES`)
    with its matched and valid clicks; runs on the executors, so no event's bytes cross to the driver.

    The task's files are named after its partition (`part-NNNNN.parquet`) in the batch's folders: the rows of a
    micro-batch fall in the same partitions when it is replayed (the intake by Kafka partition), so a replayed task
    replaces its own file, and the driver prunes what an earlier attempt left beside the files of this one
    (`prune_batch_folders`)."""

    batch_id: int
    late_watermark_ms: int
    period_ms: int
    clock_tolerance_ms: int
    archive_dir: Path
    quarantine_dir: Path
    quarantine_columns: tuple[str, ...]

    def write(self, batch: pa.Table, partition: int) -> tuple[BatchOutput, pa.Table]:
        """Split `batch` (one task's rows), write its files, and return its output and figures."""
        out = split_batch(
            batch,
            self.batch_id,
            late_watermark_ms=self.late_watermark_ms,
            periods=Periods(self.period_ms),
            quarantine_columns=self.quarantine_columns,
        )
        name = f"part-{partition:05d}.parquet"
        files = [
            *write_batch_files(out.events, self.archive_dir, ("event_type", "period", "batch_id"), name, prune=False),
            *write_batch_files(out.bad, self.quarantine_dir, ("batch_id",), name, prune=False),
        ]
        return out, partition_figures(out, files, self.clock_tolerance_ms)


def partition_figures(out: BatchOutput, files: Sequence[Path], clock_tolerance_ms: int) -> pa.Table:
    """The figures (`FIGURES`) of one task's output and files, with its matched and valid clicks."""
    rows: list[dict[str, object]] = []
    late = out.events.filter(out.events.column("late"))
    for kind, events in (("late", late), ("clock_ahead", clock_ahead(out.events, clock_tolerance_ms))):
        rows += [{"kind": kind, **row} for row in _count(events, PER_AD)]
    rows += [{"kind": "quarantine", **row} for row in _count(out.bad, ["reason", "topic", "ad_id"])]
    rows.append({"kind": "archived", "rows": out.events.num_rows})
    rows += [{"kind": "file", "path": str(path)} for path in files]
    counts = pa.Table.from_pylist(rows, schema=FIGURES)
    bills = out.bills.append_column("kind", pa.repeat(pa.scalar("bill"), out.bills.num_rows))
    clicks = out.clicks.rename_columns(["click_id", "ad_id", "user_id", "click_time"])
    clicks = clicks.append_column("kind", pa.repeat(pa.scalar("click"), clicks.num_rows))
    return pa.concat_tables([counts, _as_figures(bills), _as_figures(clicks)])


def _as_figures(table: pa.Table) -> pa.Table:
    """`table` with every column of `FIGURES` (nulls where it has none), in their order and types."""
    columns = []
    for field in FIGURES:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=FIGURES)


PER_AD = ["period", "period_start_ms", "ad_id", "event_type"]
"""The keys late and clock-ahead events are counted by."""

UNBILLED_PER_AD = ["period", "period_start_ms", "advertiser_id", "ad_id", "reason"]
"""The keys unbilled clicks are counted by: the advertiser is the one the catalog named when the stream priced the
click (none for an ad it did not know), so a count restored later is the count the stream made (`restore`)."""


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
    """A micro-batch's intake figures summed over its tasks, and its matched and valid clicks (`batch_figures`)."""

    late: list[LateCount]
    clock_ahead: list[ClockAheadCount]
    quarantined: list[QuarantineCount]
    events: int
    bad: int
    files: list[Path]
    bills: pa.Table
    """The matched clicks (`BILL_COLUMNS`)."""
    clicks: pa.Table
    """The valid clicks (`CLICK_KEYS`)."""


def batch_figures(figures: pa.Table, advertiser_of: Mapping[str, str]) -> BatchFigures:
    """The tasks' figures (`FIGURES`) of a micro-batch, summed per key, advertisers named from the catalog."""
    kinds = figures.column("kind")

    def summed(kind: str, keys: list[str]) -> list[dict[str, Any]]:
        rows = figures.filter(pc.equal(kinds, kind))
        if rows.num_rows == 0:
            return []
        grouped = rows.group_by(keys).aggregate([("rows", "sum")])
        return [{**{k: row[k] for k in keys}, "rows": row["rows_sum"]} for row in grouped.to_pylist()]

    quarantined = [
        QuarantineCount(r["reason"], r["topic"], advertiser_of.get(r["ad_id"] or ""), r["rows"])
        for r in summed("quarantine", ["reason", "topic", "ad_id"])
    ]
    files = figures.filter(pc.equal(kinds, "file")).column("path").to_pylist()
    archived = figures.filter(pc.equal(kinds, "archived")).column("rows")
    clicks = figures.filter(pc.equal(kinds, "click")).select(["click_id", "ad_id", "user_id", "click_time"])
    return BatchFigures(
        late=[LateCount(*row) for row in _per_ad(summed("late", PER_AD), advertiser_of)],
        clock_ahead=[ClockAheadCount(*row) for row in _per_ad(summed("clock_ahead", PER_AD), advertiser_of)],
        quarantined=quarantined,
        events=pc.sum(archived).as_py() or 0,
        bad=sum(q.records for q in quarantined),
        files=[Path(path) for path in files],
        bills=figures.filter(pc.equal(kinds, "bill")).select(list(BILL_COLUMNS)),
        clicks=clicks.rename_columns(list(CLICK_KEYS)),
    )
