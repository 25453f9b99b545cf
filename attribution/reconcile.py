"""Reconciliation: the rule applied to every event received, compared with the stream's ledger, as corrections;
closed periods and their finance exports.

A Spark batch job over the archive the stream writes (`ARCHIVE/event_type=T/period=P/batch_id=N/`), one run at
a time (`run_lock`). A period past its lateness horizon closes only once the streaming job is alive and has read
what Kafka held when the horizon passed (`billing.closing.plan_run`, with the job's position from
`attribution.stream_position`); until then it is held, and the run says why. For each due period, oldest first:

1. the final bill: the archived impressions of the period and of the one before it (a click may be attributed
   to an impression up to 10 s earlier) and the clicks of the period, de-duplicated by first arrival, through
   the same `attribute()` as the stream (`attribution.join`); id conflicts are quarantined;
2. the new corrections (`billing.corrections.reconcile_period`) against the period's ledger and earlier
   corrections, written as one Parquet file per period and run (`CORRECTIONS/period=P/run-ID.parquet`, renamed
   into place), then applied to Redis once per correction id; the invariant is checked before anything is
   written (`check_reconciled`);
3. an open period is closed: its export is written (`billing.store.export_files.write_export`, never rewritten
   after), the period is marked closed in Redis (its totals become the export's) and in the state file. A closed
   period that got new data is compared with what finance was given, its export plus the adjustments booked for it
   since, and what differs is booked in the current open period (a bill the stream made after the close:
   `billed_after_close`).

A run killed at any point is completed by the next: an export folder closes its period whatever the state file
says, Redis is closed from the export when it does not know the period as closed, and corrections already written
are applied to Redis once per id.

Running it again with no new data writes nothing: corrections have deterministic ids and `reconcile_period`
returns only what is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from attribution.dead_letters import HEADERS, DeadLetters, DeliveryError
from attribution.job import BILLING_QUERY, period_columns
from attribution.join import attribute, catalog_frame, conflicts, dedupe
from attribution.restore import LAST_RUN_FILE, save_record
from attribution.stream_position import stream_position
from billing.catalog import Catalog
from billing.closing import PeriodState, StreamPosition, open_period, plan_run
from billing.corrections import ArrivalFacts, Correction, check_reconciled, reconcile_period
from billing.export import build_export, export_totals
from billing.periods import Periods
from billing.rule import BILLABLE_FIELDS
from billing.store.corrections_arrow import corrections_from_arrow, corrections_to_arrow
from billing.store.durable import make_folder, replace_files
from billing.store.export_files import (
    MANIFEST_FILE,
    export_folder,
    export_table,
    exported_bills,
    read_export,
    read_manifest,
    write_export,
)
from billing.store.parquet_ledger import read_ledger
from billing.store.period_states import load_states, save_states
from billing.store.redis_totals import RedisTotals

log = logging.getLogger(__name__)

CONFLICTS_SEND_TIMEOUT_S = 30.0
"""How long a run waits for Kafka to take the id conflicts it sends to the quarantine topic."""


@dataclass(frozen=True)
class ReconcileConfig:
    """Where reconciliation reads and writes, and its clock rules."""

    data_dir: Path
    redis_url: str
    redis_prefix: str
    kafka_bootstrap: str = "127.0.0.1:9092"
    topics: tuple[str, ...] = ("impressions", "clicks")
    """The topics the billing query reads: a period closes once the query has read what they held."""
    topic_quarantine: str = "quarantine"
    """The dead-letter topic: id conflicts are sent there, once each (`_send_conflicts`)."""
    redis_timeout_ms: int = 5_000
    """Deadline of one Redis call, tried again a few times before the run fails
    (`billing.store.redis_totals.connect`)."""
    period_ms: int = 3_600_000
    horizon_ms: int = 900_000
    """How long after a period's end late data is waited for before the period is reconciled and closed."""
    alive_within_ms: int = 120_000
    """A streaming job silent for longer than this is down, and holds the periods it has not passed."""

    @property
    def checkpoint(self) -> Path:
        return self.data_dir / "checkpoints" / BILLING_QUERY

    def position(self) -> StreamPosition:
        """Where the streaming job stands now (its checkpoint, Kafka's end offsets, its heartbeat)."""
        return stream_position(
            self.checkpoint,
            self.kafka_bootstrap,
            list(self.topics),
            self.redis_url,
            self.redis_prefix,
            BILLING_QUERY,
            self.alive_within_ms,
        )

    @property
    def archive_dir(self) -> Path:
        return self.data_dir / "archive"

    @property
    def ledger_dir(self) -> Path:
        return self.data_dir / "ledger"

    @property
    def corrections_dir(self) -> Path:
        return self.data_dir / "corrections"

    @property
    def conflicts_dir(self) -> Path:
        return self.data_dir / "conflicts"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "reconcile" / "periods.json"

    @property
    def conflicts_sent_file(self) -> Path:
        """The id conflicts already on the quarantine topic: period -> `topic/partition/offset` of each."""
        return self.data_dir / "reconcile" / "conflicts-sent.json"


