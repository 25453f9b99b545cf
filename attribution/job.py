"""The streaming attribution job: Kafka impressions and clicks in; billed clicks, the event archive and quarantine
out, to Parquet and Redis, exactly once.

One named query, `billing`, with one checkpoint folder. Each micro-batch carries two kinds of rows, a union
of two branches over the same two Kafka sources, so that everything a batch read is written under that
batch's id, together:

- `bill`: decode -> valid -> watermark per stream (on the earlier of event time and Kafka's receipt time,
  `watermarked()`) -> `match_clicks()` (the stream-stream join by `ad_id`, `user_id`, first match per click),
  priced in the sink by the catalog's history at each click's time (`attribution.pricing`);
- `intake`: every record received: valid events go to the archive that reconciliation reads, flagged `late`
  when the watermark kept them out of the join and counted when their clock was ahead of Kafka's; bad input
  goes to the quarantine table and topic.

The catalog is read again for every micro-batch (`billing.store.catalog_db.CatalogDatabase`: its head row, and the
entries made since the version held when it moved), so a change is seen by the next batch, without a restart; while
the database cannot be reached, batches are priced with the catalog held, and the health page says so. The version
a batch is first priced with is kept (`DataLayout.catalog_versions`) and a replay of that batch prices with the same
version: the ledger files a replay writes are those the first attempt wrote, and Redis (which skips the replay)
agrees with them.

The sink (`BatchSink`) has the executors write the ledger, the archive and the quarantine table as Parquet under
`.../batch_id=N/` (`attribution.batch_output`: a replayed batch replaces its own files and nothing else) and send
bad records to the quarantine topic; the driver receives only each task's figures, and applies the batch's
totals, late, clock-ahead and quarantine counts to Redis in one Lua script that skips a batch id it has already
applied.

The job receives its sources' addresses and its sinks' places in a `StreamConfig`; `ops` builds that from the
settings, so the same job runs in local mode and against a Spark cluster.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from attribution.batch_output import (
    FIGURES_DDL,
    KIND,
    RECEIVED_COLUMNS,
    PartitionWriter,
    batch_figures,
    prune_batch_folders,
    write_batch_files,
)
from attribution.charging import Charging
from attribution.decode import QUARANTINE_COLUMNS, decode_events, quarantined_value, split
from attribution.epoch import CheckpointRefusedError, Epoch, prepare_epoch
from attribution.job_lock import JobLock, JobLockedError
from attribution.join import AHEAD_OF_RECEIPT, WATERMARK_TS, match_clicks, watermarked
from attribution.progress import Heartbeat
from attribution.release import Release, release_quarantined
from attribution.schema_follow import FollowingQuery, SchemaSwitch, WriterSchemaWatch, _Generation, registered_versions
from attribution.session import JOIN_STATE_FORMAT
from attribution.stream_position import BILLING_QUERY, end_offsets
from billing.catalog import Catalog
from billing.invalid import DEFAULT_RULES, IvtRules
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.catalog_db import CatalogDatabase
from billing.store.dead_letters import DeadLetters
from billing.store.durable import write_whole
from billing.store.part_status import PRICING_WITH_HELD, STREAM_CATALOG_PART, PartStatus
from billing.store.redis_totals import DayTotalsMovedError, RedisTotals
from billing.store.schema_registry import SchemaRegistryError, open_registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamConfig:
    """Everything the job reads and writes, and how it keeps time."""

    kafka_bootstrap: str
    topic_impressions: str
    topic_clicks: str
    topic_quarantine: str
    impression_schemas: dict[int, str]
    """Schema id -> Avro schema text of every version of the impressions subject."""
    click_schemas: dict[int, str]
    data_dir: Path
    redis_url: str
    redis_prefix: str
    impression_watermark_ms: int
    click_watermark_ms: int
    clock_tolerance_ms: int = 60_000
    """How far an event's time may be ahead of its receipt by Kafka before it is counted as clock ahead."""
    trigger_ms: int = 1_000
    period_ms: int = 3_600_000
    max_offsets_per_trigger: int = 200_000
    starting_offsets: str = "earliest"
    epoch: Epoch = Epoch()
    """Where this checkpoint's batch ids start and, for a new epoch, the offsets it reads from (`attribution.epoch`)."""
    redis_timeout_ms: int = 5_000
    """Deadline of one Redis call of the sink, tried again a few times before the batch fails
    (`billing.store.redis_totals.connect`)."""
    registry_location: str | None = None
    """Where the job asks for schema versions registered while it runs (`attribution.schema_follow`); None: it
    decodes `impression_schemas` and `click_schemas` only, and never starts its query again for new ones."""
    write_on_executors: bool = True
    """Each task writes its share of a batch on its executor, and the driver receives figures only (on a cluster);
    False: the batch is collected to the driver and written there (in local mode, where the executors are the
    driver's own threads and a Python worker per task only adds a hop)."""
    database_url: str | None = None
    """The database of the ad catalog (`billing.store.catalog_db`), read by version before each batch."""
    catalog_file: Path | None = None
    """A catalog file written before the database, taken in when the database holds none; the layout's
    `catalog.json` when None."""
    ivt_rules: IvtRules = DEFAULT_RULES
    """The thresholds of the flood and duplicate rules (`billing.invalid`)."""
    judge_invalid: bool = True
    """Whether the stream filters invalid traffic live (False only to measure what the rules cost)."""
    hold_budgets: bool = True
    """Whether the stream holds campaigns to their daily budgets live (False only to measure what it costs)."""

    @property
    def layout(self) -> DataLayout:
        """Where in `data_dir` the job writes (`billing.layout`)."""
        return DataLayout(self.data_dir)

    @property
    def catalog_path(self) -> Path:
        return self.catalog_file or self.layout.catalog_file


