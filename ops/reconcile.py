"""`adbill reconcile`, `adbill audit` and `adbill export`: reconciliation wired.

One reconciliation run (`reconcile`) hands the plain-Python workflow `billing.reconcile_run.reconcile_periods` its ports
(`reconcile_ports`), one run at a time (`run_lock`):

- Spark's final bills of the due periods, collected as Arrow (`attribution.final_bills.SparkFinalBills`);
- the stream's ledger (`billing.store.parquet_ledger.LedgerTable`), read up to the last batch the stream's
  checkpoint committed (`attribution.epoch.CommittedBatch`);
- the corrections (`billing.store.corrections_arrow.CorrectionFiles`), the id conflicts and the quarantine topic
  (`billing.store.conflict_files.ConflictFiles`), the finance exports (`billing.store.export_files.ExportFolders`),
  the periods' states and the last run's record (`billing.store.period_states.StateFile`), the data's versions
  (`billing.store.data_versions`);
- Redis (`billing.store.redis_totals.RedisTotals`), the stream's position (`attribution.stream_position`), the clock;
- quarantined records whose schema id the registry now knows, released into the stream's last committed batch
  (`attribution.release.ReconciliationRelease`), so that a job that is down keeps no known record unbilled;
- the monthly invoices, issued once a month's periods are all closed (`issue_invoices`).

Each run ends, under the same lock, by compacting the batch files of the closed periods that no one will write again
(`compact_closed_periods`, `billing.store.compaction`; `ADBILL_COMPACT_AFTER_CLOSE`), and the quarantine's and
`released/`'s by chunks of batch ids up to the same batch; between the runs of
`--every`, a pass under the same lock compacts the open periods' cold batches every `ADBILL_COMPACT_INTERVAL_S`
(`compact_open_periods`, `OpenPasses`). Whoever takes the lock finishes a compaction a crash interrupted, and
`adbill audit` takes it too (its Spark job lists, then reads, the archive).

`run_reconcile` is the command: the run lock, a Spark session, the schedule, exit codes, metrics. Every path comes
from the data folder's layout (`billing.layout`). The modules of `attribution` (Spark, the stream's checkpoint) are
imported where a run needs them, so that `adbill invoices` and `adbill export`, which read the same stores, load
none of them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from billing.catalog import Catalog
from billing.invalid import DEFAULT_RULES, IvtRules
from billing.invoices import InvoiceError, InvoiceTerms, Issuer, PeriodClosing
from billing.layout import DataLayout
from billing.money import Amounts
from billing.periods import Periods
from billing.reconcile_plan import PeriodState, StreamPosition, plan_run
from billing.reconcile_run import ReconcileBusyError, ReconcilePorts, RunReport, reconcile_periods
from billing.store.compaction import (
    CompactionReport,
    closed_pass,
    compactable_through,
    finish_interrupted,
    open_pass,
    open_periods,
)
from billing.store.conflict_files import ConflictFiles
from billing.store.corrections_arrow import CorrectionFiles
from billing.store.crawler_list import crawler_list, keep_list
from billing.store.data_versions import data_versions
from billing.store.database import DatabaseUnavailable
from billing.store.database_lock import DatabaseLock, DatabaseLockedError
from billing.store.export_files import ExportFolders
from billing.store.invoice_db import InvoiceDatabase
from billing.store.invoice_files import ExportInvoiceSource, InvoiceStoreError
from billing.store.names_db import NamesDatabase
from billing.store.parquet_ledger import LedgerTable, ledger_up_to, read_ledger
from billing.store.period_states import StateFile, closed_periods, load_states, save_record, save_states
from billing.store.profiles_db import ProfileDatabase
from billing.store.redis_totals import RedisTotals
from ops.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from pyspark.sql import SparkSession

    from attribution.audit import PeriodAudit
    from billing.store.catalog_db import CatalogDatabase

log = logging.getLogger(__name__)


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
    """The dead-letter topic: id conflicts are sent there, once each (`billing.store.conflict_files`)."""
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
    id it knows now are released by the run (`attribution.release.ReconciliationRelease`); None: the run releases
    nothing."""
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
    compact_closed: bool = True
    """Each run ends by compacting the batch files of the closed periods (`billing.store.compaction`); False: they
    stay as the stream wrote them."""
    compact_interval_s: int = 120
    """Seconds between the passes over the open periods between the runs of `--every` (`compact_open_periods`);
    0: none."""

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.data_dir)

    def position(self) -> StreamPosition:
        """Where the streaming job stands now (its checkpoint, Kafka's end offsets, its heartbeat)."""
        from attribution.stream_position import BILLING_QUERY, stream_position

        return stream_position(
            self.layout.checkpoint(BILLING_QUERY),
            self.kafka_bootstrap,
            list(self.topics),
            self.redis_url,
            self.redis_prefix,
            BILLING_QUERY,
            self.alive_within_ms,
        )


