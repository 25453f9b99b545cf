"""The streaming attribution job: Kafka impressions and clicks in; billed clicks, the event archive and quarantine
out, to Parquet and Redis, exactly once.

One named query, `billing`, with one checkpoint folder. Each micro-batch carries two kinds of rows, a union
of two branches over the same two Kafka sources, so that everything a batch read is written under that
batch's id, together:

- `bill`: decode -> valid -> watermark per stream -> `attribute()` (the stream-stream join by `ad_id`,
  `user_id`, first match per click) -> priced, with its period;
- `intake`: every record received: valid events go to the archive that reconciliation reads, flagged `late`
  when the watermark kept them out of the join; bad input goes to the quarantine table and topic.

The sink (`BatchSink`) writes the ledger, the archive and the quarantine table as Parquet under
`.../batch_id=N/` with dynamic partition overwrite (a replayed batch replaces its own files and nothing else),
sends bad records to the quarantine topic, and then applies the batch's totals, late counts and quarantine
counts to Redis in one Lua script that skips a batch id it has already applied.

The job receives its sources' addresses and its sinks' places in a `StreamConfig`; `ops` builds that from the
settings, so the same job runs in local mode and against a Spark cluster.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from attribution.decode import QUARANTINE_COLUMNS, decode_events, split
from attribution.join import attribute, catalog_frame
from billing.catalog import Catalog
from billing.parquet_ledger import LEDGER_COLUMNS
from billing.redis_totals import LateCount, QuarantineCount, RedisTotals, TotalsRow

log = logging.getLogger(__name__)

BILLING_QUERY = "billing"

KIND = "kind"
"""Which branch a row of the job's output comes from: `bill`, `event` or `bad`."""

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
event_type, period, batch_id."""


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
    impression_watermark_ms: int = 30_000
    click_watermark_ms: int = 30_000
    trigger_ms: int = 1_000
    period_ms: int = 3_600_000
    max_offsets_per_trigger: int = 200_000
    starting_offsets: str = "earliest"

    @property
    def ledger_dir(self) -> Path:
        return self.data_dir / "ledger"

    @property
    def archive_dir(self) -> Path:
        return self.data_dir / "archive"

    @property
    def quarantine_dir(self) -> Path:
        return self.data_dir / "quarantine"

    def checkpoint(self, query: str) -> Path:
        return self.data_dir / "checkpoints" / query


def kafka_stream(spark: SparkSession, config: StreamConfig, topics: list[str]) -> DataFrame:
    """Records of `topics`, from the earliest offsets on a first start, from the checkpoint after that."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka_bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", config.starting_offsets)
        .option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
        .option("failOnDataLoss", "true")
        .load()
    )


def period_columns(time_ms: Column, period_ms: int) -> list[Column]:
    """`period_start_ms` and `period` (its key, `YYYYMMDDTHHMMZ` in UTC) of an epoch-ms column."""
    start = time_ms - time_ms % F.lit(period_ms)
    key = F.date_format(F.timestamp_millis(start), "yyyyMMdd'T'HHmm'Z'")
    return [start.alias("period_start_ms"), key.alias("period")]


def attribution_stream(spark: SparkSession, config: StreamConfig, catalog: DataFrame) -> DataFrame:
    """The job's output: provisional bills (`KIND` `bill`) and every record received (`KIND` `intake`: valid
    events with a null `reason`, bad input with its reason)."""
    ad_ids = catalog.select("ad_id")
    impressions = decode_events(
        kafka_stream(spark, config, [config.topic_impressions]), "impression", config.impression_schemas, ad_ids
    )
    clicks = decode_events(kafka_stream(spark, config, [config.topic_clicks]), "click", config.click_schemas, ad_ids)
    valid_impressions, _ = split(impressions)
    valid_clicks, _ = split(clicks)
    bills = attribute(
        valid_impressions.withWatermark("event_ts", f"{config.impression_watermark_ms} milliseconds").observe(
            "impressions", F.max("event_time").alias("max_event_time"), F.count(F.lit(1)).alias("rows")
        ),
        valid_clicks.withWatermark("event_ts", f"{config.click_watermark_ms} milliseconds").observe(
            "clicks", F.max("event_time").alias("max_event_time"), F.count(F.lit(1)).alias("rows")
        ),
        catalog,
    )
    bills = bills.select("*", *period_columns(F.col("click_time"), config.period_ms)).drop("click_ts")
    # One branch carries every record, valid or not, so each topic is read twice per batch (join, intake),
    # not three times.
    intake = _as_received(impressions, "impression", "impression_id").unionByName(
        _as_received(clicks, "click", "click_id")
    )
    return bills.withColumn(KIND, F.lit("bill")).unionByName(
        intake.withColumn(KIND, F.lit("intake")), allowMissingColumns=True
    )


def _as_received(decoded: DataFrame, event_type: str, id_col: str) -> DataFrame:
    return decoded.select(
        F.lit(event_type).alias("event_type"),
        F.col(id_col).alias("event_id"),
        *ARCHIVE_COLUMNS[2:10],  # ad_id .. value: the event as the archive keeps it
        F.col("quarantine_reason").alias("reason"),
    )


def late_event(watermark_ms: int) -> Column:
    """True for a received event that the streaming join kept out, given the watermark it used for late rows:
    the join drops an input row of either side whose event time is at or below that watermark."""
    return F.col("event_time") <= F.lit(watermark_ms)