FETCH_MAX_WAIT_MS = 10
"""How long the broker may hold a fetch that finds no new records (the Kafka client's `fetch.max.wait.ms`)."""


def kafka_stream(spark: SparkSession, config: StreamConfig, topics: list[str]) -> DataFrame:
    """Records of `topics`, from the earliest offsets on a first start, from the checkpoint after that."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka_bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", _starting_offsets(config, topics))
        .option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
        .option("failOnDataLoss", "true")
        # A consumer that read to the end of a partition leaves a fetch waiting at the broker; the next batch's
        # read of that partition waits for it to come back. The client's default wait is 500 ms, per task.
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        .load()
    )


def _starting_offsets(config: StreamConfig, topics: list[str]) -> str:
    """Where a new checkpoint starts reading: the epoch's offsets of the topic, else `config.starting_offsets`."""
    if len(topics) == 1:
        return config.epoch.spark_starting_offsets(topics[0]) or config.starting_offsets
    return config.starting_offsets


def attribution_stream(spark: SparkSession, config: StreamConfig) -> DataFrame:
    """The job's output: matched clicks to bill (`KIND` `bill`, priced by the sink) and every record received
    (`KIND` `intake`: valid events with a null `reason`, bad input with its reason)."""
    impressions = decode_events(
        kafka_stream(spark, config, [config.topic_impressions]), "impression", config.impression_schemas
    )
    clicks = decode_events(kafka_stream(spark, config, [config.topic_clicks]), "click", config.click_schemas)
    valid_impressions, _ = split(impressions)
    valid_clicks, _ = split(clicks)
    bills = match_clicks(
        _observed(watermarked(valid_impressions, config.impression_watermark_ms), "impressions", config),
        _billed_live(_observed(watermarked(valid_clicks, config.click_watermark_ms), "clicks", config), config),
        carry=("user_agent", "ip"),
    )
    # The crawler list is matched on the driver, once per distinct user agent (attribution.charging): in the JVM
    # each matched click's text was searched again, a fifth of the job's CPU at 20,000 events/s.
    bills = bills.drop("click_ts")
    # One branch carries every record, valid or not, so each topic is read twice per batch (join, intake),
    # not three times.
    intake = _as_received(impressions, "impression", "impression_id").unionByName(
        _as_received(clicks, "click", "click_id")
    )
    return bills.withColumn(KIND, F.lit("bill")).unionByName(
        intake.withColumn(KIND, F.lit("intake")), allowMissingColumns=True
    )


def _billed_live(clicks: DataFrame, config: StreamConfig) -> DataFrame:
    """The clicks the stream may bill: those whose time is ahead of their receipt by no more than the clicks'
    watermark delay. A click further ahead stays in the stream's state by its receipt time, and the de-duplication
    of its bill ends while its own time is still to come: a copy re-sent minutes later would not be late, and
    would be billed again. Reconciliation bills such a click, once (it is counted as clock ahead meanwhile)."""
    return clicks.filter(F.col(AHEAD_OF_RECEIPT) <= F.expr(f"INTERVAL {int(config.click_watermark_ms)} MILLISECONDS"))


