"""Redis restored from the data folder, after Redis lost its data: every figure the UI and the API show.

Redis holds nothing that the data folder does not: the billed totals come from the ledger (closed periods from their
exports), the corrections and their lists from the corrections Parquet, the late counts from the archive's `late` flags,
the clock-ahead counts from the archive's event and receipt times, the unbilled counts from the stream's unbilled
table, the quarantine counts from the quarantine table and
the id-conflict files, the closed periods from the exports, the last reconciliation and audit from their records beside
the state file. Only the job's own health records are not restored: the job writes them again on its next batch.

Only the batches the job's checkpoint committed are restored, and the record of the batches applied is set to the
last of them: a batch the job had started when it stopped (its files possibly partial) is replayed by the job when it
starts again, which completes its files and applies it to Redis then. A closed period's compacted files
(`billing.store.compaction`) read as the batch of their folder, the newest they hold: the same rows for any batch the
checkpoint committed since.

The job must not apply a batch meanwhile: `restore_redis` holds the job's lock (`attribution.job_lock`), which the
running job holds (so the restore waits a while for a job stopped a moment ago, then refuses), and the job itself
refuses to decide or apply a batch on a Redis that has lost the record of the batches applied, or holds an older one
(`RedisTotals.batch_day_charged` and `apply_batch(..., applied_through=...)`), so a job left running stops rather
than count half or charge past a budget on day totals that lack the lost batches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from attribution.batch_output import clock_ahead_counts, late_counts, quarantine_counts, unbilled_counts
from attribution.charging import budget_day_counts, not_charged_counts
from attribution.epoch import checkpoint_started, last_committed_batch, newest_batch_id
from attribution.job_lock import FileLock, JobLockedError, stream_lock_name
from attribution.release import release_counts, settled_quarantine
from billing.catalog import Catalog
from billing.corrections import Correction
from billing.export import export_totals
from billing.layout import DataLayout
from billing.money import Amounts
from billing.periods import Periods
from billing.store.columns import schema
from billing.store.compaction import own_batch, read_batch_only, read_listed
from billing.store.corrections_arrow import corrections_from_arrow
from billing.store.database_lock import DatabaseLock
from billing.store.export_files import (
    MANIFEST_FILE,
    exported_not_charged,
    read_export,
    read_manifest,
    read_not_charged,
)
from billing.store.parquet_ledger import ledger_totals, read_ledger
from billing.store.redis_totals import RedisTotals, TotalsRow
from billing.store.released import RECONCILIATION, released_table


class JobRunningError(RuntimeError):
    """The streaming job is running: it must be stopped while Redis is restored."""


@dataclass(frozen=True)
class Restored:
    """What a restore put back."""

    last_batch: int
    billed_clicks: int
    billed_micros_by_currency: Amounts
    corrections: int
    closed_periods: int
    late_events: int
    clock_ahead_events: int
    quarantined: int


RESTORE_WAIT_S = 60.0
"""How long a restore waits for the streaming job to let go of its lock before it refuses: a job stopped a moment
ago lets go when Spark reports the stop."""


def restore_redis(
    data_dir: Path,
    totals: RedisTotals,
    catalog: Catalog,
    periods: Periods,
    query: str,
    wait_s: float = RESTORE_WAIT_S,
    clock_tolerance_ms: int = 60_000,
    database_url: str | None = None,
) -> Restored:
    """Replace every billing figure under the prefix with what the data folder says (see the module's docstring),
    up to the last batch the job's checkpoint committed.

    Holds the job's lock (`attribution.job_lock`) while it works: refuses (JobRunningError) when the job still
    holds it after `wait_s`, and a job started meanwhile waits for the restore."""
    holder = "adbill restore-redis"
    database = DatabaseLock(database_url, stream_lock_name(totals.keys.prefix), holder) if database_url else None
    lock = FileLock(DataLayout(data_dir).job_lock(query), holder, database)
    try:
        lock.acquire(wait_s=wait_s)
    except JobLockedError as exc:
        raise JobRunningError(
            f"the streaming job runs: {exc.holder} holds {exc.path}: stop it first (Ctrl-C, or `adbill down`), "
            "then restore, then start it"
        ) from None
    try:
        return _restore(data_dir, totals, catalog, periods, query, clock_tolerance_ms)
    finally:
        lock.release()


def _restore(
    data_dir: Path, totals: RedisTotals, catalog: Catalog, periods: Periods, query: str, clock_tolerance_ms: int
) -> Restored:
    layout = DataLayout(data_dir)
    totals.wipe_billing()
    advertiser_of = catalog.advertisers_by_ad
    # Up to the last batch the checkpoint committed: a newer batch's files may be partial (the job stopped in the
    # middle of it), and the job replays it and applies it when it starts again. Without a checkpoint, every batch.
    checkpoint = layout.checkpoint(query)
    if checkpoint_started(checkpoint) or layout.epoch_file(query).exists():
        last_batch = last_committed_batch(checkpoint)
    else:
        last_batch = newest_batch_id(data_dir)
    through = -1 if last_batch is None else last_batch
    ledger = read_ledger(layout.ledger)
    ledger = ledger.filter(pc.less_equal(ledger["batch_id"], through)) if ledger.num_rows else ledger
    rows = [TotalsRow(**row) for row in ledger_totals(ledger)]  # type: ignore[arg-type]
    # Records released from quarantine by reconciliation (`attribution.release`) are counted as it counts them, once
    # per record (below); those the stream released, with the batch that released them.
    by_reconciliation = released_table(layout, pc.field("released_by") == RECONCILIATION)
    late = _late_events(layout.archive, through, _coordinates(by_reconciliation))
    ahead = _clock_ahead_events(layout.archive, clock_tolerance_ms, through)
    bad = settled_quarantine(
        layout,
        _quarantine(layout, ["reason", "topic", "partition", "offset", "ad_id"], through),
        through,
    )
    unbilled = _unbilled_clicks(layout.unbilled, through)
    refused = _not_charged_clicks(layout.not_charged, through)
    # Each campaign's day counts the stream's bills, and its not-charged clicks of periods that were open when it
    # made them; a closed period's charged share becomes its export's when the period is closed again below
    # (`RedisTotals.close_period`), as it did live, and what the stream billed after the close is an adjustment,
    # counted with the corrections.
    closed_at = _closed_at(layout.exports)
    if last_batch is not None:
        totals.apply_batch(
            query,
            last_batch,
            rows,
            late=late_counts(late, advertiser_of) if late.num_rows else [],
            quarantined=quarantine_counts(bad, advertiser_of) if bad.num_rows else [],
            clock_ahead=clock_ahead_counts(ahead, advertiser_of, clock_tolerance_ms) if ahead.num_rows else [],
            unbilled=unbilled_counts(unbilled),
            not_charged=not_charged_counts(refused),
            budget_days=budget_day_counts(ledger, _while_open(refused, closed_at)),
        )

    totals.apply_released(
        (key, *release_counts(by_reconciliation.slice(i, 1), advertiser_of, periods))
        for i, key in enumerate(_coordinates(by_reconciliation))
    )
    corrections = _corrections_in_written_order(layout.corrections)
    totals.apply_corrections(corrections, {c.booked_period: periods.parse_key(c.booked_period) for c in corrections})
    conflicts = _table(layout.conflicts, ["topic", "partition", "offset", "ad_id"])
    totals.add_conflicts(
        (f"{r['topic']}/{r['partition']}/{r['offset']}", r["topic"], advertiser_of.get(r["ad_id"] or ""))
        for r in conflicts.to_pylist()
    )
    closed = 0
    exports = layout.exports
    for folder in sorted(exports.iterdir()) if exports.is_dir() else []:
        if not folder.name.startswith(".") and (folder / MANIFEST_FILE).exists():
            totals.close_period(
                folder.name, periods.parse_key(folder.name), export_totals(read_export(folder).to_pylist())
            )
            totals.set_not_charged(
                folder.name,
                periods.parse_key(folder.name),
                exported_not_charged(read_not_charged(folder), read_export(folder), periods.parse_key(folder.name)),
            )
            closed += 1
    if layout.last_run_file.exists():
        totals.record_reconciliation(json.loads(layout.last_run_file.read_text()))
    if layout.last_audit_file.exists():
        totals.record_audit(json.loads(layout.last_audit_file.read_text()))
    return Restored(
        last_batch=through,
        billed_clicks=sum(r.clicks for r in rows),
        billed_micros_by_currency=_micros_by_currency(ledger),
        corrections=len(corrections),
        closed_periods=closed,
        late_events=late.num_rows,
        clock_ahead_events=ahead.num_rows,
        # Records reconciliation released to the archive are counted as quarantined above, and taken off once.
        quarantined=bad.num_rows + conflicts.num_rows - _archived(by_reconciliation),
    )


def _micros_by_currency(ledger: pa.Table) -> Amounts:
    """The ledger's micros added up per currency, never across two."""
    if not ledger.num_rows:
        return Amounts()
    grouped = ledger.group_by("currency").aggregate([("amount_micros", "sum")])
    return Amounts.of_columns(grouped["currency"].to_pylist(), grouped["amount_micros_sum"].to_pylist())


def _table(folder: Path, columns: list[str], where: pc.Expression | None = None) -> pa.Table:
    if not folder.is_dir() or not any(folder.rglob("*.parquet")):
        return pa.table({name: pa.array([], pa.string()) for name in columns})
    return ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=columns, filter=where)