@dataclass
class RunReport:
    """What one run did."""

    run_id: str
    started_at_ms: int
    periods: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    additions: int = 0
    retractions: int = 0
    net_micros: int = 0
    conflicts: int = 0
    conflicts_sent: int = 0
    """Id conflicts sent to the quarantine topic by this run."""
    conflicts_unsent: int = 0
    """Id conflicts that are not on the quarantine topic yet (Kafka refused them or did not answer); the next run
    sends them."""
    final_clicks: int = 0
    events: int = 0
    held: dict[str, str] = field(default_factory=dict)
    """Periods past their horizon that the stream has not passed yet, with the reason."""
    finished_at_ms: int = 0

    @property
    def duration_ms(self) -> int:
        return self.finished_at_ms - self.started_at_ms

    def record(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "started_at_ms": self.started_at_ms,
            "finished_at_ms": self.finished_at_ms,
            "duration_ms": self.duration_ms,
            "periods": self.periods,
            "closed": self.closed,
            "additions": self.additions,
            "retractions": self.retractions,
            "net_micros": self.net_micros,
            "conflicts": self.conflicts,
            "conflicts_sent": self.conflicts_sent,
            "conflicts_unsent": self.conflicts_unsent,
            "final_clicks": self.final_clicks,
            "events": self.events,
            "held": self.held,
        }


def data_versions(config: ReconcileConfig, periods: Periods) -> dict[str, int]:
    """Per period with data, the largest micro-batch id of the files that can change its bill: its clicks and
    impressions, the impressions of the period before it, and its ledger."""
    newest: dict[tuple[str, str], int] = defaultdict(lambda: -1)
    bases = {
        "click": config.archive_dir / "event_type=click",
        "impression": config.archive_dir / "event_type=impression",
        "ledger": config.ledger_dir,
    }
    for kind, base in bases.items():
        for period_dir in base.glob("period=*") if base.exists() else []:
            period = period_dir.name.removeprefix("period=")
            for batch_dir in period_dir.glob("batch_id=*"):
                batch = int(batch_dir.name.removeprefix("batch_id="))
                newest[(kind, period)] = max(newest[(kind, period)], batch)
    versions: dict[str, int] = {}
    for (kind, period), batch in newest.items():
        touched = [period]
        if kind == "impression":
            touched.append(periods.key(periods.parse_key(period) + periods.length_ms))
        for p in touched:
            if kind == "impression" and p != period and (("click", p) not in newest and ("ledger", p) not in newest):
                continue  # impressions alone do not make the next period exist
            versions[p] = max(versions.get(p, -1), batch)
    return versions