def _observed(events: DataFrame, stream: str, config: StreamConfig) -> DataFrame:
    """`events` with per-batch metrics for the health listener (`attribution.progress`): the largest watermark
    time (the stream's own watermark is that less its delay), rows, and rows whose clock is ahead."""
    ahead = F.col("event_time") > F.col("received_ms") + F.lit(config.clock_tolerance_ms)
    return events.observe(
        stream,
        F.max(F.unix_millis(F.col(WATERMARK_TS))).alias("max_watermark_time"),
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(ahead, True)).alias("clock_ahead"),
    )


def _as_received(decoded: DataFrame, event_type: str, id_col: str) -> DataFrame:
    return decoded.select(
        F.lit(event_type).alias("event_type"),
        F.col(id_col).alias("event_id"),
        *RECEIVED_COLUMNS[2:],  # ad_id .. ip: the event as the archive keeps it
        F.col("quarantine_reason").alias("reason"),
    )


DAY_TOTALS_TRIES = 5
"""How many times a batch is decided again when a campaign's day total moved between its read and the batch's apply
(a reconciliation run applying corrections at that moment)."""


class BatchSink:
    """Writes one micro-batch: the Parquet ledger, archive and quarantine and the quarantine topic on the
    executors, then Redis from the driver.

    Each task of the batch's one Spark job (`mapInArrow` over the query's own plan: nothing cached, no literal
    of the batch in generated code, so Spark compiles the batch's code once, not once per batch) writes its rows
    with pyarrow (`attribution.batch_output.PartitionWriter`), sends its bad records to the quarantine topic,
    and returns its figures: totals per period and ad, late, clock-ahead and quarantine counts, the files it
    wrote. Only those figures reach the driver, a few rows per ad and period; no event does, so the job's
    throughput is the executors', not one driver's. In local mode (`StreamConfig.write_on_executors` False) the
    same writer runs on the driver over the batch collected as Arrow (one file per folder, `part-00000`): there
    the executors are the driver's threads, and a Python worker per task costs about a second a batch.

    Parquet files of batch N live in `.../batch_id=N/`, one per task, named after its partition and each renamed
    into place, so a batch replayed after a crash replaces its own files and nothing else (the driver prunes any
    other file an earlier attempt left in those folders). Redis applies batch N only if N is above the last batch
    it applied, in one Lua script, so a crash between the writes, or after them and before Spark commits the
    batch, counts nothing twice and loses nothing. Batch N needs Redis to have applied every batch before it
    (`Epoch.needs_applied`): a Redis that lost its data, or its latest writes (a power loss, a copy from before
    them), stops the batch before it decides anything on the day totals it would read there, and again in the
    script that applies it; `adbill restore-redis` puts the figures back and the job replays the batch. The
    quarantine topic is at-least-once (a replayed batch is sent again, with the same keys); the quarantine table
    is exact.

    Every file is flushed to disk before Redis and the checkpoint hear of the batch. Bad records' bytes are cut
    to a size and a digest when larger than `QUARANTINE_VALUE_LIMIT`, so a junk record of a megabyte neither
    bloats the quarantine table nor fails the quarantine topic (`billing.store.dead_letters`). A Redis that does
    not answer fails its call after a deadline and a few tries (`redis_timeout_ms`): the batch then fails, and is
    replayed from the checkpoint when the job restarts.
    """

    def __init__(self, config: StreamConfig, catalog: CatalogDatabase) -> None:
        self.config = config
        self.catalog = catalog
        self.clock = _PhaseClock()
        """The steps of the batch running, for its log line: one for the sink's life, its watch of the collector
        registered once, restarted by each batch."""
        self.switch: SchemaSwitch | None = None
        """Set when a batch stopped the query for new schema versions (`attribution.schema_follow`)."""
        self.released = False
        """Whether this query's first batch released the quarantined records it can now decode."""
        self._said_behind: str | None = None
        """What the status record says of the catalog's database (`say_catalog_behind`)."""
        self.charging = Charging(
            config.layout,
            Periods(config.period_ms),
            config.ivt_rules,
            config.judge_invalid,
            config.hold_budgets,
            config.epoch.batch_id_base,
        )
        """Prices, judges and charges each batch's matched clicks (`attribution.charging`)."""

    def catalog_of(self, batch_id: int) -> Catalog:
        """The catalog batch `batch_id` is priced with: the version its first attempt used (a replay prices the
        same), else the current one, whose version is recorded before anything of the batch is written."""
        current = self.catalog.current()
        folder = self.config.layout.catalog_versions
        pin = folder / str(batch_id)
        if pin.exists():
            return current.as_of(int(pin.read_text()))
        write_whole(pin, str(current.version))
        if batch_id % 100 == 0:  # keep the versions of the last thousand batches
            for old in folder.glob("*"):
                if old.name.isdigit() and int(old.name) < batch_id - 1000:
                    old.unlink(missing_ok=True)
        return current

    def say_catalog_behind(self) -> None:
        """Record (for the health page and /readyz) when the catalog's database cannot be reached and the batches are
        priced with the catalog held, and remove the record when it is reached again; written on a change only."""
        behind = self.catalog.behind
        if behind == self._said_behind:
            return
        held = self.catalog.current().version
        message = None if behind is None else f"catalog version {held} since the database went away: {behind}"
        PartStatus(self.config.redis_url, self.config.redis_prefix, STREAM_CATALOG_PART, PRICING_WITH_HELD)(message)
        self._said_behind = behind

    @cached_property
    def totals(self) -> RedisTotals:
        """One Redis client for the sink's life, made on the first batch (foreachBatch runs on the driver)."""
        return RedisTotals.from_url(
            self.config.redis_url, self.config.redis_prefix, timeout_s=self.config.redis_timeout_ms / 1000
        )

    def __call__(self, batch: DataFrame, spark_batch_id: int) -> None:
        clock = self.clock.restart()
        self.stop_for_new_schemas()
        watermark = late_watermark_ms(batch.sparkSession, self.config.layout.checkpoint(BILLING_QUERY), spark_batch_id)
        # The batch id of every output: Spark's, continued from the earlier checkpoints' (`attribution.epoch`).
        batch_id = self.config.epoch.batch_id_base + spark_batch_id
        catalog = self.catalog_of(batch_id)
        self.say_catalog_behind()
        billed_at_ms = int(time.time() * 1000)
        writer = PartitionWriter(
            batch_id=batch_id,
            late_watermark_ms=watermark,
            period_ms=self.config.period_ms,
            clock_tolerance_ms=self.config.clock_tolerance_ms,
            archive_dir=self.config.layout.archive,
            quarantine_dir=self.config.layout.quarantine,
            quarantine_columns=tuple(QUARANTINE_COLUMNS),
        )
        task = _TaskWrite(writer, self.config.kafka_bootstrap, self.config.topic_quarantine)
        rows = batch.withColumns(quarantined_value(F.col("value"), F.col("reason").isNotNull()))
        clock.lap("prepare")
        if self.config.write_on_executors:
            written = rows.mapInArrow(task, FIGURES_DDL).toArrow()
        else:
            received = rows.toArrow()
            clock.lap("read")
            written = task.write(received, partition=0)
        clock.lap("write")
        advertiser_of = catalog.advertisers_by_ad
        figures = batch_figures(written, advertiser_of)
        # Nothing is decided on the day totals of a Redis that lost its data or its latest writes: the batch stops
        # here (RedisBehindError), before a decision is pinned, and is replayed after `adbill restore-redis`.
        needs = self.config.epoch.needs_applied(batch_id)
        start = self.totals.batch_day_charged(BILLING_QUERY, batch_id, needs, ())
        counted = start.last_applied is not None and start.last_applied >= batch_id
        for attempt in range(1, DAY_TOTALS_TRIES + 1):
            charged = self.charging.charge(
                batch_id,
                figures.bills,
                figures.clicks,
                catalog,
                watermark,
                billed_at_ms,
                lambda pairs: self.totals.batch_day_charged(BILLING_QUERY, batch_id, needs, pairs).day_charged,
                counted=counted,
            )
            files = [
                *figures.files,
                *write_batch_files(charged.ledger, self.config.layout.ledger, ("period", "batch_id"), prune=False),
                *write_batch_files(charged.unbilled, self.config.layout.unbilled, ("period", "batch_id"), prune=False),
                *write_batch_files(
                    charged.not_charged, self.config.layout.not_charged, ("period", "batch_id"), prune=False
                ),
            ]
            prune_batch_folders(files)
            clock.lap("charge")
            released = self.release(batch_id, advertiser_of)
            try:
                self.totals.apply_batch(
                    BILLING_QUERY,
                    batch_id,
                    charged.totals,
                    late=figures.late + released.late,
                    quarantined=figures.quarantined + released.quarantined,
                    clock_ahead=figures.clock_ahead,
                    applied_through=needs,
                    unbilled=charged.unbilled_counts,
                    not_charged=charged.not_charged_counts,
                    budget_days=charged.budget_days,
                    day_totals_read=charged.day_totals_read,
                )
                break
            except DayTotalsMovedError as moved:
                # Reconciliation changed a day this batch charged on (an addition, a retraction) between the read
                # and the apply: decided again on the day as it is now, so the live total never passes a budget.
                if attempt == DAY_TOTALS_TRIES:
                    raise
                log.info("batch %d: %s; deciding it again (try %d)", batch_id, moved, attempt + 1)
        clock.lap("redis")
        self.released = True
        log.info(
            "batch %d: %d bills, %d unbilled, %d not charged, %d events, %d bad, %d files, catalog version %d; %s",
            batch_id,
            charged.ledger.num_rows,
            charged.unbilled.num_rows,
            charged.not_charged.num_rows,
            figures.events,
            figures.bad,
            len(files),
            catalog.version,
            clock,
        )
        if released.settled.num_rows:
            log.info(
                "batch %d released %d quarantined record(s) of schema versions learnt since (%d stay in quarantine "
                "with another reason)",
                batch_id,
                released.count,
                released.requarantined,
            )

    def stop_for_new_schemas(self) -> None:
        """Raise SchemaSwitch, before the batch writes anything, when the registry holds schema versions this
        query cannot decode (`attribution.schema_follow`)."""
        if self.config.registry_location is None:
            return
        try:
            new = self.schema_watch.new_versions()
        except SchemaRegistryError as exc:
            # Billing goes on: a record of an id the job cannot fetch now is held in quarantine and released by the
            # first batch after a later switch or start.
            log.warning("cannot ask the schema registry for new versions: %s", exc)
            return
        if new:
            self.switch = SchemaSwitch(new)
            raise self.switch

    @cached_property
    def schema_watch(self) -> WriterSchemaWatch:
        known = {"impression": frozenset(self.config.impression_schemas), "click": frozenset(self.config.click_schemas)}
        return WriterSchemaWatch(self.config.registry_location or "", known, self.config.layout.schemas_file)

    def release(self, batch_id: int, advertiser_of: Mapping[str, str]) -> Release:
        """On the query's first batch, the quarantined records it can decode now (`attribution.release`)."""
        if self.released:
            return Release.none()
        return release_quarantined(
            self.config.layout,
            batch_id,
            {"impression": self.config.impression_schemas, "click": self.config.click_schemas},
            {self.config.topic_impressions: "impression", self.config.topic_clicks: "click"},
            Periods(self.config.period_ms),
            advertiser_of,
        )