def reconcile_config(settings: Settings) -> ReconcileConfig:
    """Reconciliation's config, from the settings of the process."""
    return ReconcileConfig(
        data_dir=settings.root,
        redis_url=settings.redis_url,
        redis_prefix=settings.redis_prefix,
        kafka_bootstrap=settings.kafka_bootstrap,
        topics=(settings.topic_impressions, settings.topic_clicks),
        topic_quarantine=settings.topic_quarantine,
        redis_timeout_ms=settings.redis_timeout_ms,
        period_ms=settings.period_ms,
        horizon_ms=settings.lateness_horizon_ms,
        registry_location=settings.registry_location,
        ivt_rules=settings.ivt_rules,
        catch_up_wait_ms=settings.close_wait_s * 1000,
        invoice_terms=InvoiceTerms(settings.invoice_issuer, settings.invoice_terms_days),
        database_url=settings.database_url,
        compact_closed=bool(settings.compact_after_close),
        compact_interval_s=settings.compact_interval_s,
    )


@contextmanager
def run_lock(config: ReconcileConfig, wait_s: float = 0.0) -> Iterator[None]:
    """One reconciliation at a time over a data folder: an exclusive lock on `RECONCILE/lock`, released by the
    operating system however the holder ends; with the catalog's database, the same lock there
    (`billing.store.database_lock`, `reconcile:PREFIX`), which holds across hosts. Waits up to `wait_s` for another
    holder, then ReconcileBusyError. Whoever takes it first completes or rolls back a compaction that a crash
    interrupted (`billing.store.compaction.finish_interrupted`): every holder reads whole batch folders."""
    with _database_run_lock(config, wait_s), _file_run_lock(config, wait_s):
        finished = finish_interrupted(config.layout)
        if finished:
            print(f"reconcile: {finished}", file=sys.stderr, flush=True)
        yield


@contextmanager
def _database_run_lock(config: ReconcileConfig, wait_s: float = 0.0) -> Iterator[None]:
    if not config.database_url:
        yield
        return
    lock = DatabaseLock(config.database_url, f"reconcile:{config.redis_prefix}", "a reconciliation run")
    try:
        lock.acquire(wait_s)
    except DatabaseLockedError as exc:
        raise ReconcileBusyError(
            f"another reconciliation run holds the database lock {exc.name} ({exc.holder}); this one does nothing"
        ) from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _file_run_lock(config: ReconcileConfig, wait_s: float = 0.0) -> Iterator[None]:
    path = config.layout.run_lock
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    with path.open("a+") as handle:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
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
    """One reconciliation run (`billing.reconcile_run.reconcile_periods`) over the data folder, under the run lock
    (`locked`: the caller holds it). `position` is where the stream stands (asked of the checkpoint, Kafka and Redis
    when not given); `force` closes periods the stream has not passed (a back-fill that knows better)."""
    ports = reconcile_ports(spark, config, catalog, clock)
    periods = Periods(config.period_ms)
    # The installed list's patterns, kept at every run before it writes an export that names the version (exports are
    # written by runs only), and for an export of an earlier release (which kept none): a closed period is judged with
    # its own version again after an upgrade of the list.
    keep_list(config.layout.crawler_lists, crawler_list())
    with nullcontext() if locked else run_lock(config):
        if position is None and not force:
            wait_for_stream(config, clock, progress)
        report = reconcile_periods(ports, periods, config.horizon_ms, until_ms, progress, position, force)
        if config.compact_closed:
            compacted = compact_closed_periods(config)
            progress(compacted.describe())
            record_compaction(config, "closed", compaction_record(compacted))
            progress(refresh_click_filters(config))
        return report


