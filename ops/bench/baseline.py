"""The textbook baseline: a plain Spark stream-stream join of the same topics, nothing else.

What a Structured Streaming tutorial writes for "bill a click that comes within 10 s after an impression":
Kafka source per topic -> `from_avro` on the body after the 5-byte Confluent header, with the shipped writer
schema (PERMISSIVE, so a bad record becomes nulls instead of failing the query) -> a watermark per stream with
the job's delays -> the inner join on `ad_id`, `user_id` and the same 10 s range as `attribution.join.match_clicks`
-> a no-op sink (`format("noop")`). No intake checks, no de-duplication, no catalog, no Parquet, no Redis.

It runs in its own Spark session built like the job's (`ops.spark.spark_session`: same master, shuffle
partitions, state store, join state format, driver memory, checkpoint file manager) with the same trigger,
`maxOffsetsPerTrigger` and Kafka fetch wait, and records each batch's progress with the job's own listener
(`attribution.progress.HealthListener`, query `baseline`), so the benchmark measures both systems from the same
records.

Run: `python -m ops.bench.baseline` with the `ADBILL_*` settings of the topics, Redis and Spark in the
environment; it runs until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ops.settings import Settings

QUERY = "baseline"


def decoded(spark: Any, settings: Settings, topic: str, event_type: str, rate_limit: bool = True) -> Any:
    """A topic's records as the event's fields, `event_time` a timestamp (the schema's timestamp-millis); at most
    `maxOffsetsPerTrigger` records a batch unless `rate_limit` is off (real-time mode refuses the option)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from attribution.job import FETCH_MAX_WAIT_MS
    from billing.schemas import schema_text

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))  # the job's Kafka client setting
    )
    if rate_limit:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    records = reader.load()
    body = F.expr("substring(value, 6)")
    event = from_avro(body, schema_text(event_type), {"mode": "PERMISSIVE"}).alias("event")
    return records.select(event).select("event.*")


JOINS = ("plain", "bucketed", "hashed")
"""The baseline's join (`BENCH_BASELINE_JOIN` in the environment of `python -m ops.bench`): the textbook one, or a
probe of a lever on it (`textbook_join`)."""


def textbook_join(spark: Any, settings: Settings, rate_limit: bool = True, join: str = "plain") -> Any:
    """Billable click pairs: the inner stream-stream join with a watermark per stream (module doc).

    `join` other than `plain` is a probe of a lever, the same pairs by another plan (docs/benchmarks.md):
    - `bucketed`: each side's watermark on a 10 s bucket of its time that is also a join key (a click joins its own
      bucket and the one before), so that Spark evicts the join's state by key instead of reading every row of
      state each batch. Its watermark moves in steps of a bucket and a bucket leaves state once the watermark passes
      its start: the delays must cover the window and a bucket, or pairs across buckets are missed ("Eviction by
      key");
    - `hashed`: the join keyed by one 64-bit hash of `ad_id` and `user_id` instead of the two strings (each side's
      rows of state then have a key of 8 bytes), the strings compared after the key matches ("A hashed join key").
    """
    from pyspark.sql import functions as F

    from billing.rule import ATTRIBUTION_WINDOW_MS

    if join not in JOINS:
        raise ValueError(f"BENCH_BASELINE_JOIN must be one of {', '.join(JOINS)}, got {join!r}")
    impressions = decoded(spark, settings, settings.topic_impressions, "impression", rate_limit).select(
        F.col("impression_id"),
        F.col("ad_id").alias("imp_ad_id"),
        F.col("user_id").alias("imp_user_id"),
        F.col("event_time").alias("imp_ts"),
    )
    clicks = decoded(spark, settings, settings.topic_clicks, "click", rate_limit).select(
        "click_id", "ad_id", "user_id", F.col("event_time").alias("click_ts")
    )
    window = F.expr(f"INTERVAL {ATTRIBUTION_WINDOW_MS} MILLISECONDS")
    in_window = (impressions["imp_ts"] <= clicks["click_ts"]) & (clicks["click_ts"] <= impressions["imp_ts"] + window)
    same_ad = clicks["ad_id"] == impressions["imp_ad_id"]
    same_user = clicks["user_id"] == impressions["imp_user_id"]
    if join == "hashed":
        # Spark takes each equality between the two sides as a join key: wrapped, the strings' are a filter on the
        # pairs whose hash matched (a collision of the hash joins nothing more).
        impressions = impressions.withColumn("imp_key", F.xxhash64("imp_ad_id", "imp_user_id"))
        clicks = clicks.withColumn("click_key", F.xxhash64("ad_id", "user_id"))
        condition = (clicks["click_key"] == impressions["imp_key"]) & in_window
        condition = condition & F.coalesce(same_ad, F.lit(False)) & F.coalesce(same_user, F.lit(False))
    else:
        condition = same_ad & same_user & in_window
    if join != "bucketed":
        impressions = impressions.withWatermark("imp_ts", f"{settings.impression_watermark_ms} milliseconds")
        clicks = clicks.withWatermark("click_ts", f"{settings.click_watermark_ms} milliseconds")
        return clicks.join(impressions, condition, "inner")

    def bucket(ts: Any, back: int = 0) -> Any:
        start_ms = F.floor(F.unix_millis(ts) / ATTRIBUTION_WINDOW_MS) * ATTRIBUTION_WINDOW_MS
        return F.timestamp_millis((start_ms - back * ATTRIBUTION_WINDOW_MS).cast("long"))

    impressions = impressions.withColumn("imp_bucket", bucket(F.col("imp_ts"))).withWatermark(
        "imp_bucket", f"{settings.impression_watermark_ms} milliseconds"
    )
    clicks = clicks.withColumn(
        "click_bucket", F.explode(F.array(bucket(F.col("click_ts")), bucket(F.col("click_ts"), back=1)))
    ).withWatermark("click_bucket", f"{settings.click_watermark_ms} milliseconds")
    return clicks.join(impressions, condition & (clicks["click_bucket"] == impressions["imp_bucket"]), "inner")


def main() -> int:
    from attribution.progress import HealthListener
    from ops.spark import spark_session

    settings = Settings.from_env()
    spark = spark_session(settings, "adbill-bench-baseline", settings.layout.spark_scratch(), stateful=True)
    spark.streams.addListener(HealthListener(settings.redis_url, settings.redis_prefix, {}))
    query = (
        textbook_join(spark, settings, join=os.environ.get("BENCH_BASELINE_JOIN") or "plain")
        .writeStream.queryName(QUERY)
        .format("noop")
        .option("checkpointLocation", str(settings.layout.checkpoint(QUERY)))
        .trigger(processingTime=f"{settings.trigger_ms} milliseconds")
        .start()
    )

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"baseline: query {QUERY} on {settings.spark_master}", flush=True)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
        spark.stop()
    return 0 if query.exception() is None else 1


if __name__ == "__main__":
    sys.exit(main())