@dataclass(frozen=True)
class _TaskWrite:
    """The function each task of a batch runs on its executor (`DataFrame.mapInArrow`): write its rows, send its
    bad records to the quarantine topic, yield its figures."""

    writer: PartitionWriter
    kafka_bootstrap: str
    topic_quarantine: str

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if not received or not sum(b.num_rows for b in received):
            return
        context = TaskContext.get()
        assert context is not None, "runs in a Spark task"
        yield from self.write(pa.Table.from_batches(received), context.partitionId()).to_batches()

    def write(self, rows: pa.Table, partition: int) -> pa.Table:
        """Write `rows` as the share of task `partition`, send their bad records on; their figures."""
        out, figures = self.writer.write(rows, partition)
        if out.bad.num_rows:
            _dead_letters(self.kafka_bootstrap, self.topic_quarantine).send(out.bad)
        return figures


_DEAD_LETTERS: dict[tuple[str, str], DeadLetters] = {}


def _dead_letters(bootstrap: str, topic: str) -> DeadLetters:
    """One quarantine-topic producer per Python worker and topic, kept for the next tasks the worker runs."""
    if (bootstrap, topic) not in _DEAD_LETTERS:
        _DEAD_LETTERS[bootstrap, topic] = DeadLetters(bootstrap, topic)
    return _DEAD_LETTERS[bootstrap, topic]