def compact_closed_periods(config: ReconcileConfig) -> CompactionReport:
    """Compact the batch files of every closed period up to the batch no one will write again
    (`billing.store.compaction.compactable_through`: the stream checkpoint's last committed batch and Redis's last
    applied one, less `HOT_BATCHES`); nothing without a checkpoint or while Redis cannot say. The quarantine's and
    `released/`'s batch folders too, by whole chunks of `QUARANTINE_CHUNK` batch ids up to the same batch
    (`compact_quarantine`). The caller holds the run lock."""
    layout = config.layout
    # The quarantine and `released/` by whole chunks of batch ids, up to the same batch (their readers take each
    # row's own batch: `billing.store.compaction.read_batch_only`).
    return closed_pass(layout, closed_periods(layout), compaction_position(config))


def refresh_click_filters(config: ReconcileConfig) -> str:
    """Write the day filters of the closed periods that have none or whose files changed
    (`billing.store.click_files.ClickFiles.refresh_filters`), and say so on the health page; what was done, in a
    line. The caller holds the run lock."""
    from billing.store.click_files import ClickFiles

    try:
        refresh = ClickFiles(config.layout).refresh_filters(closed_periods(config.layout))
    except OSError as exc:  # a full disk: the stories read the periods whole until a later run writes them
        said = f"click filters not written ({exc}); a later run writes them"
        record_compaction(config, "filters", {"finished_at_ms": _now_ms(), "summary": said, "failed": [str(exc)]})
        return said
    said = refresh.describe()
    record_compaction(
        config,
        "filters",
        {
            "finished_at_ms": _now_ms(),
            "summary": said,
            "written": len(refresh.written),
            "waiting": len(refresh.waiting),
            "oldest_waiting": refresh.waiting[0] if refresh.waiting else "",
            "failed": [],
        },
    )
    return said


def compaction_record(report: CompactionReport) -> dict[str, object]:
    """A pass's figures as the health page reads them (`RedisTotals.record_compaction`)."""
    return {
        "finished_at_ms": _now_ms(),
        "summary": report.describe(),
        "through": "" if report.through is None else report.through,
        "periods": report.periods,
        "files_read": report.files_read,
        "files_written": report.files_written,
        "seconds": round(report.seconds, 1),
        "failed": report.failed,
    }


def record_compaction(config: ReconcileConfig, part: str, record: Mapping[str, object]) -> None:
    """Keep a pass's record for the health page; Redis out of reach loses only the record (the next pass's
    replaces it)."""
    try:
        redis_totals(config).record_compaction(part, record)
    except Exception as exc:  # the pass's work is done and on disk: a record it could not keep changes nothing
        log.warning("the %s compaction's record not kept: %s", part, exc)


def _now_ms() -> int:
    return int(time.time() * 1000)


def compact_open_periods(config: ReconcileConfig) -> CompactionReport:
    """Compact the batch files of the open periods (`billing.store.compaction.compact_open`, the kinds of
    `OPEN_KINDS`) up to the same batch as `compact_closed_periods`; the stream's newer batches are left as written
    for the next pass. The caller holds the run lock."""
    layout = config.layout
    # The quarantine's and `released/`'s chunk under way, up to the same batch (the closed pass takes whole ones).
    return open_pass(layout, open_periods(layout, closed_periods(layout)), compaction_position(config))


def compaction_position(config: ReconcileConfig) -> int | None:
    """The newest batch compaction may take now (`compactable_through`); None without a checkpoint or while Redis
    cannot say."""
    from attribution.epoch import CommittedBatch
    from attribution.stream_position import BILLING_QUERY

    committed = CommittedBatch(config.layout.checkpoint(BILLING_QUERY)).batch()
    try:
        applied = redis_totals(config).last_applied(BILLING_QUERY) if committed is not None else None
    except Exception:  # Redis out of reach: its position unknown, nothing is compacted this time
        applied = None
    return compactable_through(committed, applied)


