"""The final bills: the attribution rule applied by Spark to every event the stream archived.

Spark's one job in closing periods (`billing.closing_run`) and in the audit (`attribution.audit`): the archived
impressions of the due periods and of the period before each (a click may be attributed to an impression up to
10 s earlier) and the clicks of the due periods, de-duplicated by first arrival, through the same `attribute()` as
the stream (`attribution.join`); id conflicts and late events beside. The matches come back unpriced: the caller
prices them with the catalog's history (`attribution.pricing`), as the stream's sink does.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from attribution.join import MATCH_COLUMNS, attribute, conflicts, dedupe
from attribution.periods import period_columns
from billing.periods import Periods

FINAL_MATCH_COLUMNS = (*MATCH_COLUMNS[:6], "period")
"""The final matches' columns: the click, its attributed impression and their times, and the click's period."""


def final_bills(
    spark: SparkSession, archive: Path, period_ms: int, due: list[str]
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(final matched clicks of the due periods with their `period` (`FINAL_MATCH_COLUMNS`, to be priced),
    id-conflict quarantine rows with their `event_type` and event `period`, late events' `event_type` and
    `event_id`) from the event archive."""
    periods = Periods(period_ms)
    previous = {periods.key(periods.parse_key(p) - periods.length_ms) for p in due}
    events = (
        spark.read.option("basePath", str(archive))
        .parquet(str(archive))
        .filter(
            ((F.col("event_type") == "click") & F.col("period").isin(*due))
            | ((F.col("event_type") == "impression") & F.col("period").isin(*(set(due) | previous)))
        )
        .withColumn("event_ts", F.timestamp_millis(F.col("event_time")))
    )
    columns = ["ad_id", "user_id", "event_time", "event_ts", "received_ms", "topic", "partition", "offset", "value"]
    impressions = events.filter(F.col("event_type") == "impression").select(
        F.col("event_id").alias("impression_id"), *columns
    )
    clicks = events.filter(F.col("event_type") == "click").select(F.col("event_id").alias("click_id"), *columns)
    quarantined = (
        conflicts(impressions, "impression_id")
        .withColumn("event_type", F.lit("impression"))
        .unionByName(conflicts(clicks, "click_id").withColumn("event_type", F.lit("click")))
        .select("*", period_columns(F.col("event_time"), period_ms)[1])
        .filter(F.col("period").isin(*due))
    )
    final = attribute(dedupe(impressions, "impression_id"), dedupe(clicks, "click_id"))
    final = final.select("*", period_columns(F.col("click_time"), period_ms)[1]).filter(F.col("period").isin(*due))
    late = events.filter(F.col("late")).select("event_type", "event_id")
    return final.select(*FINAL_MATCH_COLUMNS), quarantined, late