def _quarantine(layout: DataLayout, columns: list[str], through: int) -> pa.Table:
    """`columns` of the quarantine rows of the batches up to `through`, each by its own batch (a compacted file's
    `source_batch_id`; `billing.store.compaction.read_batch_only`: no run lock here, a compaction may be under
    way)."""
    table = read_batch_only(layout.quarantine, columns, own_batch() <= through)
    return pa.table({name: pa.array([], pa.string()) for name in columns}) if table is None else table


def _batch_table(folder: Path, depth: int, columns: list[str], where: pc.Expression) -> pa.Table | None:
    """`columns` of the rows `where` of the Parquet files of the batch folders under `folder` (`depth` levels down),
    hive-partitioned, but for those a compacted file holds (`billing.store.compaction.read_listed`: the restore takes
    no run lock, and a compaction may be under way); None when there is no file."""

    def read(files: list[Path]) -> pa.Table | None:
        if not files:
            return None
        dataset = ds.dataset(
            [str(f) for f in files], format="parquet", partitioning="hive", partition_base_dir=str(folder)
        )
        return dataset.to_table(columns=columns, filter=where)

    return read_listed(folder, depth, read)


def _archived(released: pa.Table) -> int:
    return int(pc.sum(pc.is_null(released.column("reason"))).as_py() or 0)