@dataclass
class OpenPasses:
    """The passes of `--every` over the open periods (`compact_open_periods`), one every
    `config.compact_interval_s` whatever the runs' schedule, made while it waits for its next run (`wait`)."""

    config: ReconcileConfig
    progress: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    due: float | None = None
    """When the next pass is due (None: at the first wait)."""
    passes: int = 0
    """Passes made (the lock held or a failure: not one)."""

    def wait(self, every_s: float) -> None:
        """Wait `every_s` seconds for the next run, making every pass due meanwhile under the run lock; a pass that
        finds the lock held, or fails (what it left half done is finished by the next holder of the lock), is said
        and made again at the next interval."""
        interval = self.config.compact_interval_s
        now = self.clock()
        run_at = now + every_s
        if interval > 0 and self.due is None:
            self.due = now
        while now < run_at:
            if interval > 0 and self.due is not None and now >= self.due:
                self._pass()
                now = self.clock()
                self.due = now + interval
            wake = run_at if interval <= 0 or self.due is None else min(run_at, self.due)
            if wake > now:
                self.sleep(wake - now)
            now = self.clock()

    def _pass(self) -> None:
        try:
            with run_lock(self.config):
                compacted = compact_open_periods(self.config)
                self.progress(compacted.describe())
                record_compaction(self.config, "open", compaction_record(compacted))
            self.passes += 1
        except ReconcileBusyError as exc:
            self.progress(f"compaction of the open periods waits: {exc}")
        except Exception as exc:  # the database's lock out of reach, a disk full: the runs go on all the same
            self.progress(f"compaction of the open periods failed, tried again at the next pass: {exc}")


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


def reconcile_ports(
    spark: SparkSession, config: ReconcileConfig, catalog: Catalog, clock: Callable[[], int]
) -> ReconcilePorts:
    """The ports of a reconciliation run over `config`'s data folder: Spark's final bills, the stores of the data
    folder, Redis, the stream's position, the clock, the release and the invoices.

    The run reads the archive and the ledger up to one batch: the last the stream's checkpoint had committed when
    the run first asked (`CommittedBatch`, after the stream's position), so that a batch committed between the two
    reads is in neither, and the next run reconciles it."""
    from attribution.epoch import CommittedBatch
    from attribution.final_bills import SparkFinalBills, final_charges
    from attribution.release import ReconciliationRelease
    from attribution.stream_position import BILLING_QUERY

    layout = config.layout
    through = CommittedBatch(layout.checkpoint(BILLING_QUERY))
    periods = Periods(config.period_ms)
    return ReconcilePorts(
        catalog=catalog,
        final_bills=lambda due: SparkFinalBills.of(
            final_charges(spark, layout, config.period_ms, due, catalog, through.batch(), config.ivt_rules),
            layout,
            due,
            config.ivt_rules,
        ),
        ledger=lambda: LedgerTable(
            ledger_up_to(read_ledger(layout.ledger), through.batch()), layout.ledger, through.batch()
        ),
        corrections=CorrectionFiles(layout),
        conflicts=ConflictFiles(layout, catalog, config.kafka_bootstrap, config.topic_quarantine),
        totals=lambda: redis_totals(config),
        exports=ExportFolders(layout),
        states=StateFile(layout),
        versions=lambda: data_versions(layout, periods, through.batch(), catalog.has_budgets),
        position=config.position,
        clock=clock,
        release=ReconciliationRelease(
            layout,
            catalog,
            through,
            periods,
            config.topics,
            config.registry_location,
            lambda: redis_totals(config),
        ),
        invoices=lambda versions, states, now_ms: issue_invoices(config, versions, states, clock),
    )


def redis_totals(config: ReconcileConfig) -> RedisTotals:
    """Redis as a run writes it, each call with the run's deadline (`ReconcileConfig.redis_timeout_ms`)."""
    return RedisTotals.from_url(config.redis_url, config.redis_prefix, timeout_s=config.redis_timeout_ms / 1000)


def issue_invoices(
    config: ReconcileConfig,
    versions: Mapping[str, int],
    states: Mapping[str, PeriodState],
    clock: Callable[[], int],
    only: str | None = None,
) -> list[str]:
    """Issue the monthly invoices of every month whose periods are all closed (`billing.invoices.Issuer.issue_ready`)
    from the exports and the corrections of the data folder, and the billing profiles and campaign names of the database
    (`config.database_url`); what was done, in words. A failure is said, not raised: the reconciliation run's work
    stands, and the next run (or `adbill invoices issue`) tries again. While the database cannot be reached no invoice
    is issued: an invoice keeps the profile and the names it was issued with, never none for want of them. The invoices
    and their numbers are the database's (`billing.store.invoice_db`); a file an issuer did not write (it stopped after
    its commit) is written from the database here."""
    layout = config.layout
    if not config.database_url:
        if only is not None:
            raise InvoiceError("invoices are issued with the billing profiles of the database, and none is set")
        return ["invoices not issued: no database holds the billing profiles (ReconcileConfig.database_url)"]
    book = InvoiceDatabase(config.database_url, layout)
    try:
        issuer = Issuer(
            book,
            ExportInvoiceSource(layout),
            ProfileDatabase(config.database_url, imports=layout.billing_profiles_file).current(),
            clock,
            config.invoice_terms,
            NamesDatabase(config.database_url, imports=layout.names_file).named("campaign"),
        )
        done = issuer.issue_ready(PeriodClosing(Periods(config.period_ms), config.horizon_ms, versions, states), only)
        written = book.write_files()  # those an issuer committed and stopped before it wrote
    except (InvoiceError, InvoiceStoreError, OSError, ValueError, DatabaseUnavailable) as exc:
        if only is not None:
            raise
        return [f"invoices not issued: {exc}"]
    return done.describe() + ([f"invoice files written again from the database: {len(written)}"] if written else [])