class BatchSink:
    """Writes one micro-batch: the Parquet ledger, archive and quarantine, the quarantine topic, then Redis.

    Parquet files of batch N live in `.../batch_id=N/`, written with dynamic partition overwrite, so a batch
    replayed after a crash replaces its own files and nothing else. Redis applies batch N only if N is above
    the last batch it applied, in one Lua script, so a crash between the writes, or after them and before
    Spark commits the batch, counts nothing twice and loses nothing. The quarantine topic is at-least-once
    (a replayed batch is sent again); the quarantine table is exact.
    """

    def __init__(self, config: StreamConfig, catalog: Catalog) -> None:
        self.config = config
        self.advertiser_of = {ad.ad_id: ad.advertiser_id for ad in catalog}

    @cached_property
    def totals(self) -> RedisTotals:
        """One Redis client for the sink's life, made on the first batch (foreachBatch runs on the driver)."""
        return RedisTotals.from_url(self.config.redis_url, self.config.redis_prefix)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        watermark = late_watermark_ms(spark, self.config.checkpoint(BILLING_QUERY), batch_id)
        batch = batch.withColumn("batch_id", F.lit(batch_id)).persist()
        try:
            bills = batch.filter(F.col(KIND) == "bill").select(
                *_ledger_columns(), F.lit(int(time.time() * 1000)).alias("billed_at_ms"), "batch_id"
            )
            intake = batch.filter(F.col(KIND) == "intake")
            events = intake.filter(F.col("reason").isNull()).select(
                *ARCHIVE_COLUMNS[:10],
                late_event(watermark).alias("late"),
                *period_columns(F.col("event_time"), self.config.period_ms),
                "batch_id",
            )
            bad = intake.filter(F.col("reason").isNotNull()).select(*QUARANTINE_COLUMNS, "batch_id")
            summary = self._summary(bills, events, bad)
            if summary["bill"]:
                self._write(bills, self.config.ledger_dir, "period", "batch_id")
            if summary["event"]:
                self._write(events, self.config.archive_dir, "event_type", "period", "batch_id")
            if summary["bad"]:
                self._write(bad, self.config.quarantine_dir, "batch_id")
                self._send_dead_letters(bad)
            self.totals.apply_batch(
                BILLING_QUERY,
                batch_id,
                summary["bill"],
                late=summary["late"],
                quarantined=summary["quarantined"],
            )
        finally:
            batch.unpersist()

    def _summary(self, bills: DataFrame, events: DataFrame, bad: DataFrame) -> dict[str, list]:  # type: ignore[type-arg]
        """The batch's Redis figures, in one Spark job: totals per ad, late events per ad, bad input per reason."""
        totals = bills.groupBy("period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id").agg(
            F.count(F.lit(1)).alias("n"), F.sum("amount_micros").alias("micros")
        )
        archived = events.groupBy("late", "period", "period_start_ms", "ad_id", "event_type").agg(
            F.count(F.lit(1)).alias("n")
        )
        rejected = bad.groupBy("reason", "topic", "ad_id").agg(F.count(F.lit(1)).alias("n"))
        rows = (
            totals.select(F.lit("bill").alias("what"), F.to_json(F.struct(*totals.columns)).alias("row"))
            .unionByName(
                archived.select(F.lit("event").alias("what"), F.to_json(F.struct(*archived.columns)).alias("row"))
            )
            .unionByName(
                rejected.select(F.lit("bad").alias("what"), F.to_json(F.struct(*rejected.columns)).alias("row"))
            )
            .collect()
        )
        out: dict[str, list] = {"bill": [], "event": [], "bad": [], "late": [], "quarantined": []}  # type: ignore[type-arg]
        for what, text in rows:
            row = json.loads(text)
            out[what].append(row)
        out["bill"] = [
            TotalsRow(
                row["period"],
                row["period_start_ms"],
                row["advertiser_id"],
                row["campaign_id"],
                row["ad_id"],
                row["n"],
                row["micros"],
            )
            for row in out["bill"]
        ]
        out["late"] = [
            LateCount(
                row["period"],
                row["period_start_ms"],
                self.advertiser_of[row["ad_id"]],
                row["ad_id"],
                row["event_type"],
                row["n"],
            )
            for row in out["event"]
            if row["late"]
        ]
        out["quarantined"] = [
            QuarantineCount(row["reason"], row["topic"], self.advertiser_of.get(row.get("ad_id") or ""), row["n"])
            for row in out["bad"]
        ]
        return out

    @staticmethod
    def _write(frame: DataFrame, path: Path, *partitions: str) -> None:
        (
            frame.write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy(*partitions)
            .parquet(str(path))
        )

    def _send_dead_letters(self, bad: DataFrame) -> None:
        header = [
            F.struct(F.lit(name).alias("key"), F.col(name).cast("string").cast("binary").alias("value"))
            for name in ("reason", "topic", "partition", "offset")
        ]
        (
            bad.select(F.col("value"), F.array(*header).alias("headers"))
            .write.format("kafka")
            .option("kafka.bootstrap.servers", self.config.kafka_bootstrap)
            .option("topic", self.config.topic_quarantine)
            .save()
        )


def _ledger_columns() -> list[str]:
    return [name for name in LEDGER_COLUMNS if name not in ("billed_at_ms", "batch_id")]


def late_watermark_ms(spark: SparkSession, checkpoint: Path, batch_id: int) -> int:
    """The event-time watermark the query's stateful operators use to drop late rows in `batch_id`: the one
    the previous batch ran with (Spark keeps it in the offset log, `offsets/N`, as `batchWatermarkMs`)."""
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


def start(spark: SparkSession, config: StreamConfig, catalog: Catalog) -> list[StreamingQuery]:
    """Start the job's query; it runs until stopped."""
    catalog_df = catalog_frame(spark, catalog).cache()
    query = (
        attribution_stream(spark, config, catalog_df)
        .writeStream.queryName(BILLING_QUERY)
        .foreachBatch(BatchSink(config, catalog))
        .option("checkpointLocation", str(config.checkpoint(BILLING_QUERY)))
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
        .start()
    )
    return [query]
