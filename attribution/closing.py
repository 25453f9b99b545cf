"""Closing periods (`adbill reconcile`), wired: the ports of `billing.closing_run` over the data folder, Spark,
Redis and Kafka.

A Spark batch job over the archive the stream writes (`attribution.final_bills`), one run at a time (`run_lock`).
The workflow itself (due, held, reconcile, book, export, close, and how a killed run is completed) is plain
Python in `billing.closing_run`; this module gives it its ports:

- `SparkFinalBills`: the final bills of the due periods, computed by Spark, collected as Arrow;
- `LedgerTable`: the stream's ledger (`billing.store.parquet_ledger`);
- `CorrectionFiles`: `CORRECTIONS/period=P/run-ID.parquet`, one file per period and run, renamed into place;
- `ConflictFiles`: `CONFLICTS/period=P.parquet` (all of a period's id conflicts, replaced whole) and the
  quarantine topic, each conflict sent once (`conflicts-sent.json`);
- `ExportFolders`: the finance exports (`billing.export`), never rewritten;
- `StateFile`: the periods' states (`periods.json`) and the last run's record;
- Redis (`billing.store.redis_totals.RedisTotals`), the stream's position (`attribution.stream_position`), the clock;
- `ReconciliationRelease`: quarantined records whose schema id the registry now knows, released into the stream's
  last committed batch (`attribution.release`), so that a job that is down keeps no known record unbilled.

Every path comes from the data folder's layout (`billing.layout`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from attribution.dead_letters import HEADERS, DeadLetters, DeliveryError
from attribution.epoch import checkpoint_started, last_committed_batch
from attribution.final_bills import final_bills, scope_of
from attribution.job_lock import FileLock, JobLockedError
from attribution.pricing import price_matches
from attribution.release import (
    RECONCILIATION,
    Release,
    held_records,
    reconciliation_file,
    release_counts,
    released_table,
    settle,
    write_release,
)
from attribution.restore import save_record
from attribution.schema_follow import EVENT_TYPES, registered_versions
from attribution.stream_position import BILLING_QUERY, stream_position
from billing.catalog import Catalog
from billing.closing import PeriodState, StreamPosition, plan_run
from billing.closing_run import ClosingPorts, ConflictKey, ReconcileBusyError, RunReport, close_periods
from billing.corrections import ArrivalFacts, Correction
from billing.export import export_totals
from billing.invalid import DEFAULT_RULES, IvtRules, first_reason
from billing.invoices import InvoiceError, InvoiceTerms, issue_ready
from billing.layout import EPOCH_FILE, DataLayout
from billing.periods import ANY_PERIOD, DAY_MS, Periods
from billing.rule import BILLABLE_FIELDS, NOT_CHARGED_FIELDS, BillableClick, charge
from billing.store.corrections_arrow import corrections_from_arrow, corrections_to_arrow
from billing.store.crawler_list import PACKAGE as CRAWLER_PACKAGE
from billing.store.crawler_list import CrawlerList, crawler_list, keep_list, kept_list
from billing.store.database import DatabaseUnavailable
from billing.store.database_lock import DatabaseLock, DatabaseLockedError
from billing.store.durable import make_folder, replace_files, staged
from billing.store.export_files import (
    MANIFEST_FILE,
    export_table,
    exported_bills,
    exported_not_charged,
    not_charged_table,
    read_export,
    read_manifest,
    read_not_charged,
    write_export,
)
from billing.store.invoice_db import InvoiceDatabase
from billing.store.invoice_files import ExportInvoiceSource, InvoiceStoreError
from billing.store.names_db import NamesDatabase
from billing.store.parquet_ledger import read_batches, read_ledger
from billing.store.period_states import load_states, save_states
from billing.store.profiles_db import ProfileDatabase
from billing.store.redis_totals import NOT_CHARGED_REASONS, NotChargedCount, RedisTotals
from billing.store.schema_registry import SchemaRegistryError, open_registry

_INT_FIELDS = frozenset({"click_time", "impression_time", "amount_micros"})

CONFLICTS_SEND_TIMEOUT_S = 30.0
"""How long a run waits for Kafka to take the id conflicts it sends to the quarantine topic."""


@dataclass(frozen=True)
class ReconcileConfig:
    """Where reconciliation reads and writes (a data folder's root: `billing.layout`), and its clock rules."""

    data_dir: Path
    redis_url: str
    redis_prefix: str
    kafka_bootstrap: str = "127.0.0.1:9092"
    topics: tuple[str, ...] = ("impressions", "clicks")
    """The topics the billing query reads: a period closes once the query has read what they held."""
    topic_quarantine: str = "quarantine"
    """The dead-letter topic: id conflicts are sent there, once each (`ConflictFiles.send`)."""
    redis_timeout_ms: int = 5_000
    """Deadline of one Redis call, tried again a few times before the run fails
    (`billing.store.redis_totals.connect`)."""
    period_ms: int = 3_600_000
    horizon_ms: int = 900_000
    """How long after a period's end late data is waited for before the period is reconciled and closed."""
    alive_within_ms: int = 120_000
    """A streaming job silent for longer than this is down, and holds the periods it has not passed."""
    registry_location: str | None = None
    """The schema registry (`billing.store.schema_registry.open_registry`): records held in quarantine whose schema
    id it knows now are released by the run (`ReconciliationRelease`); None: the run releases nothing."""
    ivt_rules: IvtRules = DEFAULT_RULES
    """The thresholds of the flood and duplicate rules (`billing.invalid`)."""
    catch_up_wait_ms: int = 60_000
    """How long a run waits for a live streaming job that is only a few seconds behind the records a period past
    its horizon waits for (`wait_for_stream`); 0: not at all."""
    invoice_terms: InvoiceTerms = InvoiceTerms()
    """Who issues the monthly invoices and when they are due (`billing.invoices`)."""
    database_url: str | None = None
    """The product's database: one run at a time across hosts (`run_lock`), and the billing profiles and campaign
    names the invoices are issued with; None: the data folder's lock only, and no invoice issued."""

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.data_dir)

    def position(self) -> StreamPosition:
        """Where the streaming job stands now (its checkpoint, Kafka's end offsets, its heartbeat)."""
        return stream_position(
            self.layout.checkpoint(BILLING_QUERY),
            self.kafka_bootstrap,
            list(self.topics),
            self.redis_url,
            self.redis_prefix,
            BILLING_QUERY,
            self.alive_within_ms,
        )