def run_reconcile(
    settings: Settings, until_ms: int | None = None, every_s: int | None = None, force: bool = False
) -> int:
    """Reconcile once, or every `every_s` seconds until Ctrl-C/SIGTERM; prints what each run did. Exit codes:
    0 done (periods may be held: the output says why), 3 refused (a back-fill ahead of the stream without
    `force`), 4 another run holds the lock (a single run takes it before it starts Spark)."""
    from billing.reconcile_run import HeldError
    from billing.store.disk_space import probe_room, retry_while_disk_full
    from ops.spark import spark_session
    from ops.stack import ensure_catalog

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    status = ReconcileStatus(settings)
    running = ReconcileStatus.running(settings)
    # Room first: the run lock, Spark's scratch and event log, and the run's files are in the data folder.
    retry_while_disk_full(lambda: probe_room(settings.root), "starting reconciliation", settings.root, status)
    ensure_catalog(settings)
    catalogs = settings.catalog_store()
    config = reconcile_config(settings)
    with ExitStack() as held:
        try:
            if not every_s:
                held.enter_context(run_lock(config))
        except ReconcileBusyError as exc:
            print(f"reconcile: {exc}", file=sys.stderr, flush=True)
            return 4
        spark = spark_session(settings, "adbill-reconcile", settings.layout.spark_scratch("reconcile"), stateful=False)
        metrics = ReconcileMetrics.serve(settings) if every_s else None
        passes = OpenPasses(config, lambda message: print(f"reconcile: {message}", flush=True))
        try:
            while True:
                started = time.monotonic()
                running("a run is under way")
                try:
                    # A run stopped by a full disk is run again once there is room: it completes what it left.
                    report = retry_while_disk_full(
                        lambda: reconcile(
                            spark,
                            config,
                            fresh_catalog(settings, catalogs),
                            until_ms=until_ms,
                            progress=lambda message: print(f"reconcile: {message}", flush=True),
                            force=force,
                            locked=not every_s,
                        ),
                        "the reconciliation run",
                        settings.root,
                        status,
                    )
                    print(describe_run(report), flush=True)
                    if metrics:
                        metrics.done(report, time.monotonic() - started)
                    if every_s and settings.audit_after_close and report.closed:
                        audit_after_run(spark, config, catalogs.current())
                except HeldError as exc:
                    print(f"reconcile: {exc}", file=sys.stderr, flush=True)
                    if metrics:
                        metrics.outcome("refused", time.monotonic() - started)
                    if not every_s:
                        return 3
                except ReconcileBusyError as exc:
                    print(f"reconcile: {exc}", file=sys.stderr, flush=True)
                    if metrics:
                        metrics.outcome("busy", time.monotonic() - started)
                finally:
                    running(None)
                if not every_s:
                    return 0
                passes.wait(every_s)
        except KeyboardInterrupt:
            return 0
        finally:
            spark.stop()


def fresh_catalog(settings: Settings, store: CatalogDatabase) -> Catalog:
    """The catalog as the database holds it now. While the database cannot be reached, the run waits and says why
    (on the health page too): it never reconciles with a catalog that may be behind the changes made."""
    from billing.store.catalog_db import DatabaseUnavailable
    from billing.store.part_status import RECONCILE_PART, WAITING_FOR_DATABASE, PartStatus

    status = PartStatus(settings.redis_url, settings.redis_prefix, RECONCILE_PART, WAITING_FOR_DATABASE)
    waited = False
    while True:
        try:
            catalog = store.current(fresh=True)
        except DatabaseUnavailable as exc:
            status(str(exc))
            print(f"reconcile: waiting: {exc}", file=sys.stderr, flush=True)
            waited = True
            time.sleep(CATALOG_RETRY_S)
            continue
        if waited:
            status(None)
        return catalog