class FullCollections:
    """Python's full collections (generation 2) in this process, counted and timed from the collector's own callbacks:
    a full pass walks every object the driver holds (about ten million with a million ads' catalog), and the batch's
    log line says when one fell in it (`_PhaseClock`)."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._began: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._began = time.monotonic()
        elif self._began is not None:
            self.count += 1
            self.seconds += time.monotonic() - self._began
            self._began = None

    def watch(self) -> FullCollections:
        """Counted from now on (once per process)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self


FULL_COLLECTIONS = FullCollections()


class _PhaseClock:
    """Wall time of each step of a batch, for the log, and the full collections that fell in it: made once (it
    registers its watch of the collector then) and restarted at the start of each batch."""

    def __init__(self, collections: FullCollections = FULL_COLLECTIONS) -> None:
        self.collections = collections.watch()
        self.restart()

    def restart(self) -> _PhaseClock:
        """Starts a new batch: no laps, its time and collections counted from now."""
        self.last = time.monotonic()
        self.laps: list[tuple[str, float]] = []
        self._from = (self.collections.count, self.collections.seconds)
        return self

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        said = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.laps)
        count = self.collections.count - self._from[0]
        if count:
            said += f"; {count} full collection(s) of Python's heap, {self.collections.seconds - self._from[1]:.2f} s"
        return said


