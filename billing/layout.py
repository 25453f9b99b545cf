"""The data folder's layout: where each thing adbill keeps lives under its root (`ADBILL_HOME`).

The only module that spells a path of the data folder; every writer and reader asks it. Pure: it names paths and
touches nothing (no file is read, made or listed here).

```
ROOT/
  ledger/period=P/batch_id=N/             the stream's provisional bills (Parquet)
  archive/event_type=T/period=P/batch_id=N/   every valid event received, with its `late` flag
  quarantine/batch_id=N/                  bad input
  released/batch_id=N/                    quarantined records of a schema id learnt later, settled into batch N
  unbilled/period=P/batch_id=N/           clicks the stream matched but the catalog priced nothing at their time
  not_charged/period=P/batch_id=N/        priced clicks the stream did not charge: invalid traffic, over budget
  .../period=P/batch_id=M/compacted-A-M.parquet   of the ledger, archive, unbilled and not_charged: a
                                          period's batches A to M in one file (closed, and the cold batches
                                          of an open one), in the folder of the newest
                                          (`source_batch_id`: each row's batch; billing.store.compaction)
  quarantine|released/batch_id=M/compacted-A-M.parquet   their batches A to M of one chunk of 3,600 ids
  checkpoints/QUERY/                      Spark's checkpoint of a streaming query (+ adbill-epoch.json)
  checkpoints/catalog-versions/N          the catalog version the stream priced batch N with
  checkpoints/decisions/N.parquet         what the stream decided for each bill of batch N (charged, or why not)
  checkpoints/QUERY.lock                  held by the streaming job while it runs
  checkpoints/release.lock                held by whoever releases quarantined records (the job, reconciliation)
  uncommitted/...                         files of batches no checkpoint committed, set aside by a new epoch
  corrections/period=P/run-ID.parquet     corrections, one file per corrected period and run
  conflicts/period=P.parquet              id conflicts found by reconciliation
  exports/P/                              a closed period's finance export, never rewritten
  invoices/MONTH/ADVERTISER.json          an invoice, written from the database once issued (never rewritten)
  reconcile/                              periods.json (state), conflicts-sent.json, last-run.json,
                                          last-audit.json, lock (one run at a time), compaction.json (the
                                          compaction under way)
  kafka/ redis/ run/ logs/ runs/ spark-events/ spark-tmp*/   services, processes, logs and Spark's scratch
  catalog.json users.json api-tokens.json web-secret.key   defaults of their settings
  schemas.json                            the schema registry written before the database: taken in once
                                          (`billing.store.schema_registry`), then set aside as .imported
  catalog-changes.jsonl                   the catalog's change log, beside the catalog file (its store's)
  billing-profiles.json                   the billing profiles written before the database: taken in once
                                          (`billing.store.profiles_db`), then set aside as .imported
  names.json                              the names of campaigns and ads written before the database: taken
                                          in once (`billing.store.names_db`), then set aside as .imported
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EPOCH_FILE = "adbill-epoch.json"
"""A checkpoint's epoch, inside its folder (`attribution.epoch`)."""


