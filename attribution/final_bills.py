"""The final bills: the attribution rule applied by Spark to every event the stream archived.

Spark's one job in closing periods (`billing.closing_run`) and in the audit (`attribution.audit`): the archived
impressions of the due periods and of the period before each (a click may be attributed to an impression up to
10 s earlier) and the clicks of the due periods, with every other copy of their ids from any period, de-duplicated
by first arrival, through the same `attribute()` as the stream (`attribution.join`); id conflicts and late events
beside. The matches come back unpriced: the caller prices them with the catalog's history (`attribution.pricing`),
as the stream's sink does.
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
    spark: SparkSession,
    archive: Path,
    period_ms: int,
    due: list[str],
    through_batch: int | None = None,
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(final matched clicks of the due periods with their `period` (`FINAL_MATCH_COLUMNS`, to be priced),
    id-conflict quarantine rows with their `event_type` and event `period`, late events' `event_type` and
    `event_id`) from the event archive; only its batches up to `through_batch` when given (the batch a closing run
    reads the ledger up to as well)."""
    periods = Periods(period_ms)
    previous = {periods.key(periods.parse_key(p) - periods.length_ms) for p in due}
    archived = spark.read.option("basePath", str(archive)).parquet(str(archive))
    if through_batch is not None:
        archived = archived.filter(F.col("batch_id") <= through_batch)
    of_due = ((F.col("event_type") == "click") & F.col("period").isin(*due)) | (
        (F.col("event_type") == "impression") & F.col("period").isin(*(set(due) | previous))
    )
    wanted = archived.filter(of_due)
    # Every copy of those ids, whatever period its time falls in: the first copy to arrive stands and a later one
    # with other content is a conflict, even when the copies are periods apart and their periods close in
    # different runs (a copy in a period not due here could otherwise be missed, and one click billed twice).
    ids = wanted.select("event_type", "event_id").distinct()
    elsewhere = archived.filter(~of_due).join(ids, ["event_type", "event_id"], "left_semi")
    events = wanted.unionByName(elsewhere).withColumn("event_ts", F.timestamp_millis(F.col("event_time")))
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
    late = wanted.filter(F.col("late")).select("event_type", "event_id")
    return final.select(*FINAL_MATCH_COLUMNS), quarantined, late