def late_watermark_ms(spark: SparkSession, checkpoint: Path, batch_id: int) -> int:
    """The watermark the query's stateful operators use to drop late rows in `batch_id` (rows whose
    `watermark_ts` is at or below it): the one the previous batch ran with (Spark keeps it in the offset log,
    `offsets/N`, as `batchWatermarkMs`)."""
    if batch_id == 0:
        return 0
    jvm: Any = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(str(checkpoint / "offsets" / str(batch_id - 1)))
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    if not fs.exists(path):
        return 0
    stream = fs.open(path)
    try:
        reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
        reader.readLine()  # the log's version line, such as v1
        metadata = json.loads(reader.readLine())
    finally:
        stream.close()
    return int(metadata.get("batchWatermarkMs", 0))


def start(
    spark: SparkSession, config: StreamConfig, new_checkpoint: bool = False, catalog: CatalogDatabase | None = None
) -> list[StreamingQuery]:
    """Start the job's query, with its heartbeat; it runs until stopped, pricing each batch with the catalog as the
    database holds it then (`config.database_url`; `catalog`, a store of it the caller shares, else one of its own).
    A new checkpoint over the output of an earlier one is refused (CheckpointRefusedError) unless `new_checkpoint`
    asks for a new epoch."""
    if not config.database_url:
        raise ValueError("the streaming job needs the catalog's database: set ADBILL_DATABASE_URL")
    if catalog is None:
        catalog = CatalogDatabase(config.database_url, imports=config.catalog_path)
    # No catalog, or no database, stops the start with one line saying which. The whole catalog is read by the first
    # batch, or before it by a read started with the JVM (ops.streaming): the query starts meanwhile (6 s at a
    # million ads).
    catalog.require()
    topics = [config.topic_impressions, config.topic_clicks]
    # Held while the query runs: `adbill restore-redis` knows from it that the job runs (`attribution.job_lock`).
    lock = JobLock(config.layout.job_lock(BILLING_QUERY), config.database_url, config.redis_prefix)
    try:
        lock.acquire(wait_s=JOB_LOCK_WAIT_S)
    except JobLockedError as exc:
        raise CheckpointRefusedError(
            f"another streaming job, or a restore of Redis, works on this data folder: {exc}"
        ) from None
    try:
        return _start(spark, config, catalog, new_checkpoint, lock, topics)
    except BaseException:
        lock.release()
        raise