def final_bills(
    spark: SparkSession, config: ReconcileConfig, due: list[str], catalog: DataFrame
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(final billable clicks of the due periods with their `period`, id-conflict quarantine rows with their
    `event_type` and event `period`, late events' `event_type` and `event_id`)."""
    periods = Periods(config.period_ms)
    previous = {periods.key(periods.parse_key(p) - periods.length_ms) for p in due}
    archive = spark.read.option("basePath", str(config.archive_dir)).parquet(str(config.archive_dir))
    events = archive.filter(
        ((F.col("event_type") == "click") & F.col("period").isin(*due))
        | ((F.col("event_type") == "impression") & F.col("period").isin(*(set(due) | previous)))
    ).withColumn("event_ts", F.timestamp_millis(F.col("event_time")))
    columns = ["ad_id", "user_id", "event_time", "event_ts", "received_ms", "topic", "partition", "offset", "value"]
    impressions = events.filter(F.col("event_type") == "impression").select(
        F.col("event_id").alias("impression_id"), *columns
    )
    clicks = events.filter(F.col("event_type") == "click").select(F.col("event_id").alias("click_id"), *columns)
    quarantined = (
        conflicts(impressions, "impression_id")
        .withColumn("event_type", F.lit("impression"))
        .unionByName(conflicts(clicks, "click_id").withColumn("event_type", F.lit("click")))
        .select("*", period_columns(F.col("event_time"), config.period_ms)[1])
        .filter(F.col("period").isin(*due))
    )
    final = attribute(dedupe(impressions, "impression_id"), dedupe(clicks, "click_id"), catalog)
    final = final.select("*", period_columns(F.col("click_time"), config.period_ms)[1]).filter(
        F.col("period").isin(*due)
    )
    late = events.filter(F.col("late")).select("event_type", "event_id")
    return final.select(*BILLABLE_FIELDS, "period"), quarantined, late


class HeldError(RuntimeError):
    """A back-fill (`until`) would close periods the streaming job has not passed yet."""

    def __init__(self, held: dict[str, str]) -> None:
        self.held = held
        listed = "; ".join(f"{period} {reason}" for period, reason in held.items())
        super().__init__(
            f"refused: closing up to --until would close {len(held)} period(s) ahead of the stream ({listed}); "
            "start the streaming job and let it catch up, or pass --force to close them anyway (what the stream "
            "bills for them later becomes adjustments)"
        )


class ReconcileBusyError(RuntimeError):
    """Another reconciliation run holds the lock."""


@contextmanager
def run_lock(config: ReconcileConfig) -> Iterator[None]:
    """One reconciliation at a time over a data folder: an exclusive lock on `RECONCILE/lock`, released by the
    operating system however the holder ends."""
    path = config.state_file.parent / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ReconcileBusyError(
                f"another reconciliation run holds {path} ({holder}); this one does nothing"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {int(time.time() * 1000)}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def reconcile(
    spark: SparkSession,
    config: ReconcileConfig,
    catalog: Catalog,
    until_ms: int | None = None,
    clock: Callable[[], int] = lambda: int(time.time() * 1000),
    progress: Callable[[str], None] = lambda message: None,
    position: StreamPosition | None = None,
    force: bool = False,
    locked: bool = False,
) -> RunReport:
    """One reconciliation run (see the module's docstring), under the run lock (`locked`: the caller holds it).
    `position` is where the stream stands (asked of the checkpoint, Kafka and Redis when not given); `force`
    closes periods the stream has not passed (a back-fill that knows better)."""
    if locked:
        return _reconcile(spark, config, catalog, until_ms, clock, progress, position, force)
    with run_lock(config):
        return _reconcile(spark, config, catalog, until_ms, clock, progress, position, force)


def _reconcile(
    spark: SparkSession,
    config: ReconcileConfig,
    catalog: Catalog,
    until_ms: int | None,
    clock: Callable[[], int],
    progress: Callable[[str], None],
    position: StreamPosition | None,
    force: bool,
) -> RunReport:
    periods = Periods(config.period_ms)
    now_ms = clock()
    report = RunReport(run_id=f"{now_ms}-{uuid.uuid4().hex[:8]}", started_at_ms=now_ms)
    states = _closed_by_exports(config, load_states(config.state_file))
    versions = data_versions(config, periods)
    every_correction = _read_corrections(config)
    for booked in {c.booked_period for c in every_correction}:
        versions.setdefault(booked, -1)
    if position is None:
        # A forced run closes whatever the stream did: it need not ask (the job and Kafka may be gone for good).
        unasked = StreamPosition(committed=None, end=None, silent_for_ms=None, error="not asked: forced")
        position = unasked if force else config.position()
    plan = plan_run(versions, states, periods, now_ms, config.horizon_ms, position, until_ms, force)
    for period, target in plan.targets.items():
        states[period] = replace(states.get(period, PeriodState(version=-1)), target_offsets=target)
    if plan.targets:
        save_states(config.state_file, states)
    report.held = plan.held
    for period, reason in plan.held.items():
        progress(f"period {period} {reason}")
    if until_ms is not None and plan.held and not force:
        raise HeldError(plan.held)
    totals = RedisTotals.from_url(config.redis_url, config.redis_prefix, timeout_s=config.redis_timeout_ms / 1000)
    closed = {p for p, s in states.items() if s.closed}
    _settle_closed_in_redis(config, totals, closed, periods)
    due = plan.due
    report.periods = due
    if not due:
        _send_conflicts(config, report, progress)  # what an earlier run could not send
        report.finished_at_ms = clock()
        _record_run(config, totals, report)
        return report
    progress(f"reconciling {len(due)} period(s): {due[0]} .. {due[-1]}")
    final_df, quarantined_df, late_df = final_bills(spark, config, due, catalog_frame(spark, catalog))
    final_all = final_df.toArrow()
    late = late_df.toArrow()
    quarantined = quarantined_df.toArrow()
    report.final_clicks = final_all.num_rows
    facts = ArrivalFacts(
        late_click_ids=_ids_of(late, "click"),
        late_impression_ids=_ids_of(late, "impression"),
        conflicting_click_ids=_ids_of(quarantined, "click"),
        conflicting_impression_ids=_ids_of(quarantined, "impression"),
    )
    ledger = read_ledger(config.ledger_dir)
    booked_in = open_period(periods, now_ms, until_ms)
    if booked_in in closed:
        raise RuntimeError(f"the open period {booked_in} is already closed: is the clock behind the data?")
    report.conflicts = _quarantine_conflicts(config, due, quarantined, totals, catalog)
    _send_conflicts(config, report, progress)
    for period in due:
        progress(f"period {period}")
        final = final_all.filter(pc.equal(final_all["period"], period)).drop(["period"])
        ledger_rows = ledger.filter(pc.equal(ledger["period"], period))
        of_period = [c for c in every_correction if c.corrects_period == period]
        if period in closed:
            # What finance was given: the export's bills and the adjustments booked for the period since.
            given = exported_bills(read_export(export_folder(config.data_dir, period)))
            earlier = [c for c in of_period if c.booked_period != period]
            after_close = set(ledger_rows["click_id"].to_pylist()) - set(given["click_id"].to_pylist())
            new = reconcile_period(
                period,
                final.to_pylist(),
                given.to_pylist(),
                earlier,
                booked_period=booked_in,
                now_ms=now_ms,
                facts=replace(facts, billed_after_close_click_ids=after_close),
                reserved_ids={c.correction_id for c in of_period},
            )
            problems = check_reconciled(final.to_pylist(), given.to_pylist(), earlier + new)
        else:
            earlier = of_period
            new = reconcile_period(
                period,
                final.to_pylist(),
                ledger_rows.to_pylist(),
                earlier,
                booked_period=period,
                now_ms=now_ms,
                facts=facts,
            )
            problems = check_reconciled(final.to_pylist(), ledger_rows.to_pylist(), earlier + new)
        if problems:
            raise RuntimeError(f"reconciliation of {period} does not balance: {problems[:5]}")
        if new:
            _write_corrections(config, period, report.run_id, new)
            every_correction += new
        progress(f"period {period}: {len(new)} new correction(s) written")
        # Earlier ones too: a run that stopped between its file and Redis is completed (each id applies once).
        totals.apply_corrections(of_period + new, _starts(periods, of_period + new))
        progress(f"period {period}: corrections applied to Redis")
        report.additions += sum(1 for c in new if c.kind == "addition")
        report.retractions += sum(1 for c in new if c.kind == "retraction")
        report.net_micros += sum(c.amount_micros for c in new)
        state = states.get(period, PeriodState(version=-1))
        if period not in closed:
            export = build_export(
                period,
                final.to_pylist(),
                ledger_rows.to_pylist(),
                [c for c in every_correction if c.corrects_period == period],
                [c for c in every_correction if c.booked_period == period and c.corrects_period != period],
            )
            start = periods.parse_key(period)
            write_export(config.data_dir, period, export_table(export), start, start + periods.length_ms, now_ms)
            progress(f"period {period}: exported")
            totals.close_period(period, start, export_totals(export))
            progress(f"period {period}: closed in Redis")
            state = replace(state, closed_at_ms=now_ms)
            closed.add(period)
            report.closed.append(period)
        states[period] = replace(state, version=versions[period])
        save_states(config.state_file, states)
    report.finished_at_ms = clock()
    _record_run(config, totals, report)
    return report


def _record_run(config: ReconcileConfig, totals: RedisTotals, report: RunReport) -> None:
    """The run's record, for the health page, in Redis and beside the state file (for `adbill restore-redis`)."""
    save_record(config.data_dir, LAST_RUN_FILE, report.record())
    totals.record_reconciliation(report.record())


def _closed_by_exports(config: ReconcileConfig, states: dict[str, PeriodState]) -> dict[str, PeriodState]:
    """The states, with every period that has an export marked closed: a run that stopped after writing an
    export and before its state file closed the period all the same (an export is never rewritten)."""
    root = config.data_dir / "exports"
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name.startswith(".") or not (folder / MANIFEST_FILE).exists():
            continue
        state = states.get(folder.name)
        if state is None or not state.closed:
            closed_at = read_manifest(folder).closed_at_ms
            states[folder.name] = replace(state or PeriodState(version=-1), closed_at_ms=closed_at)
    return states


def _settle_closed_in_redis(config: ReconcileConfig, totals: RedisTotals, closed: set[str], periods: Periods) -> None:
    """Close in Redis, from its export, every closed period Redis does not know as closed (a run that stopped
    between the export and Redis, or a Redis that lost its data)."""
    for period in sorted(closed - set(totals.closed_periods())):
        export = read_export(export_folder(config.data_dir, period)).to_pylist()
        totals.close_period(period, periods.parse_key(period), export_totals(export))


def _ids_of(table: pa.Table, event_type: str) -> set[str]:
    return set(pc.filter(table["event_id"], pc.equal(table["event_type"], event_type)).to_pylist())


def _starts(periods: Periods, corrections: Iterable[Correction]) -> dict[str, int]:
    return {c.booked_period: periods.parse_key(c.booked_period) for c in corrections}


def _read_corrections(config: ReconcileConfig) -> list[Correction]:
    if not config.corrections_dir.exists() or not any(config.corrections_dir.glob("period=*/*.parquet")):
        return []
    table = ds.dataset(config.corrections_dir, format="parquet", partitioning="hive").to_table()
    return corrections_from_arrow(table)


def _write_corrections(config: ReconcileConfig, period: str, run_id: str, corrections: list[Correction]) -> None:
    folder = config.corrections_dir / f"period={period}"
    touched = make_folder(folder)
    temporary = folder / f".run-{run_id}.parquet.tmp"
    pq.write_table(corrections_to_arrow(corrections), temporary)
    replace_files([(temporary, folder / f"run-{run_id}.parquet")], touched)


def _quarantine_conflicts(
    config: ReconcileConfig, due: list[str], quarantined: pa.Table, totals: RedisTotals, catalog: Catalog
) -> int:
    """Id conflicts found in the archive: the Parquet file of each period (`CONFLICTS/period=P.parquet`, all of
    its conflicts, replaced whole) and Redis counts (each record counted once); returns the new ones."""
    advertiser_of = {ad.ad_id: ad.advertiser_id for ad in catalog}
    touched = make_folder(config.conflicts_dir)
    for period in due:
        rows = quarantined.filter(pc.equal(quarantined["period"], period))
        if rows.num_rows:
            temporary = config.conflicts_dir / f".period={period}.parquet.tmp"
            pq.write_table(
                rows.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]), temporary
            )
            replace_files([(temporary, config.conflicts_dir / f"period={period}.parquet")], touched)
    keyed = [
        (f"{r['topic']}/{r['partition']}/{r['offset']}", r["topic"], advertiser_of.get(r["ad_id"] or ""))
        for r in quarantined.select(["topic", "partition", "offset", "ad_id"]).to_pylist()
    ]
    return totals.add_conflicts(keyed)


def _send_conflicts(config: ReconcileConfig, report: RunReport, progress: Callable[[str], None]) -> None:
    """Send to the quarantine topic each id conflict of the conflicts table that is not there yet, and record
    those Kafka took in `conflicts_sent_file`: each goes once, whichever run found it and however often its
    period is reconciled again. A run that cannot reach Kafka says so and goes on (closing a period does not
    wait for the dead-letter topic); the next run sends what is missing. A run stopped between Kafka's answer
    and the record sends those rows again: their key, `topic/partition/offset`, tells the repeats."""
    sent = _read_sent(config.conflicts_sent_file)
    pending: list[pa.Table] = []
    period_of: dict[str, str] = {}
    for path in sorted(config.conflicts_dir.glob("period=*.parquet")) if config.conflicts_dir.is_dir() else []:
        period = path.name.removeprefix("period=").removesuffix(".parquet")
        rows = _with_value_digest(pq.read_table(path))
        keys = [_coordinates(row) for row in rows.select(["topic", "partition", "offset"]).to_pylist()]
        new = [key not in sent.get(period, ()) for key in keys]
        if any(new):
            pending.append(rows.filter(pa.array(new)).select(["value", *HEADERS]))
            period_of.update((key, period) for key, is_new in zip(keys, new, strict=True) if is_new)
    if not pending:
        return
    rows = pa.concat_tables(pending)
    try:
        delivered = DeadLetters(config.kafka_bootstrap, config.topic_quarantine, CONFLICTS_SEND_TIMEOUT_S).send(rows)
    except DeliveryError as exc:
        delivered = exc.delivered
        progress(f"id conflicts not all sent to the quarantine topic; the next run sends the rest: {exc}")
    for key in delivered & period_of.keys():
        sent.setdefault(period_of[key], set()).add(key)
    if delivered:
        _write_sent(config.conflicts_sent_file, sent)
    report.conflicts_sent = len(delivered)
    report.conflicts_unsent = rows.num_rows - len(delivered)
    progress(f"{len(delivered)} id conflict(s) sent to the quarantine topic {config.topic_quarantine}")


def _with_value_digest(rows: pa.Table) -> pa.Table:
    """`rows` with `value_size` and `value_sha256`, which a conflicts file of an older version lacks."""
    if "value_sha256" in rows.column_names:
        return rows
    values = rows.column("value").to_pylist()
    sizes = pa.array([None if v is None else len(v) for v in values], pa.int32())
    digests = pa.array([None if v is None else hashlib.sha256(v).hexdigest() for v in values], pa.string())
    return rows.append_column("value_size", sizes).append_column("value_sha256", digests)


def _coordinates(row: Mapping[str, Any]) -> str:
    return f"{row['topic']}/{row['partition']}/{row['offset']}"


def _read_sent(path: Path) -> dict[str, set[str]]:
    if not path.exists():
        return {}
    return {period: set(keys) for period, keys in json.loads(path.read_text()).items()}


def _write_sent(path: Path, sent: Mapping[str, set[str]]) -> None:
    touched = make_folder(path.parent)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps({period: sorted(keys) for period, keys in sorted(sent.items())}, indent=0))
    replace_files([(temporary, path)], touched)