CATALOG_RETRY_S = 5
"""How often reconciliation tries the catalog's database again while it cannot be reached."""


class ReconcileStatus:
    """Reconciliation's status record (`billing.store.part_status`), and the same on its output."""

    def __init__(self, settings: Settings) -> None:
        from billing.store.part_status import RECONCILE_PART, PartStatus

        self.record = PartStatus(settings.redis_url, settings.redis_prefix, RECONCILE_PART)

    def __call__(self, message: str | None) -> None:
        print(f"reconcile: {message or 'disk space is back: going on'}", file=sys.stderr, flush=True)
        self.record(message)

    @staticmethod
    def running(settings: Settings) -> Callable[[str | None], None]:
        """The record of a run under way (`RECONCILE_RUN_PART`), for the health page: set at a run's start, removed
        at its end."""
        from billing.store.part_status import RECONCILE_RUN_PART, RUNNING, PartStatus

        return PartStatus(settings.redis_url, settings.redis_prefix, RECONCILE_RUN_PART, state=RUNNING)


class ReconcileMetrics:
    """Prometheus metrics of `adbill reconcile --every`, on `ADBILL_RECONCILE_METRICS_PORT`: runs by outcome, their
    durations, the periods closed and the corrections booked; and the held periods of the last run (read from Redis,
    as the job's `/metrics` shows them too)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.runs = Counter("adbill_reconcile_runs", "Reconciliation runs, by outcome", ["outcome"], registry=registry)
        self.duration = Histogram(
            "adbill_reconcile_run_duration_seconds",
            "Wall time of a reconciliation run",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )
        self.closed = Counter("adbill_reconcile_periods_closed", "Periods closed and exported", registry=registry)
        self.corrections = Counter(
            "adbill_reconcile_corrections", "Corrections booked, by kind", ["kind"], registry=registry
        )
        for outcome in ("done", "refused", "busy"):
            self.runs.labels(outcome)
        for kind in ("addition", "retraction"):
            self.corrections.labels(kind)

    @classmethod
    def serve(cls, settings: Settings) -> ReconcileMetrics | None:
        """The metrics, served on loopback (all interfaces when Kafka is elsewhere: a cluster); None when off."""
        if not settings.reconcile_metrics_port:
            return None
        from prometheus_client import CollectorRegistry, start_http_server

        from attribution.progress import ReconciliationCollector

        registry = CollectorRegistry()
        registry.register(ReconciliationCollector(settings.redis_url, settings.redis_prefix))
        host = "127.0.0.1" if settings.kafka_is_local else "0.0.0.0"  # nosec B104: a cluster's Prometheus scrapes it
        start_http_server(settings.reconcile_metrics_port, addr=host, registry=registry)
        return cls(registry)

    def done(self, report: RunReport, seconds: float) -> None:
        self.outcome("done", seconds)
        self.closed.inc(len(report.closed))
        self.corrections.labels("addition").inc(report.additions)
        self.corrections.labels("retraction").inc(report.retractions)

    def outcome(self, outcome: str, seconds: float) -> None:
        self.runs.labels(outcome).inc()
        self.duration.observe(seconds)


def audit_after_run(spark: object, config: ReconcileConfig, catalog: Catalog) -> None:
    """The audit after a run that closed periods (`ADBILL_AUDIT_AFTER_CLOSE`), with the catalog the run closed them
    with, so that finance's page says the books are proven; a failure is said and the schedule goes on."""
    from attribution.audit import audit

    try:
        with run_lock(config, wait_s=AUDIT_LOCK_WAIT_S):  # no compaction while Spark lists and reads the archive
            audits = audit(spark, config, catalog)  # type: ignore[arg-type]
        record_audit(config, audits)
    except Exception as exc:  # the audit is a check: reconciliation's schedule must not stop for it
        print(f"reconcile: the audit after the run failed: {exc}", file=sys.stderr, flush=True)
        return
    print(audit_table(audits).splitlines()[-1], flush=True)


AUDIT_LOCK_WAIT_S = 600.0
"""How long the audit waits for a reconciliation run to let go of the run lock (the audit reads the batch folders,
which a run's compaction rewrites)."""