def _coordinates(table: pa.Table) -> list[str]:
    columns = (table.column(c).to_pylist() for c in ("topic", "partition", "offset"))
    return [f"{t}/{p}/{o}" for t, p, o in zip(*columns, strict=True)]


def _late_events(archive: Path, through: int, leave_out: list[str]) -> pa.Table:
    """The late rows of the archive's batches up to `through`, but for the records at `leave_out`'s coordinates."""
    columns = ["event_type", "period", "period_start_ms", "ad_id"]
    where = pc.field("late") & (pc.field("batch_id") <= through)
    table = _batch_table(archive, 3, [*columns, "late", "topic", "partition", "offset"], where)
    if table is None:
        return pa.table({"late": pa.array([], pa.bool_())})
    if leave_out and table.num_rows:
        gone = set(leave_out)
        table = table.filter(pa.array([key not in gone for key in _coordinates(table)], pa.bool_()))
    table = table.select([*columns, "late"])
    return table.cast(schema([*columns, "late"]))


def _closed_at(exports: Path) -> dict[str, int]:
    """Each closed period's close time, from its export's manifest."""
    return {
        folder.name: read_manifest(folder).closed_at_ms
        for folder in (sorted(exports.iterdir()) if exports.is_dir() else [])
        if not folder.name.startswith(".") and (folder / MANIFEST_FILE).exists()
    }


def _while_open(table: pa.Table, closed_at: dict[str, int]) -> pa.Table:
    """The stream's rows written while their period was open (`billed_at_ms` at or before its close)."""
    if not table.num_rows or not closed_at:
        return table
    keep = [
        closed_at.get(period) is None or billed <= closed_at[period]
        for period, billed in zip(table["period"].to_pylist(), table["billed_at_ms"].to_pylist(), strict=True)
    ]
    return table.filter(pa.array(keep, pa.bool_()))


def _not_charged_clicks(folder: Path, through: int) -> pa.Table:
    """The stream's not-charged clicks (`attribution.charging.NOT_CHARGED_ROWS`) of the batches up to `through`."""
    table = _batch_table(folder, 2, NOT_CHARGED_TABLE_SCHEMA.names, pc.field("batch_id") <= through)
    return NOT_CHARGED_TABLE_SCHEMA.empty_table() if table is None else table.cast(NOT_CHARGED_TABLE_SCHEMA)


NOT_CHARGED_TABLE_SCHEMA = schema(
    ("period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id", "reason", "amount_micros", "billed_at_ms")
)


def _unbilled_clicks(folder: Path, through: int) -> pa.Table:
    """The stream's unbilled clicks, as `unbilled_counts` reads them."""
    unbilled = schema(("period", "period_start_ms", "advertiser_id", "ad_id", "reason"))
    table = _batch_table(folder, 2, unbilled.names, pc.field("batch_id") <= through)
    return unbilled.empty_table() if table is None else table.cast(unbilled)


def _clock_ahead_events(archive: Path, tolerance_ms: int, through: int) -> pa.Table:
    """The archived events more than `tolerance_ms` ahead of their receipt, as `clock_ahead_counts` reads them."""
    columns = ["event_type", "period", "period_start_ms", "ad_id", "event_time", "received_ms"]
    ahead = pc.field("event_time") > pc.field("received_ms") + tolerance_ms
    table = _batch_table(archive, 3, columns, ahead & (pc.field("batch_id") <= through))
    if table is None:
        return pa.table({name: pa.array([], pa.int64()) for name in columns})
    return table.cast(schema(columns))


def _corrections_in_written_order(folder: Path) -> list[Correction]:
    """Every correction, run by run and period by period, each file's rows in their order: the order in which
    reconciliation applied them, so each advertiser's list comes back in the same order."""
    files = []
    for path in folder.glob("period=*/run-*.parquet") if folder.is_dir() else []:
        run_started = int(path.stem.removeprefix("run-").split("-")[0])
        files.append((run_started, path.parent.name, path))
    out: list[Correction] = []
    for _, _, path in sorted(files):
        out += corrections_from_arrow(pq.read_table(path))
    return out
