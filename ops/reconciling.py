"""Wiring of reconciliation and the finance exports: settings -> ReconcileConfig, a Spark session, the schedule."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from billing.money import Amounts
from ops.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from attribution.audit import PeriodAudit
    from attribution.closing import ReconcileConfig
    from billing.catalog import Catalog
    from billing.closing_run import RunReport
    from billing.store.catalog_db import CatalogDatabase


def parse_time(text: str, option: str = "--until") -> int:
    """Epoch ms from `1767225600000` or an ISO-8601 time (UTC unless it says otherwise)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise SystemExit(
            f"{option}: {text!r} is neither epoch ms nor an ISO-8601 time such as 2026-01-01T10:00Z"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def reconcile_config(settings: Settings) -> ReconcileConfig:
    from attribution.closing import ReconcileConfig
    from billing.invoices import InvoiceTerms

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
    )


def run_reconcile(
    settings: Settings, until_ms: int | None = None, every_s: int | None = None, force: bool = False
) -> int:
    """Reconcile once, or every `every_s` seconds until Ctrl-C/SIGTERM; prints what each run did. Exit codes:
    0 done (periods may be held: the output says why), 3 refused (a back-fill ahead of the stream without
    `force`), 4 another run holds the lock (a single run takes it before it starts Spark)."""
    from attribution.closing import run_closing, run_lock
    from billing.closing_run import HeldError, ReconcileBusyError
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
        try:
            while True:
                started = time.monotonic()
                running("a run is under way")
                try:
                    # A run stopped by a full disk is run again once there is room: it completes what it left.
                    report = retry_while_disk_full(
                        lambda: run_closing(
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
                    refresh_click_index(settings)
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
                time.sleep(every_s)
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


def refresh_click_index(settings: Settings) -> None:
    """Bring the click index up to date after a run (`billing.store.click_index`), so that a click's story does not
    index a long stretch of new batches itself; a failure is said and the run goes on (the next lookup refreshes)."""
    import sqlite3

    from billing.store.click_index import ClickIndex

    started = time.monotonic()
    try:
        if ClickIndex(settings.layout, lock_wait_s=0).refresh():
            print(f"reconcile: click index up to date in {time.monotonic() - started:.1f} s", flush=True)
    except (OSError, sqlite3.Error) as exc:
        print(f"reconcile: the click index was not brought up to date: {exc}", file=sys.stderr, flush=True)


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
        audits = audit(spark, config, catalog)  # type: ignore[arg-type]
        record_audit(config, audits)
    except Exception as exc:  # the audit is a check: reconciliation's schedule must not stop for it
        print(f"reconcile: the audit after the run failed: {exc}", file=sys.stderr, flush=True)
        return
    print(audit_table(audits).splitlines()[-1], flush=True)


def run_audit(settings: Settings) -> int:
    """`adbill audit`: print the books against the rule per period; 1 when a closed period differs, else 0 (an open
    period that differs is awaiting close: its late data is corrected when it closes)."""
    from attribution.audit import audit
    from ops.spark import spark_session
    from ops.stack import ensure_catalog

    logging.getLogger("py4j").setLevel(logging.WARNING)
    ensure_catalog(settings)
    spark = spark_session(settings, "adbill-audit", settings.layout.spark_scratch("audit"), stateful=False)
    config = reconcile_config(settings)
    try:
        audits = audit(spark, config, settings.catalog_store().current(fresh=True))
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
    from attribution.restore import save_record
    from billing.store.redis_totals import RedisTotals

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