def data_versions(
    layout: DataLayout, periods: Periods, through_batch: int | None = None, whole_days: bool = False
) -> dict[str, int]:
    """Per period with data, the largest micro-batch id of the files that can change its bill: its clicks and
    impressions, the impressions of the period before it, the clicks of the periods beside it (the invalid traffic
    rules look a minute around a click), and its ledger; with `whole_days` (budgets: a click's charge depends on the
    day's clicks before it), the files of the earlier periods of its UTC day too. Batches after `through_batch` (not
    committed yet) are left out, so that a period is reconciled again once they are.

    A record released from quarantine (`attribution.release`) keeps the time Kafka received it, so it may be the
    first copy of its id to arrive, and change the bills of every period holding another copy: its batch counts
    for those periods too, as if the copy were its own."""
    newest: dict[tuple[str, str], int] = defaultdict(lambda: -1)
    released = released_table(layout, ds.field("reason").is_null())
    for row in released.select(["event_type", "copy_periods", "batch_id"]).to_pylist():
        if through_batch is not None and row["batch_id"] > through_batch:
            continue
        for period in row["copy_periods"] or []:
            newest[(row["event_type"], period)] = max(newest[(row["event_type"], period)], row["batch_id"])
    bases = {
        "click": layout.archive_of("click"),
        "impression": layout.archive_of("impression"),
        "ledger": layout.ledger,
    }
    for kind, base in bases.items():
        for period_dir in base.glob("period=*") if base.exists() else []:
            period = period_dir.name.removeprefix("period=")
            for batch_dir in period_dir.glob("batch_id=*"):
                batch = int(batch_dir.name.removeprefix("batch_id="))
                if through_batch is not None and batch > through_batch:
                    continue
                newest[(kind, period)] = max(newest[(kind, period)], batch)
    versions: dict[str, int] = {}
    for (kind, period), batch in newest.items():
        touched = [period]
        start = periods.parse_key(period)
        if kind in ("impression", "click"):
            touched.append(periods.key(start + periods.length_ms))
        if kind == "click":
            touched.append(periods.key(start - periods.length_ms))
        for p in touched:
            if p != period and (("click", p) not in newest and ("ledger", p) not in newest):
                continue  # the events of one period alone do not make another exist
            versions[p] = max(versions.get(p, -1), batch)
    if whole_days:
        newest_of_day: dict[int, int] = {}
        for period in sorted(versions, key=periods.parse_key):
            day = periods.parse_key(period) // DAY_MS
            newest_of_day[day] = max(newest_of_day.get(day, -1), versions[period])
            versions[period] = newest_of_day[day]
    return versions