def run_audit(settings: Settings) -> int:
    """`adbill audit`: print the books against the rule per period; 1 when a closed period differs, 4 when a
    reconciliation run held the run lock for longer than `AUDIT_LOCK_WAIT_S`, else 0 (an open period that differs
    is awaiting close: its late data is corrected when it closes)."""
    from attribution.audit import audit
    from ops.spark import spark_session
    from ops.stack import ensure_catalog

    logging.getLogger("py4j").setLevel(logging.WARNING)
    ensure_catalog(settings)
    spark = spark_session(settings, "adbill-audit", settings.layout.spark_scratch("audit"), stateful=False)
    config = reconcile_config(settings)
    try:
        with run_lock(config, wait_s=AUDIT_LOCK_WAIT_S):  # no compaction while Spark lists and reads the archive
            audits = audit(spark, config, settings.catalog_store().current(fresh=True))
    except ReconcileBusyError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 4
    finally:
        spark.stop()
    record_audit(config, audits)
    print(audit_table(audits))
    return 0 if all(a.balanced or not a.closed for a in audits) else 1


def audit_outcome(audits: list[PeriodAudit], ran_at_ms: int) -> dict[str, object]:
    """What the audit keeps of its run: the closed periods that differ (`differences`: what finance was given is
    wrong, a failure: the health page's red, `adbill_audit_periods_differing` and its alert) apart from the open
    ones that differ (`awaiting_close`: the stream's ledger before the close corrects it, no failure)."""
    return {
        "ran_at_ms": ran_at_ms,
        "periods": len(audits),
        "differences": [a.period for a in audits if a.closed and not a.balanced],
        "awaiting_close": [a.period for a in audits if not a.closed and not a.balanced],
        "rule_micros_by_currency": sum((a.rule_micros for a in audits), Amounts()).as_dict(),
        "books_micros_by_currency": sum((a.books_micros for a in audits), Amounts()).as_dict(),
    }


def record_audit(config: ReconcileConfig, audits: list[PeriodAudit], ran_at_ms: int | None = None) -> None:
    """Keep the audit's outcome (`audit_outcome`) beside the reconciliation state and in Redis, where the finance
    and health pages and the job's `/metrics` read it."""
    outcome = audit_outcome(audits, ran_at_ms if ran_at_ms is not None else int(time.time() * 1000))
    save_record(config.layout.last_audit_file, outcome)
    RedisTotals.from_url(config.redis_url, config.redis_prefix).record_audit(outcome)


def audit_table(audits: list[PeriodAudit]) -> str:
    """The audit as a table: per period the rule's clicks and the books', and their micros in each currency (a line
    per currency, never added together), and the verdict."""
    header = (
        f"{'period':<16}{'status':<8}{'rule clicks':>12}{'books clicks':>13}  {'currency':<9}{'rule micros':>20}"
        f"{'books micros':>20}  "
    )
    lines = [header + "verdict"]
    for a in audits:
        differences = [
            f"{a.books_micros.get(c, 0) - a.rule_micros.get(c, 0):+,} {c} micros"
            for c in a.currencies
            if a.books_micros.get(c, 0) != a.rule_micros.get(c, 0)
        ]
        verdict = (
            "ok"
            if a.balanced
            else ("DIFFERS" if a.closed else "awaiting close: differs")
            + f" by {a.books_clicks - a.rule_clicks:+,} clicks"
            + "".join(f", {d}" for d in differences)
            + (f"; {a.problems[0]}" if a.problems else "")
        )
        period = f"{a.period:<16}{'closed' if a.closed else 'open':<8}"
        clicks = f"{a.rule_clicks:>12,}{a.books_clicks:>13,}  "
        for n, currency in enumerate(a.currencies or [""]):
            money = f"{currency:<9}{a.rule_micros.get(currency, 0):>20,}{a.books_micros.get(currency, 0):>20,}  "
            # One line per currency, each naming its period; the clicks and the verdict on the period's first.
            line = period + (clicks if n == 0 else " " * len(clicks)) + money + (verdict if n == 0 else "")
            lines.append(line.rstrip())
    differing = [a.period for a in audits if a.closed and not a.balanced]
    awaiting = [a.period for a in audits if not a.closed and not a.balanced]
    waits = f"; open, awaiting close: {', '.join(awaiting)}" if awaiting else ""
    if not audits:
        lines.append("audit: no period has data yet")
    elif differing:
        lines.append(f"audit: {len(differing)} of {len(audits)} period(s) differ: {', '.join(differing)}{waits}")
    elif awaiting:
        lines.append(
            f"audit: every closed period balances; {len(awaiting)} open period(s) differ until they close, awaiting "
            f"close: {', '.join(awaiting)}"
        )
    else:
        lines.append(f"audit: all {len(audits)} period(s) balance, to the click and the micro")
    return "\n".join(lines)


