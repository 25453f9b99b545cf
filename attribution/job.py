"""The streaming attribution job: Kafka impressions and clicks in, billed clicks to the Parquet ledger and Redis.

Two named queries, each with its own checkpoint folder:

- `billing`: decode -> valid -> watermark per stream -> de-duplicate by event id -> `attribute()` -> one row per
  click -> the ledger (Parquet, by period and micro-batch) and the Redis totals, exactly once.
- `intake`: decode -> bad input -> the quarantine table (Parquet), the quarantine topic and Redis counts.

The job receives its sources' addresses and its sinks' places in a `StreamConfig`; `ops` builds that from the
settings, so the same job runs in local mode and against a Spark cluster.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from attribution.decode import decode_events, split
from attribution.join import attribute, catalog_frame, dedupe
from billing.catalog import Catalog
from billing.redis_totals import RedisTotals, TotalsRow

log = logging.getLogger(__name__)

BILLING_QUERY = "billing"
INTAKE_QUERY = "intake"


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


def billable_stream(spark: SparkSession, config: StreamConfig, catalog: DataFrame) -> DataFrame:
    """The provisional bills: one row per billable click, priced, with its period."""
    ad_ids = catalog.select("ad_id")
    impressions, _ = split(
        decode_events(
            kafka_stream(spark, config, [config.topic_impressions]), "impression", config.impression_schemas, ad_ids
        )
    )
    clicks, _ = split(
        decode_events(kafka_stream(spark, config, [config.topic_clicks]), "click", config.click_schemas, ad_ids)
    )
    impressions = dedupe(
        impressions.withWatermark("event_ts", f"{config.impression_watermark_ms} milliseconds"), "impression_id"
    ).observe("impressions", F.max("event_time").alias("max_event_time"), F.count(F.lit(1)).alias("rows"))
    clicks = dedupe(clicks.withWatermark("event_ts", f"{config.click_watermark_ms} milliseconds"), "click_id").observe(
        "clicks", F.max("event_time").alias("max_event_time"), F.count(F.lit(1)).alias("rows")
    )
    billed = attribute(impressions, clicks, catalog)
    return billed.select("*", *period_columns(F.col("click_time"), config.period_ms))


def quarantine_stream(spark: SparkSession, config: StreamConfig, catalog: DataFrame) -> DataFrame:
    """Bad input of both topics, with its reason and where it came from."""
    ad_ids = catalog.select("ad_id")
    raw = kafka_stream(spark, config, [config.topic_impressions, config.topic_clicks])
    _, bad_impressions = split(
        decode_events(
            raw.where(F.col("topic") == config.topic_impressions), "impression", config.impression_schemas, ad_ids
        )
    )
    _, bad_clicks = split(
        decode_events(raw.where(F.col("topic") == config.topic_clicks), "click", config.click_schemas, ad_ids)
    )
    return bad_impressions.unionByName(bad_clicks)


class LedgerSink:
    """Writes one micro-batch of bills: Parquet first, then Redis; both idempotent per batch id.

    The Parquet files of batch N live in `ledger/period=P/batch_id=N/`, written with dynamic partition overwrite:
    a batch replayed after a crash replaces its own files and nothing else. Redis applies batch N only if N is
    above the last batch it applied, in one Lua script, so a crash between the two writes, or after both and
    before Spark commits the batch, bills nothing twice and loses nothing.
    """

    def __init__(self, config: StreamConfig) -> None:
        self.ledger_dir = str(config.ledger_dir)
        self.redis_url = config.redis_url
        self.redis_prefix = config.redis_prefix

    @cached_property
    def totals(self) -> RedisTotals:
        """One Redis client for the sink's life, made on the first batch (foreachBatch runs on the driver)."""
        return RedisTotals.from_url(self.redis_url, self.redis_prefix)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch = (
            batch.drop("click_ts")
            .withColumn("billed_at_ms", F.lit(int(time.time() * 1000)))
            .withColumn("batch_id", F.lit(batch_id))
            .persist()
        )
        try:
            totals = (
                batch.groupBy("period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id")
                .agg(F.count(F.lit(1)).alias("clicks"), F.sum("amount_micros").alias("micros"))
                .collect()
            )
            if totals:
                (
                    batch.write.mode("overwrite")
                    .option("partitionOverwriteMode", "dynamic")
                    .partitionBy("period", "batch_id")
                    .parquet(self.ledger_dir)
                )
            self.totals.apply_batch(BILLING_QUERY, batch_id, [TotalsRow(**row.asDict()) for row in totals])
        finally:
            batch.unpersist()


class QuarantineSink:
    """Writes one micro-batch of bad input: the Parquet table, the dead-letter topic, then Redis counts."""

    def __init__(self, config: StreamConfig) -> None:
        self.quarantine_dir = str(config.quarantine_dir)
        self.kafka_bootstrap = config.kafka_bootstrap
        self.topic = config.topic_quarantine
        self.redis_url = config.redis_url
        self.redis_prefix = config.redis_prefix

    @cached_property
    def totals(self) -> RedisTotals:
        """One Redis client for the sink's life, made on the first batch (foreachBatch runs on the driver)."""
        return RedisTotals.from_url(self.redis_url, self.redis_prefix)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch = batch.withColumn("batch_id", F.lit(batch_id)).persist()
        try:
            counts = batch.groupBy("reason", "topic").count().collect()
            if counts:
                (
                    batch.write.mode("overwrite")
                    .option("partitionOverwriteMode", "dynamic")
                    .partitionBy("batch_id")
                    .parquet(self.quarantine_dir)
                )
                # The dead-letter topic is at-least-once (a replayed batch is sent again); the table is exact.
                header = [
                    F.struct(F.lit(name).alias("key"), F.col(name).cast("string").cast("binary").alias("value"))
                    for name in ("reason", "topic", "partition", "offset")
                ]
                (
                    batch.select(F.col("value"), F.array(*header).alias("headers"))
                    .write.format("kafka")
                    .option("kafka.bootstrap.servers", self.kafka_bootstrap)
                    .option("topic", self.topic)
                    .save()
                )
            self.totals.add_quarantined(
                INTAKE_QUERY, batch_id, {(row["reason"], row["topic"]): row["count"] for row in counts}
            )
        finally:
            batch.unpersist()


def start(spark: SparkSession, config: StreamConfig, catalog: Catalog) -> list[StreamingQuery]:
    """Start both queries; they run until stopped."""
    catalog_df = catalog_frame(spark, catalog).cache()
    return [
        _run_query(billable_stream(spark, config, catalog_df), BILLING_QUERY, LedgerSink(config), config),
        _run_query(quarantine_stream(spark, config, catalog_df), INTAKE_QUERY, QuarantineSink(config), config),
    ]


def _run_query(stream: DataFrame, name: str, sink: LedgerSink | QuarantineSink, config: StreamConfig) -> StreamingQuery:
    return (
        stream.writeStream.queryName(name)
        .foreachBatch(sink)
        .option("checkpointLocation", str(config.checkpoint(name)))
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
        .start()
    )