@contextmanager
def run_lock(config: ReconcileConfig) -> Iterator[None]:
    """One reconciliation at a time over a data folder: an exclusive lock on `RECONCILE/lock`, released by the
    operating system however the holder ends; with the catalog's database, the same lock there
    (`billing.store.database_lock`, `reconcile:PREFIX`), which holds across hosts."""
    with _database_run_lock(config), _file_run_lock(config):
        yield


@contextmanager
def _database_run_lock(config: ReconcileConfig) -> Iterator[None]:
    if not config.database_url:
        yield
        return
    lock = DatabaseLock(config.database_url, f"reconcile:{config.redis_prefix}", "a reconciliation run")
    try:
        lock.acquire()
    except DatabaseLockedError as exc:
        raise ReconcileBusyError(
            f"another reconciliation run holds the database lock {exc.name} ({exc.holder}); this one does nothing"
        ) from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _file_run_lock(config: ReconcileConfig) -> Iterator[None]:
    path = config.layout.run_lock
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


def run_closing(
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
    """One closing run (`billing.closing_run.close_periods`) over the data folder, under the run lock (`locked`:
    the caller holds it). `position` is where the stream stands (asked of the checkpoint, Kafka and Redis when not
    given); `force` closes periods the stream has not passed (a back-fill that knows better)."""
    ports = closing_ports(spark, config, catalog, clock)
    periods = Periods(config.period_ms)
    # The installed list's patterns, kept at every run before it writes an export that names the version (exports are
    # written by runs only), and for an export of an earlier release (which kept none): a closed period is judged with
    # its own version again after an upgrade of the list.
    keep_list(config.layout.crawler_lists, crawler_list())
    if locked:
        if position is None and not force:
            wait_for_stream(config, clock, progress)
        return close_periods(ports, periods, config.horizon_ms, until_ms, progress, position, force)
    with run_lock(config):
        if position is None and not force:
            wait_for_stream(config, clock, progress)
        return close_periods(ports, periods, config.horizon_ms, until_ms, progress, position, force)


def wait_for_stream(
    config: ReconcileConfig,
    clock: Callable[[], int],
    progress: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    ask: Callable[[], StreamPosition] | None = None,
) -> StreamPosition:
    """Before a run: when a period past its horizon waits only for a live streaming job to read what Kafka held when
    the horizon passed (a job a few seconds behind live traffic), wait for it, up to `config.catch_up_wait_ms`, so
    that the period closes in this run instead of being held to the next. The targets found here are kept in the
    state file, so the run measures against them. A job that is down, waiting or far behind is not waited for: the
    run holds the period and says why."""
    periods = Periods(config.period_ms)
    ask = ask or config.position
    position = ask()
    if config.catch_up_wait_ms <= 0 or not position.alive or position.waiting is not None:
        return position
    layout = config.layout
    states = load_states(layout.periods_file)
    plan = plan_run(data_versions(layout, periods), states, periods, clock(), config.horizon_ms, position)
    if plan.targets:
        for period, target in plan.targets.items():
            states[period] = replace(states.get(period, PeriodState(version=-1)), target_offsets=target)
        save_states(layout.periods_file, states)
    targets = [
        states[period].target_offsets or plan.targets.get(period)
        for period in plan.held
        if period in states and (states[period].target_offsets or plan.targets.get(period))
    ]
    if not targets:
        return position
    deadline = time.monotonic() + config.catch_up_wait_ms / 1000
    behind = max(position.behind(t) for t in targets if t is not None)
    if behind:
        progress(
            f"waiting up to {config.catch_up_wait_ms // 1000} s for the streaming job to read {behind:,} record(s) "
            f"of period(s) {', '.join(plan.held)}"
        )
    while behind and time.monotonic() < deadline:
        sleep(1.0)
        position = ask()
        if not position.alive or position.waiting is not None:
            break
        behind = max(position.behind(t) for t in targets if t is not None)
    if not behind:
        progress("the streaming job has read what the periods past their horizon wait for")
    return position


def closing_ports(
    spark: SparkSession, config: ReconcileConfig, catalog: Catalog, clock: Callable[[], int]
) -> ClosingPorts:
    """The ports of a closing run over `config`'s data folder.

    The run reads the archive and the ledger up to one batch: the last the stream's checkpoint had committed when
    the run first asked (`CommittedBatch`, after the stream's position), so that a batch committed between the two
    reads is in neither, and the next run reconciles it."""
    layout = config.layout
    through = CommittedBatch(layout.checkpoint(BILLING_QUERY))
    return ClosingPorts(
        catalog=catalog,
        final_bills=lambda due: SparkFinalBills.compute(
            spark, layout, config.period_ms, due, catalog, through.batch(), config.ivt_rules
        ),
        ledger=lambda: LedgerTable(
            ledger_up_to(read_ledger(layout.ledger), through.batch()), layout.ledger, through.batch()
        ),
        corrections=CorrectionFiles(layout),
        conflicts=ConflictFiles(layout, catalog, config.kafka_bootstrap, config.topic_quarantine),
        totals=lambda: RedisTotals.from_url(
            config.redis_url, config.redis_prefix, timeout_s=config.redis_timeout_ms / 1000
        ),
        exports=ExportFolders(layout),
        states=StateFile(layout),
        versions=lambda: data_versions(layout, Periods(config.period_ms), through.batch(), catalog.has_budgets),
        position=config.position,
        clock=clock,
        release=ReconciliationRelease(config, catalog, through),
        invoices=lambda versions, states, now_ms: issue_invoices(config, versions, states, clock),
    )


def issue_invoices(
    config: ReconcileConfig,
    versions: Mapping[str, int],
    states: Mapping[str, PeriodState],
    clock: Callable[[], int],
    only: str | None = None,
) -> list[str]:
    """Issue the monthly invoices of every month whose periods are all closed (`billing.invoices.issue_ready`) from
    the exports and the corrections of the data folder, and the billing profiles and campaign names of the database
    (`config.database_url`); what was done, in words. A failure is said, not raised: the closing run's work stands,
    and the next run (or `adbill invoices issue`) tries again. While the database cannot be reached no invoice is
    issued: an invoice keeps the profile and the names it was issued with, never none for want of them. The
    invoices and their numbers are the database's (`billing.store.invoice_db`); a file an issuer did not write
    (it stopped after its commit) is written from the database here."""
    layout = config.layout
    if not config.database_url:
        if only is not None:
            raise InvoiceError("invoices are issued with the billing profiles of the database, and none is set")
        return ["invoices not issued: no database holds the billing profiles (ReconcileConfig.database_url)"]
    book = InvoiceDatabase(config.database_url, layout)
    try:
        done = issue_ready(
            book,
            ExportInvoiceSource(layout),
            ProfileDatabase(config.database_url, imports=layout.billing_profiles_file).current(),
            Periods(config.period_ms),
            config.horizon_ms,
            versions,
            states,
            clock,
            config.invoice_terms,
            only,
            NamesDatabase(config.database_url, imports=layout.names_file).named("campaign"),
        )
        written = book.write_files()  # those an issuer committed and stopped before it wrote
    except (InvoiceError, InvoiceStoreError, OSError, ValueError, DatabaseUnavailable) as exc:
        if only is not None:
            raise
        return [f"invoices not issued: {exc}"]
    return done.describe() + ([f"invoice files written again from the database: {len(written)}"] if written else [])


RELEASE_WAIT_S = 10.0
"""How long a run waits for the streaming job's release to end before it leaves releasing to its next run."""


@dataclass
class ReconciliationRelease:
    """The closing run's release (`attribution.release`): the records held in quarantine by batches up to the last
    one the stream committed, whose schema id the registry knows now, released into that batch (which the run reads
    up to), one releaser at a time (`release_lock`). Their counts reach Redis once per record; every run applies
    those an earlier run wrote and did not apply (it stopped in between)."""

    config: ReconcileConfig
    catalog: Catalog
    through: CommittedBatch

    @contextmanager
    def __call__(self, run_id: str, progress: Callable[[str], None]) -> Iterator[_PendingRelease | None]:
        lock = FileLock(self.config.layout.release_lock, f"reconciliation run {run_id}")
        try:
            lock.acquire(wait_s=RELEASE_WAIT_S)
        except JobLockedError as exc:  # the stream is releasing: the next run releases what is left
            progress(f"release left to the next run: {exc}")
            yield None
            return
        try:
            self.apply_counts()
            yield self.pending(run_id, progress)
        finally:
            lock.release()

    def pending(self, run_id: str, progress: Callable[[str], None]) -> _PendingRelease | None:
        if self.config.registry_location is None:
            return None
        layout = self.config.layout
        batch = self.through.batch()
        if batch is None or batch < 0:
            # No batch committed, or no checkpoint (a back-filled data folder, or one being replaced by a new
            # epoch, which may set aside the newest batches yet): nothing of the stream to release into.
            return None
        held = held_records(layout, batch + 1)
        if not held.num_rows:
            return None
        try:
            registry = open_registry(self.config.registry_location, layout.schemas_file)
            schemas = {event_type: registered_versions(registry, event_type) for event_type in EVENT_TYPES}
        except SchemaRegistryError as exc:
            progress(f"release left to the next run: the schema registry cannot be read: {exc}")
            return None
        topics = dict(zip(self.config.topics, EVENT_TYPES, strict=True))
        release = settle(layout, held, batch, schemas, topics, Periods(self.config.period_ms), RECONCILIATION)
        if not release.settled.num_rows:
            return None
        return _PendingRelease(self, release, reconciliation_file(run_id))

    def apply_counts(self) -> int:
        """Apply to Redis the counts of every record a run released (each once); how many were new."""
        table = released_table(self.config.layout, ds.field("released_by") == RECONCILIATION)
        if not table.num_rows:
            return 0
        advertiser_of = self.catalog.advertisers_by_ad
        periods = Periods(self.config.period_ms)
        columns = (table.column(c).to_pylist() for c in ("topic", "partition", "offset"))
        keys = [f"{t}/{p}/{o}" for t, p, o in zip(*columns, strict=True)]
        totals = RedisTotals.from_url(
            self.config.redis_url, self.config.redis_prefix, timeout_s=self.config.redis_timeout_ms / 1000
        )
        return totals.apply_released(
            (key, *release_counts(table.slice(i, 1), advertiser_of, periods)) for i, key in enumerate(keys)
        )


@dataclass(frozen=True)
class _PendingRelease:
    """What a run is about to release (`billing.closing_run.PendingRelease`)."""

    owner: ReconciliationRelease
    release: Release
    file_name: str

    @property
    def batch_id(self) -> int:
        return self.release.batch_id

    @property
    def periods(self) -> frozenset[str]:
        return self.release.periods

    @property
    def count(self) -> int:
        return self.release.count

    def write(self) -> None:
        config = self.owner.config
        advertiser_of = {ad.ad_id: ad.advertiser_id for ad in self.owner.catalog}
        write_release(config.layout, self.release, self.file_name, advertiser_of, Periods(config.period_ms))
        self.owner.apply_counts()


class CommittedBatch:
    """The last batch the stream's checkpoint committed (`attribution.epoch.last_committed_batch`), read once, at
    the first question; None (no limit) without a checkpoint (a data folder closed by a back-fill)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self._asked = False
        self._batch: int | None = None

    def batch(self) -> int | None:
        if not self._asked:
            if checkpoint_started(self.checkpoint) or (self.checkpoint / EPOCH_FILE).exists():
                committed = last_committed_batch(self.checkpoint)
                self._batch = -1 if committed is None else committed
            self._asked = True
        return self._batch


def ledger_up_to(ledger: pa.Table, through_batch: int | None) -> pa.Table:
    if through_batch is None or not ledger.num_rows:
        return ledger
    return ledger.filter(pc.less_equal(ledger["batch_id"], through_batch))


@dataclass(frozen=True)
class SparkFinalBills:
    """The final bills of a run's due periods, collected from Spark as Arrow: the charged clicks, and the billable
    clicks not charged with the reason (no price, an invalid traffic rule, the budget)."""

    bills: pa.Table
    conflicts: pa.Table
    facts: ArrivalFacts
    not_charged: pa.Table = field(default_factory=lambda: pa.table({"click_id": pa.array([], pa.string())}))
    rules: IvtRules = DEFAULT_RULES

    @classmethod
    def compute(
        cls,
        spark: SparkSession,
        layout: DataLayout,
        period_ms: int,
        due: list[str],
        catalog: Catalog,
        through_batch: int | None = None,
        rules: IvtRules = DEFAULT_RULES,
    ) -> SparkFinalBills:
        charged, not_charged, quarantined, late = final_charges(
            spark, layout, period_ms, due, catalog, through_batch, rules
        )
        refused = not_charged.filter(pc.is_in(not_charged["reason"], pa.array(sorted(NOT_CHARGED_REASONS))))
        facts = ArrivalFacts(
            late_click_ids=_ids_of(late, "click"),
            late_impression_ids=_ids_of(late, "impression"),
            conflicting_click_ids=_ids_of(quarantined, "click"),
            conflicting_impression_ids=_ids_of(quarantined, "impression"),
            unpriced_click_ids=set(
                not_charged.filter(pc.is_in(not_charged["reason"], pa.array(["ad_paused", "unknown_ad"])))[
                    "click_id"
                ].to_pylist()
            )
            | unbilled_by_stream(layout, due),
            not_charged_reasons=dict(zip(refused["click_id"].to_pylist(), refused["reason"].to_pylist(), strict=True)),
            stream_not_charged=not_charged_by_stream(layout, due),
        )
        return cls(charged, quarantined, facts, not_charged, rules)

    @property
    def clicks(self) -> int:
        return self.bills.num_rows

    @property
    def judged_with(self) -> dict[str, Any]:
        return {
            "crawler_list_version": crawler_list().version,
            "crawler_list_package": CRAWLER_PACKAGE,
            **self.rules.as_dict(),
        }

    def of_period(self, period: str) -> list[dict[str, Any]]:
        return self.bills.filter(pc.equal(self.bills["period"], period)).drop(["period"]).to_pylist()

    def not_charged_of(self, period: str) -> list[dict[str, Any]]:
        return self.not_charged.filter(pc.equal(self.not_charged["period"], period)).to_pylist()


def judged_as_closed(
    layout: DataLayout, scope: Iterable[str], rules: IvtRules
) -> tuple[dict[str, IvtRules], dict[str, CrawlerList]]:
    """What each closed period of `scope` was judged with, from its export's manifest, where it differs from
    today's: the flood and duplicate thresholds, and the crawler list's version (its patterns as `keep_list` kept
    them). A change of either applies to periods not yet closed, so a closed period reconciled again (a late event,
    a catalog change) is judged as it was. An export that names neither, or a version whose patterns were not kept,
    is judged with today's."""
    thresholds: dict[str, IvtRules] = {}
    crawlers: dict[str, CrawlerList] = {}
    installed = crawler_list().version
    for period in scope:
        folder = layout.export(period)
        if not (folder / MANIFEST_FILE).exists():
            continue
        judged = read_manifest(folder).judged_with
        if (kept := rules.or_judged_with(judged)) != rules:
            thresholds[period] = kept
        version = judged.get("crawler_list_version")
        if version and version != installed and (listed := kept_list(layout.crawler_lists, str(version))):
            crawlers[period] = listed
    return thresholds, crawlers


def final_charges(
    spark: SparkSession,
    layout: DataLayout,
    period_ms: int,
    due: list[str],
    catalog: Catalog,
    through_batch: int | None = None,
    rules: IvtRules = DEFAULT_RULES,
) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """(the charged clicks of the due periods with their `period` (`BILLABLE_FIELDS`), the billable clicks not
    charged with `period` and `reason`, id conflicts, late events): Spark's final matches priced by the catalog's
    history, judged (`billing.invalid`: the flood and duplicate rules found by Spark, the crawler list and the
    exclusion list on the driver, each period with the list it was judged with) and charged in event-time order
    within each campaign's UTC day (`billing.rule.charge`). With budgets in the catalog, the due periods' whole UTC
    days are computed (`attribution.final_bills.scope_of`), since a click's charge depends on the clicks before it
    that day; the clicks not charged are given for all of them, so that a run sees which bills of a still open
    period of the day are over the budget now.

    The crawler list is searched in Python, as the stream and the click's story search it and as the package's own
    `is_crawler` does, once per distinct user agent: Java's expressions differ from Python's on a few texts (`\\d`
    and a non-ASCII digit, `$` before a trailing carriage return), and one list must give one verdict."""
    periods = Periods(period_ms)
    scope = scope_of(due, periods, catalog.has_budgets)
    thresholds, lists = judged_as_closed(layout, scope, rules)
    final_df, quarantined_df, late_df = final_bills(
        spark, layout.archive, period_ms, scope, through_batch, rules, thresholds
    )
    matches = final_df.toArrow()
    priced = price_matches(matches, catalog)
    rows = priced.bills.to_pylist()
    installed = crawler_list()
    invalid: dict[str, str] = {}
    for row in rows:
        reason = first_reason(
            bot=lists.get(row["period"], installed).matches(row["user_agent"]),
            excluded=catalog.exclusions.excluding(row["ip"], row["click_time"]) is not None,
            flood=bool(row["click_flood"]),
            duplicate=bool(row["duplicate_click"]),
        )
        if reason is not None:
            invalid[row["click_id"]] = reason.value
    period_of = {row["click_id"]: row["period"] for row in rows}
    charged, refused = charge(
        [BillableClick(**{name: row[name] for name in BILLABLE_FIELDS}) for row in rows], invalid, catalog
    )
    wanted = set(due)
    bills = pa.Table.from_pylist(
        [{**r.to_dict(), "period": period_of[r.click_id]} for r in charged if period_of[r.click_id] in wanted],
        schema=FINAL_BILL_SCHEMA,
    )
    unpriced = [
        {**{n: row.get(n) for n in NOT_CHARGED_FIELDS}, "period": row["period"]}
        for row in priced.unbilled.to_pylist()
        if row["period"] in wanted
    ]
    not_charged = pa.Table.from_pylist(
        [*unpriced, *({**r.to_dict(), "period": period_of[r.click_id]} for r in refused)],
        schema=FINAL_NOT_CHARGED_SCHEMA,
    )
    quarantined = quarantined_df.toArrow()
    quarantined = quarantined.filter(pc.is_in(quarantined["period"], pa.array(due, pa.string())))
    late = late_df.toArrow()
    return bills, not_charged, quarantined, late


FINAL_BILL_SCHEMA = pa.schema(
    [
        *((name, pa.int64() if name in _INT_FIELDS else pa.string()) for name in BILLABLE_FIELDS),
        ("period", pa.string()),
    ]
)
FINAL_NOT_CHARGED_SCHEMA = pa.schema(
    [
        *((name, pa.int64() if name in _INT_FIELDS else pa.string()) for name in NOT_CHARGED_FIELDS),
        ("period", pa.string()),
    ]
)


def not_charged_by_stream(layout: DataLayout, due: list[str]) -> dict[str, str]:
    """The clicks of the due periods the stream priced and did not charge, with its reason (`not_charged/`)."""
    folder = layout.not_charged
    if not folder.is_dir() or not any(folder.glob("period=*")):
        return {}
    dataset = ds.dataset(folder, format="parquet", partitioning="hive")
    found = dataset.to_table(columns=["click_id", "reason"], filter=pc.field("period").isin(due))
    return dict(zip(found["click_id"].to_pylist(), found["reason"].to_pylist(), strict=True))


def unbilled_by_stream(layout: DataLayout, due: list[str]) -> set[str]:
    """The clicks of the due periods that the stream matched but could not price at their time (its `unbilled`
    table): a bill reconciliation adds for one of them comes from a catalog change the stream had not seen."""
    folder = layout.unbilled
    if not folder.is_dir() or not any(folder.glob("period=*")):
        return set()
    dataset = ds.dataset(folder, format="parquet", partitioning="hive")
    found = dataset.to_table(columns=["click_id"], filter=pc.field("period").isin(due))
    return set(found["click_id"].to_pylist())


@dataclass(frozen=True)
class LedgerTable:
    """The stream's ledger, read once per run (up to batch `through`, None: every batch there was), and the bills of
    the batches the stream applied since, read from their own folders in `folder`."""

    table: pa.Table
    folder: Path | None = None
    through: int | None = None

    def of_period(self, period: str) -> list[dict[str, Any]]:
        return self.table.filter(pc.equal(self.table["period"], period)).to_pylist()

    def billed_after_close(self, period: str, given: list[dict[str, Any]]) -> set[str]:
        billed = set(self.table.filter(pc.equal(self.table["period"], period))["click_id"].to_pylist())
        return billed - {r["click_id"] for r in given}

    @property
    def read_through(self) -> int | None:
        if self.folder is None:
            return None
        if self.through is not None:
            return self.through
        newest = pc.max(self.table["batch_id"]).as_py() if self.table.num_rows else None
        return -1 if newest is None else int(newest)

    def newer(self, after_batch: int, through_batch: int, periods: Collection[str]) -> list[dict[str, Any]]:
        if self.folder is None:
            return []
        return read_batches(self.folder, periods, after_batch, through_batch).to_pylist()


@dataclass(frozen=True)
class CorrectionFiles:
    """The corrections: one Parquet file per corrected period and run."""

    layout: DataLayout

    def read(self) -> list[Correction]:
        folder = self.layout.corrections
        if not folder.exists() or not any(folder.glob("period=*/*.parquet")):
            return []
        return corrections_from_arrow(ds.dataset(folder, format="parquet", partitioning="hive").to_table())

    def write(self, period: str, run_id: str, corrections: list[Correction]) -> None:
        folder = self.layout.corrections_of(period)
        touched = make_folder(folder)
        with staged(folder / f".run-{run_id}.parquet.tmp") as temporary:
            pq.write_table(corrections_to_arrow(corrections), temporary)
            replace_files([(temporary, folder / f"run-{run_id}.parquet")], touched)


@dataclass(frozen=True)
class ConflictFiles:
    """The id conflicts reconciliation found: a Parquet file per period, and the quarantine topic."""

    layout: DataLayout
    catalog: Catalog
    kafka_bootstrap: str
    topic: str

    def keep(self, due: list[str], found: pa.Table) -> list[ConflictKey]:
        """The Parquet file of each due period (all of its conflicts, replaced whole); returns every conflict keyed
        for the totals (each record counted once)."""
        advertiser_of = self.catalog.advertisers_by_ad
        touched = make_folder(self.layout.conflicts)
        for period in due:
            rows = found.filter(pc.equal(found["period"], period))
            if rows.num_rows:
                target = self.layout.conflicts_of(period)
                temporary = target.with_name(f".{target.name}.tmp")
                pq.write_table(
                    rows.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]),
                    temporary,
                )
                replace_files([(temporary, target)], touched)
        return [
            (_coordinates(r), r["topic"], advertiser_of.get(r["ad_id"] or ""))
            for r in found.select(["topic", "partition", "offset", "ad_id"]).to_pylist()
        ]

    def send(self, progress: Callable[[str], None]) -> tuple[int, int] | None:
        """Send to the quarantine topic each id conflict of the conflicts files that is not there yet, and record
        those Kafka took in the layout's `conflicts_sent_file`: each goes once, whichever run found it and however
        often its period is reconciled again. A run that cannot reach Kafka says so and goes on (closing a period
        does not wait for the dead-letter topic); the next run sends what is missing. A run stopped between Kafka's
        answer and the record sends those rows again: their key, `topic/partition/offset`, tells the repeats."""
        sent_file = self.layout.conflicts_sent_file
        sent = _read_sent(sent_file)
        pending: list[pa.Table] = []
        period_of: dict[str, str] = {}
        folder = self.layout.conflicts
        for path in sorted(folder.glob("period=*.parquet")) if folder.is_dir() else []:
            period = path.name.removeprefix("period=").removesuffix(".parquet")
            rows = _with_value_digest(pq.read_table(path))
            keys = [_coordinates(row) for row in rows.select(["topic", "partition", "offset"]).to_pylist()]
            new = [key not in sent.get(period, ()) for key in keys]
            if any(new):
                pending.append(rows.filter(pa.array(new)).select(["value", *HEADERS]))
                period_of.update((key, period) for key, is_new in zip(keys, new, strict=True) if is_new)
        if not pending:
            return None
        rows = pa.concat_tables(pending)
        try:
            delivered = DeadLetters(self.kafka_bootstrap, self.topic, CONFLICTS_SEND_TIMEOUT_S).send(rows)
        except DeliveryError as exc:
            delivered = exc.delivered
            progress(f"id conflicts not all sent to the quarantine topic; the next run sends the rest: {exc}")
        for key in delivered & period_of.keys():
            sent.setdefault(period_of[key], set()).add(key)
        if delivered:
            _write_sent(sent_file, sent)
        progress(f"{len(delivered)} id conflict(s) sent to the quarantine topic {self.topic}")
        return len(delivered), rows.num_rows - len(delivered)


