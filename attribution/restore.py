"""Redis restored from the data folder, after Redis lost its data: every figure the UI and the API show.

Redis holds nothing that the data folder does not: the billed totals come from the ledger (closed periods from their
exports), the corrections and their lists from the corrections Parquet, the late counts from the archive's `late` flags,
the clock-ahead counts from the archive's event and receipt times, the unbilled counts from the stream's unbilled
table, the quarantine counts from the quarantine table and
the id-conflict files, the closed periods from the exports, the last reconciliation and audit from their records beside
the state file. Only the job's own health records are not restored: the job writes them again on its next batch.

The job must not apply a batch meanwhile: `restore_redis` refuses while it reports (its heartbeat) or its checkpoint
moves, and the job itself refuses to apply a batch to a Redis that has lost the record of the batches applied
(`RedisTotals.apply_batch(..., require_history=True)`), so a job left running stops rather than count half.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from attribution.batch_output import clock_ahead_counts, late_counts, quarantine_counts, unbilled_counts
from attribution.epoch import newest_batch_id
from attribution.release import without_released
from billing.catalog import Catalog
from billing.corrections import Correction
from billing.export import export_totals
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.corrections_arrow import corrections_from_arrow
from billing.store.durable import make_folder, replace_files
from billing.store.export_files import MANIFEST_FILE, read_export
from billing.store.parquet_ledger import ledger_totals, read_ledger
from billing.store.redis_totals import RedisTotals, TotalsRow


class JobRunningError(RuntimeError):
    """The streaming job is running: it must be stopped while Redis is restored."""


@dataclass(frozen=True)
class Restored:
    """What a restore put back."""

    last_batch: int
    billed_clicks: int
    billed_micros: int
    corrections: int
    closed_periods: int
    late_events: int
    clock_ahead_events: int
    quarantined: int


def job_activity(data_dir: Path, totals: RedisTotals, query: str, quiet_ms: int, now_ms: int) -> str | None:
    """Why the job looks alive (None: it does not): a heartbeat or a checkpoint file newer than `quiet_ms`."""
    beat = totals.client.get(totals.keys.heartbeat(query))
    if beat is not None and now_ms - int(str(beat)) < quiet_ms:
        return f"the streaming job reported {(now_ms - int(str(beat))) / 1000:.0f} s ago"
    checkpoint = DataLayout(data_dir).checkpoint(query)
    for folder in (checkpoint / "offsets", checkpoint / "commits"):
        newest = max((p.stat().st_mtime for p in folder.iterdir()), default=0.0) if folder.is_dir() else 0.0
        if now_ms - newest * 1000 < quiet_ms:
            return f"the streaming job's checkpoint changed {(now_ms - newest * 1000) / 1000:.0f} s ago"
    return None


def restore_redis(
    data_dir: Path,
    totals: RedisTotals,
    catalog: Catalog,
    periods: Periods,
    query: str,
    quiet_ms: int = 30_000,
    wait_for_heartbeat_s: float = 12.0,
    clock_tolerance_ms: int = 60_000,
) -> Restored:
    """Replace every billing figure under the prefix with what the data folder says (see the module's docstring).

    Refuses (JobRunningError) while the job is running. A Redis that lost its data has lost the heartbeat too, so
    it first waits `wait_for_heartbeat_s` for one (a running job beats at least every 10 s, idle or not)."""
    deadline = time.monotonic() + wait_for_heartbeat_s
    while True:
        why = job_activity(data_dir, totals, query, quiet_ms, int(time.time() * 1000))
        if why is not None:
            raise JobRunningError(f"{why}: stop it first (Ctrl-C, or `adbill down`), then restore, then start it")
        if totals.client.exists(totals.keys.heartbeat(query)) or time.monotonic() >= deadline:
            break
        time.sleep(1.0)

    layout = DataLayout(data_dir)
    totals.wipe_billing()
    advertiser_of = {ad.ad_id: ad.advertiser_id for ad in catalog}
    ledger = read_ledger(layout.ledger)
    rows = [TotalsRow(**row) for row in ledger_totals(ledger)]  # type: ignore[arg-type]
    late = _late_events(layout.archive)
    ahead = _clock_ahead_events(layout.archive, clock_tolerance_ms)
    # A record released from quarantine (its schema id became known: `attribution.release`) is counted no more.
    bad = without_released(layout, _table(layout.quarantine, ["reason", "topic", "partition", "offset", "ad_id"]))
    unbilled = _unbilled_clicks(layout.unbilled)
    last_batch = max(newest_batch_id(data_dir) or -1, 0)
    totals.apply_batch(
        query,
        last_batch,
        rows,
        late=late_counts(late, advertiser_of) if late.num_rows else [],
        quarantined=quarantine_counts(bad, advertiser_of) if bad.num_rows else [],
        clock_ahead=clock_ahead_counts(ahead, advertiser_of, clock_tolerance_ms) if ahead.num_rows else [],
        unbilled=unbilled_counts(unbilled),
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
            closed += 1
    if layout.last_run_file.exists():
        totals.record_reconciliation(json.loads(layout.last_run_file.read_text()))
    if layout.last_audit_file.exists():
        totals.record_audit(json.loads(layout.last_audit_file.read_text()))
    return Restored(
        last_batch=last_batch,
        billed_clicks=sum(r.clicks for r in rows),
        billed_micros=sum(r.micros for r in rows),
        corrections=len(corrections),
        closed_periods=closed,
        late_events=late.num_rows,
        clock_ahead_events=ahead.num_rows,
        quarantined=bad.num_rows + conflicts.num_rows,
    )


def save_record(path: Path, record: dict[str, object]) -> None:
    """Keep a reconciliation or audit record (`DataLayout.last_run_file`, `last_audit_file`): written, flushed,
    renamed into place."""
    touched = make_folder(path.parent)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1, default=str))
    replace_files([(temporary, path)], touched)


def _table(folder: Path, columns: list[str]) -> pa.Table:
    if not folder.is_dir() or not any(folder.rglob("*.parquet")):
        return pa.table({name: pa.array([], pa.string()) for name in columns})
    return ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=columns)


def _late_events(archive: Path) -> pa.Table:
    columns = ["event_type", "period", "period_start_ms", "ad_id"]
    if not archive.is_dir() or not any(archive.rglob("*.parquet")):
        return pa.table({"late": pa.array([], pa.bool_())})
    dataset = ds.dataset(archive, format="parquet", partitioning="hive")
    table = dataset.to_table(columns=[*columns, "late"], filter=pc.field("late"))
    return table.cast(
        pa.schema([("event_type", pa.string()), ("period", pa.string()), ("period_start_ms", pa.int64()),
                   ("ad_id", pa.string()), ("late", pa.bool_())])
    )  # fmt: skip


def _unbilled_clicks(folder: Path) -> pa.Table:
    """The stream's unbilled clicks, as `unbilled_counts` reads them."""
    schema = pa.schema(
        [("period", pa.string()), ("period_start_ms", pa.int64()), ("advertiser_id", pa.string()),
         ("ad_id", pa.string()), ("reason", pa.string())]
    )  # fmt: skip
    if not folder.is_dir() or not any(folder.rglob("*.parquet")):
        return schema.empty_table()
    dataset = ds.dataset(folder, format="parquet", partitioning="hive")
    return dataset.to_table(columns=schema.names).cast(schema)


def _clock_ahead_events(archive: Path, tolerance_ms: int) -> pa.Table:
    """The archived events more than `tolerance_ms` ahead of their receipt, as `clock_ahead_counts` reads them."""
    columns = ["event_type", "period", "period_start_ms", "ad_id", "event_time", "received_ms"]
    if not archive.is_dir() or not any(archive.rglob("*.parquet")):
        return pa.table({name: pa.array([], pa.int64()) for name in columns})
    dataset = ds.dataset(archive, format="parquet", partitioning="hive")
    ahead = pc.field("event_time") > pc.field("received_ms") + tolerance_ms
    table = dataset.to_table(columns=columns, filter=ahead)
    return table.cast(
        pa.schema([("event_type", pa.string()), ("period", pa.string()), ("period_start_ms", pa.int64()),
                   ("ad_id", pa.string()), ("event_time", pa.int64()), ("received_ms", pa.int64())])
    )  # fmt: skip


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