def net_by_currency(micros: Mapping[str, int]) -> str:
    """Signed micros per currency, never added together: `+500,000 EUR micros, -40,000,000 JPY micros`."""
    return ", ".join(f"{m:+,} {c} micros" for c, m in sorted(micros.items())) or "0 micros"


def describe_run(report: RunReport) -> str:
    held = "".join(f"\nreconcile: period {period} {reason}" for period, reason in report.held.items())
    invoices = "".join(f"\nreconcile: {line}" for line in report.invoices)
    released = f"; {report.released} record(s) released from quarantine" if report.released else ""
    if not report.periods:
        if held:
            return f"reconcile: nothing closed{released}; {len(report.held)} period(s) held{held}{invoices}"
        return (
            "reconcile: nothing due (no period is past its lateness horizon, and no closed one got new data or "
            f"new prices){released}{invoices}"
        )
    return (
        f"reconcile: {len(report.periods)} period(s) in {report.duration_ms / 1000:.1f} s; "
        f"closed {', '.join(report.closed) or 'none'}; {report.additions} addition(s), "
        f"{report.retractions} retraction(s), net {net_by_currency(report.net_micros_by_currency)}; "
        f"{report.final_clicks:,} billable click(s), {report.conflicts} new id conflict(s)"
        f"{released}"
        f"{f'; {len(report.held)} period(s) held' if held else ''}{held}{invoices}"
    )


def rebuild_click_filters(settings: Settings, day: str | None) -> int:
    """`adbill click-filters`: write the day filters of `day`'s closed periods (`YYYY-MM-DD`), or of every closed
    period, from their files as they are, under the run lock (a run writes them too); a progress line a day."""
    from billing.store.click_files import ClickFiles, parse_day

    config = reconcile_config(settings)
    try:
        prefix = parse_day(day).strftime("%Y%m%d") if day else ""
    except ValueError as exc:
        print(f"click-filters: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        with run_lock(config, wait_s=60.0):
            closed = sorted(p for p in closed_periods(config.layout) if p.startswith(prefix))
            if not closed:
                where = f" of {day}" if day else ""
                print(f"click-filters: no closed period{where}: nothing to write", file=sys.stderr)
                return 1
            files = ClickFiles(config.layout)
            hashed = files.write_filters(closed, lambda line: print(line, flush=True))
            counted = files.write_counts(closed, lambda line: print(line, flush=True))
            chunks = files.refresh_chunk_filters()
    except ReconcileBusyError as exc:
        print(f"click-filters: {exc}", file=sys.stderr)
        return 1
    print(
        f"click-filters: {len(closed)} period(s), {hashed:,} click ids, the price counts of {len(counted)} period(s), "
        f"{chunks} quarantine chunk(s), "
        f"{time.monotonic() - started:.1f} s (in {config.layout.click_day_filters} and {config.layout.price_counts})"
    )
    return 0


def export_periods(settings: Settings, first: str, last: str | None, out: Path) -> int:
    """Copy the exports of closed periods `first`..`last` to `out/PERIOD/`; an open period is an error."""
    from billing.periods import Periods
    from billing.store.export_files import copy_export

    periods = Periods(settings.period_ms)
    try:
        start = periods.parse_key(first)
        end = periods.parse_key(last) if last else start
    except ValueError as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    if end < start:
        print(f"export: --to {last} is before {first}", file=sys.stderr)
        return 2
    wanted = periods.range_keys(start, end + periods.length_ms)
    missing = [p for p in wanted if not settings.layout.export(p).exists()]
    if missing:
        print(
            f"export: not closed yet (no export): {', '.join(missing)}; run `adbill reconcile` after the "
            "lateness horizon, or `adbill reconcile --until TIME` to close periods by hand",
            file=sys.stderr,
        )
        return 1
    for period in wanted:
        copied = copy_export(settings.root, period, out)
        print(f"export: {period} -> {copied}")
    return 0