@dataclass(frozen=True)
class ExportFolders:
    """The closed periods' finance exports (`billing.export`)."""

    layout: DataLayout

    def exported(self) -> list[str]:
        root = self.layout.exports
        return [
            folder.name
            for folder in (sorted(root.iterdir()) if root.is_dir() else [])
            if not folder.name.startswith(".") and (folder / MANIFEST_FILE).exists()
        ]

    def closed_at_ms(self, period: str) -> int:
        return read_manifest(self.layout.export(period)).closed_at_ms

    def given(self, period: str) -> list[dict[str, Any]]:
        return exported_bills(read_export(self.layout.export(period))).to_pylist()

    def totals(self, period: str) -> dict[tuple[str, str], tuple[int, int, str]]:
        return export_totals(read_export(self.layout.export(period)).to_pylist())

    def write(
        self,
        period: str,
        export: list[dict[str, Any]],
        start_ms: int,
        end_ms: int,
        closed_at_ms: int,
        not_charged: list[dict[str, Any]] | None = None,
        judged_with: Mapping[str, Any] | None = None,
    ) -> None:
        write_export(
            self.layout.root,
            period,
            export_table(export),
            start_ms,
            end_ms,
            closed_at_ms,
            not_charged_table(not_charged or []),
            judged_with,
        )

    def not_charged(self, period: str) -> list[NotChargedCount]:
        folder = self.layout.export(period)
        return exported_not_charged(read_not_charged(folder), read_export(folder), ANY_PERIOD.parse_key(period))


@dataclass(frozen=True)
class StateFile:
    """The periods' states and the last run's record, in the layout's reconcile folder."""

    layout: DataLayout

    def load(self) -> dict[str, PeriodState]:
        return load_states(self.layout.periods_file)

    def save(self, states: Mapping[str, PeriodState]) -> None:
        save_states(self.layout.periods_file, states)

    def record_run(self, record: dict[str, object]) -> None:
        save_record(self.layout.last_run_file, record)


def _ids_of(table: pa.Table, event_type: str) -> set[str]:
    return set(pc.filter(table["event_id"], pc.equal(table["event_type"], event_type)).to_pylist())


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