@dataclass(frozen=True)
class DataLayout:
    """Every path under one data folder's root."""

    root: Path

    # What the streaming job writes.
    @property
    def ledger(self) -> Path:
        return self.root / "ledger"

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    def archive_of(self, event_type: str) -> Path:
        """The archive of one event type (`impression`, `click`), partitioned by period and batch."""
        return self.archive / f"event_type={event_type}"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def released(self) -> Path:
        """Which quarantined records each release settled, by the batch it settled them into
        (`attribution.release`)."""
        return self.root / "released"

    @property
    def unbilled(self) -> Path:
        """Clicks the rule matched that had no price at their time (`billing.catalog.Unbillable`), by period."""
        return self.root / "unbilled"

    @property
    def not_charged(self) -> Path:
        """Priced clicks the stream did not charge (an invalid traffic rule, `over_budget`), with the reason."""
        return self.root / "not_charged"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def decisions(self) -> Path:
        """One file per micro-batch: each bill's outcome as the stream first decided it, so that a replay decides the
        same."""
        return self.checkpoints / "decisions"

    @property
    def catalog_versions(self) -> Path:
        """One file per micro-batch: the catalog version the stream priced it with, so a replay prices the same."""
        return self.checkpoints / "catalog-versions"

    def checkpoint(self, query: str) -> Path:
        """The checkpoint folder of a streaming query."""
        return self.checkpoints / query

    def epoch_file(self, query: str) -> Path:
        return self.checkpoint(query) / EPOCH_FILE

    def job_lock(self, query: str) -> Path:
        """Locked by the streaming job while it runs (`attribution.job`); `adbill restore-redis` checks it."""
        return self.checkpoints / f"{query}.lock"

    @property
    def release_lock(self) -> Path:
        """Held while quarantined records are released, by the job or reconciliation (`attribution.release`)."""
        return self.checkpoints / "release.lock"

    @property
    def uncommitted(self) -> Path:
        """Where a new epoch sets aside the files of batches that no checkpoint committed (`attribution.epoch`)."""
        return self.root / "uncommitted"

    # What reconciliation writes.
    @property
    def corrections(self) -> Path:
        return self.root / "corrections"

    def corrections_of(self, period: str) -> Path:
        """The corrections of one corrected period: one `run-ID.parquet` per run."""
        return self.corrections / f"period={period}"

    @property
    def conflicts(self) -> Path:
        return self.root / "conflicts"

    def conflicts_of(self, period: str) -> Path:
        """Every id conflict of a period, in one Parquet file."""
        return self.conflicts / f"period={period}.parquet"

    @property
    def exports(self) -> Path:
        return self.root / "exports"

    def export(self, period: str) -> Path:
        """The folder of a closed period's export."""
        return self.exports / period

    @property
    def invoices(self) -> Path:
        """The monthly invoices' files, one folder per month, written from the database (`billing.store.invoice_db`);
        an earlier release's register, plans and lock there are taken in once."""
        return self.root / "invoices"

    @property
    def billing_profiles_file(self) -> Path:
        """The billing profiles' file of a data folder written before the database, taken into it once
        (`billing.store.profiles_db`)."""
        return self.root / "billing-profiles.json"

    @property
    def names_file(self) -> Path:
        """The names' file of a data folder written before the database, taken into it once
        (`billing.store.names_db`)."""
        return self.root / "names.json"

    @property
    def reconcile(self) -> Path:
        """Reconciliation's own state: the period states, the conflicts sent, the last records, the run lock."""
        return self.root / "reconcile"

    @property
    def periods_file(self) -> Path:
        return self.reconcile / "periods.json"

    @property
    def crawler_lists(self) -> Path:
        """The crawler list's versions that closed periods were judged with, one file each."""
        return self.reconcile / "crawler-lists"

    @property
    def conflicts_sent_file(self) -> Path:
        """The id conflicts already on the quarantine topic: period -> `topic/partition/offset` of each."""
        return self.reconcile / "conflicts-sent.json"

    @property
    def last_run_file(self) -> Path:
        """The last reconciliation run's record, for `adbill restore-redis`."""
        return self.reconcile / "last-run.json"

    @property
    def last_audit_file(self) -> Path:
        return self.reconcile / "last-audit.json"

    @property
    def run_lock(self) -> Path:
        return self.reconcile / "lock"

    @property
    def compaction_journal(self) -> Path:
        """The compaction under way (`billing.store.compaction`): written before its file, removed after the last
        removal; whoever takes the run lock next completes or rolls back what it names."""
        return self.reconcile / "compaction.json"

    @property
    def click_day_filters(self) -> Path:
        """The day filters of click ids (`billing.store.click_filters`), a file a UTC day."""
        return self.root / "index" / "click-days"

    def click_day_filter(self, day: str) -> Path:
        """The filter file of the UTC day `day` (`YYYYMMDD`)."""
        return self.click_day_filters / f"{day}.bloom"

    @property
    def price_counts(self) -> Path:
        """The closed periods' book rows counted by ad and price (`billing.store.price_counts`), a file a UTC day."""
        return self.root / "index" / "price-counts"

    def price_counts_day(self, day: str) -> Path:
        """The counts file of the UTC day `day` (`YYYYMMDD`)."""
        return self.price_counts / f"{day}.parquet"

    # Services, processes and defaults of the settings.
    @property
    def kafka(self) -> Path:
        return self.root / "kafka"

    @property
    def redis(self) -> Path:
        return self.root / "redis"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def runs(self) -> Path:
        """Records of `adbill up` and of simulator runs, one folder each."""
        return self.root / "runs"

    @property
    def spark_events(self) -> Path:
        return self.root / "spark-events"

    def spark_scratch(self, job: str = "") -> Path:
        """Spark's local scratch folder of a job (`stream` has `spark-tmp`, the others `spark-tmp-JOB`)."""
        return self.root / ("spark-tmp" if job in ("", "stream") else f"spark-tmp-{job}")

    @property
    def catalog_file(self) -> Path:
        return self.root / "catalog.json"

    @property
    def users_file(self) -> Path:
        return self.root / "users.json"

    @property
    def api_tokens_file(self) -> Path:
        return self.root / "api-tokens.json"

    @property
    def web_secret_file(self) -> Path:
        return self.root / "web-secret.key"

    @property
    def schemas_file(self) -> Path:
        """The schema registry file of a data folder written before the database, taken in once."""
        return self.root / "schemas.json"