def _start(
    spark: SparkSession,
    config: StreamConfig,
    catalog: CatalogDatabase,
    new_checkpoint: bool,
    lock: JobLock,
    topics: list[str],
) -> list[StreamingQuery]:
    epoch = prepare_epoch(
        config.layout.checkpoint(BILLING_QUERY),
        config.data_dir,
        lambda: {t: sorted(parts) for t, parts in end_offsets(config.kafka_bootstrap, topics).items()},
        RedisTotals.from_url(config.redis_url, config.redis_prefix).last_applied(BILLING_QUERY),
        new_checkpoint,
    )
    if epoch.batch_id_base:
        log.info("checkpoint epoch: batches from %d, starting offsets %s", epoch.batch_id_base, epoch.starting_offsets)
    config = replace(config, epoch=epoch)
    heartbeat = Heartbeat(config.redis_url, config.redis_prefix, BILLING_QUERY)
    spark.streams.addListener(heartbeat)
    spark.streams.addListener(lock)
    checkpoint = config.layout.checkpoint(BILLING_QUERY)
    _log_join_state_format(spark, checkpoint)
    sinks: list[BatchSink] = []

    def start_query(config: StreamConfig = config) -> StreamingQuery:
        sink = BatchSink(config, catalog)
        sinks.append(sink)
        # Under the lock: `start` took it, and a run stopped for new schema versions keeps it for the next (held:
        # this does nothing). A run is followed by its run id; the query's id is the same across restarts.
        lock.acquire(wait_s=JOB_LOCK_WAIT_S)
        query = (
            attribution_stream(spark, config)
            .writeStream.queryName(BILLING_QUERY)
            .foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=f"{config.trigger_ms} milliseconds")
            .start()
        )
        heartbeat.follow(query)
        lock.follow(query, switching=lambda: sink.switch is not None)
        return query

    def run(config: StreamConfig) -> _Generation:
        """Start the query with `config`'s writer schemas."""
        query = start_query(config)
        return _Generation(query, sinks[-1])

    first = run(config)
    if config.registry_location is None:
        return [first.query]

    latest = [config]

    def restart() -> _Generation:
        """The query again, with every version the registry holds now (a batch stopped it for new ones)."""
        spark.streams.resetTerminated()
        try:
            latest.append(with_registered_schemas(latest[-1]))
        except SchemaRegistryError as exc:
            # Billing goes on with the versions it has: records of the new ones wait in quarantine, released by the
            # first batch of a later start of the query.
            log.warning("cannot read the schema registry's versions, going on with those known: %s", exc)
        return run(latest[-1])

    # The job's lock is let go when the query stops for good, a failed restart included.
    return [FollowingQuery(first, restart, finished=lock.release)]  # type: ignore[list-item]


def with_registered_schemas(config: StreamConfig) -> StreamConfig:
    """`config` with the writer schemas of every version its registry holds now."""
    registry = open_registry(config.registry_location or "", config.layout.schemas_file)
    return replace(
        config,
        impression_schemas=registered_versions(registry, "impression"),
        click_schemas=registered_versions(registry, "click"),
    )


JOB_LOCK_WAIT_S = 60.0
"""How long a starting job waits for the job lock: a query stopped a moment ago lets go of it when Spark reports
the stop; a restore of Redis holds it until done."""


def checkpoint_conf(checkpoint: Path, key: str) -> str | None:
    """A Spark setting the checkpoint runs with whatever the session says (the join state format, the state store
    provider): Spark records it in the offset log when the query first starts, and a restart takes it from there.
    None for a checkpoint that has planned no batch yet, or that does not record `key`."""
    planned = [int(p.name) for p in (checkpoint / "offsets").glob("*") if p.name.isdigit()]
    if not planned:
        return None
    lines = (checkpoint / "offsets" / str(max(planned))).read_text().splitlines()
    recorded = json.loads(lines[1]).get("conf", {}).get(key) if len(lines) > 1 else None
    return None if recorded is None else str(recorded)


def checkpoint_join_state_format(checkpoint: Path) -> int | None:
    """The join state format the checkpoint runs with (`checkpoint_conf`); None for one that has planned no batch."""
    recorded = checkpoint_conf(checkpoint, JOIN_STATE_FORMAT)
    return None if recorded is None else int(recorded)


def _log_join_state_format(spark: SparkSession, checkpoint: Path) -> None:
    """Say which join state format the query runs with, and when it is not the one asked for, why."""
    asked = spark.conf.get(JOIN_STATE_FORMAT, None)
    try:
        recorded = checkpoint_join_state_format(checkpoint)
    except (OSError, ValueError) as exc:  # a log line only: Spark reads the offset log itself and says what it finds
        log.warning("cannot read the join state format from the checkpoint's offset log: %s", exc)
        return
    if recorded is None:
        log.info("join state format of the new checkpoint: %s", asked or "Spark's default")
    elif asked is not None and int(asked) != recorded:
        log.warning(
            "join state format %s is asked for, but the checkpoint %s keeps the format %d it started with: the "
            "setting applies to a new checkpoint (docs/operations.md: moving to join state format 4)",
            asked,
            checkpoint,
            recorded,
        )
    else:
        log.info("join state format of the checkpoint: %d", recorded)
