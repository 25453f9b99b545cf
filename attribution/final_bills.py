"""The final bills: the attribution rule applied by Spark to every event the stream archived.

Spark's one job in closing periods (`billing.closing_run`) and in the audit (`attribution.audit`): the archived
impressions of the due periods and of the period before each (a click may be attributed to an impression up to
10 s earlier) and the clicks of the due periods and of the periods beside them, with every other copy of their ids
from any period, de-duplicated by first arrival, through the same `match_clicks()` as the stream (`attribution.join`),
each matched click with what the flood and duplicate rules find (`attribution.invalid`) and its user agent and
address; id conflicts and late events beside. The matches come back unpriced: the caller prices them with the
catalog's history (`attribution.pricing`), judges the crawler list and the exclusion list on the driver, and charges
them (`attribution.closing.final_charges`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from attribution.invalid import judged_clicks
from attribution.join import MATCH_COLUMNS, conflicts, dedupe, match_clicks
from attribution.periods import period_columns
from billing.invalid import DEFAULT_RULES, IvtRules
from billing.periods import DAY_MS, Periods

V = TypeVar("V")

FINAL_MATCH_COLUMNS = (*MATCH_COLUMNS[:6], "period", "user_agent", "ip", "click_flood", "duplicate_click")
"""The final matches' columns: the click, its attributed impression and their times, the click's period, and what
the invalid traffic rules read or found (the click's `user_agent` and `ip`; whether it is in a flood, a duplicate
click)."""


def scope_of(due: list[str], periods: Periods, whole_days: bool) -> list[str]:
    """The periods whose final bills a run computes: the due ones and, with `whole_days` (some campaign has a daily
    budget), every other period of their UTC days: the earlier ones because a click's charge depends on the clicks
    before it that day, the later ones (still open, as received so far) for the bills a late click earlier in the
    day leaves over the budget (`billing.closing_run.budget_room`)."""
    scope = set(due)
    if whole_days:
        for period in due:
            start = periods.parse_key(period)
            midnight = start - start % DAY_MS
            scope.update(periods.key(at) for at in range(midnight, midnight + DAY_MS, periods.length_ms))
    return sorted(scope, key=periods.parse_key)


def final_bills(
    spark: SparkSession,
    archive: Path,
    period_ms: int,
    due: list[str],
    through_batch: int | None = None,
    rules: IvtRules = DEFAULT_RULES,
    period_rules: Mapping[str, IvtRules] | None = None,
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(final matched clicks of the `due` periods with their `period` and invalid traffic flags
    (`FINAL_MATCH_COLUMNS`, to be priced and charged), id-conflict quarantine rows with their `event_type` and event
    `period`, late events' `event_type` and `event_id`) from the event archive; only its batches up to
    `through_batch` when given (the batch a closing run reads the ledger up to as well).

    The clicks of the periods next to the due ones are read too: the flood and duplicate rules look up to a minute
    around a click (`attribution.invalid.judged_clicks`). A click is judged with the thresholds of its period:
    `period_rules` where they name the period (a closed period keeps those it was judged with), `rules`
    otherwise."""
    periods = Periods(period_ms)
    previous = {periods.key(periods.parse_key(p) - periods.length_ms) for p in due}
    following = {periods.key(periods.parse_key(p) + periods.length_ms) for p in due}
    archived = spark.read.schema(ARCHIVE_READ_SCHEMA).option("basePath", str(archive)).parquet(str(archive))
    if through_batch is not None:
        archived = archived.filter(F.col("batch_id") <= through_batch)
    of_due = ((F.col("event_type") == "click") & F.col("period").isin(*due)) | (
        (F.col("event_type") == "impression") & F.col("period").isin(*(set(due) | previous))
    )
    context = (F.col("event_type") == "click") & F.col("period").isin(*((previous | following) - set(due)))
    wanted = archived.filter(of_due | context)
    # Every copy of those ids, whatever period its time falls in: the first copy to arrive stands and a later one
    # with other content is a conflict, even when the copies are periods apart and their periods close in
    # different runs (a copy in a period not due here could otherwise be missed, and one click billed twice).
    ids = wanted.select("event_type", "event_id").distinct()
    elsewhere = archived.filter(~(of_due | context)).join(ids, ["event_type", "event_id"], "left_semi")
    events = wanted.unionByName(elsewhere).withColumn("event_ts", F.timestamp_millis(F.col("event_time")))
    columns = ["ad_id", "user_id", "event_time", "event_ts", "received_ms", "topic", "partition", "offset", "value"]
    impressions = events.filter(F.col("event_type") == "impression").select(
        F.col("event_id").alias("impression_id"), *columns
    )
    clicks = events.filter(F.col("event_type") == "click").select(
        F.col("event_id").alias("click_id"), *columns, "user_agent", "ip"
    )
    quarantined = (
        conflicts(impressions, "impression_id")
        .withColumn("event_type", F.lit("impression"))
        .unionByName(conflicts(clicks, "click_id").withColumn("event_type", F.lit("click")))
        .select("*", period_columns(F.col("event_time"), period_ms)[1])
        .filter(F.col("period").isin(*due))
    )
    standing = dedupe(clicks, "click_id")
    judged = _judged(standing.select("click_id", "user_id", "ad_id", "event_time"), period_ms, due, rules, period_rules)
    final = match_clicks(dedupe(impressions, "impression_id"), standing, carry=("user_agent", "ip"))
    final = final.select("*", period_columns(F.col("click_time"), period_ms)[1]).filter(F.col("period").isin(*due))
    final = final.join(judged, "click_id", "left")
    late = wanted.filter(F.col("late") & of_due).select("event_type", "event_id")
    return final.select(*FINAL_MATCH_COLUMNS), quarantined, late


def _judged(
    clicks: DataFrame,
    period_ms: int,
    due: list[str],
    rules: IvtRules,
    period_rules: Mapping[str, IvtRules] | None,
) -> DataFrame:
    """`click_id`, `click_flood`, `duplicate_click` of `clicks`, each judged with its period's thresholds."""
    periods_of = _periods_by(due, rules, period_rules)
    if len(periods_of) <= 1:
        return judged_clicks(clicks, next(iter(periods_of), rules)).select("click_id", "click_flood", "duplicate_click")
    parts = [
        judged_clicks(clicks, these)
        .select("click_id", "click_flood", "duplicate_click", period_columns(F.col("event_time"), period_ms)[1])
        .filter(F.col("period").isin(*of))
        .drop("period")
        for these, of in periods_of.items()
    ]
    return functools.reduce(DataFrame.unionByName, parts)


def _periods_by(due: list[str], default: V, per_period: Mapping[str, V] | None) -> dict[V, list[str]]:
    """The due periods grouped by what each is judged with: `per_period`'s value, or `default`."""
    grouped: dict[V, list[str]] = {}
    for period in due:
        grouped.setdefault((per_period or {}).get(period, default), []).append(period)
    return grouped


ARCHIVE_READ_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("ad_id", T.StringType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("event_time", T.LongType()),
        T.StructField("received_ms", T.LongType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("user_agent", T.StringType()),
        T.StructField("ip", T.StringType()),
        T.StructField("late", T.BooleanType()),
        T.StructField("period_start_ms", T.LongType()),
        T.StructField("event_type", T.StringType()),
        T.StructField("period", T.StringType()),
        T.StructField("batch_id", T.LongType()),
    ]
)
"""The archive as it is read: its files' columns (an archive written before version 2 of the events lacks
`user_agent` and `ip`, read as nulls) and the partition columns."""
