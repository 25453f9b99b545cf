"""The attribution rule on DataFrames: de-duplication, the impression-click join and pricing, written once
for the streaming job and for reconciliation.

In: valid decoded events (`attribution.decode.split`); on a stream, each set up by `watermarked`.
Out: the clicks the rule bills, one row per click (`MATCH_COLUMNS`), not yet priced: the price is the catalog's at
the click's time, which `attribution.pricing` adds (on the driver or an executor, from the catalog version of the
batch), so that a catalog change reaches the running job without a restart. The exact reference is
`billing.rule.bill`'s charged clicks; the batch path here returns the same rows once priced.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from attribution.batch_output import MATCHED_CLICK_COLUMNS
from attribution.decode import to_quarantine
from billing.intake import QuarantineReason
from billing.rule import ATTRIBUTION_WINDOW_MS

MATCH_COLUMNS = (*MATCHED_CLICK_COLUMNS, "click_ts")
"""The columns of `attribute`'s result, in order; times are epoch ms (long), `click_ts` a timestamp.
`click_received_ms` is when Kafka received the click (its record timestamp), for latency figures."""

WATERMARK_TS = "watermark_ts"
"""The column a stream's watermark is on: the earlier of the event time and the time Kafka received the record."""

AHEAD_OF_RECEIPT = "ahead_of_receipt"
"""How far an event's time is ahead of the time Kafka received it (an interval; zero when it is not ahead), so
that `event_ts` is exactly `watermark_ts + ahead_of_receipt`."""

_CONTENT = ("ad_id", "user_id", "event_time")
"""An event's content besides its id: two copies that agree on these are duplicates, else a conflict."""


def watermarked(events: DataFrame, delay_ms: int) -> DataFrame:
    """Valid events of one stream, ready for `attribute`: `WATERMARK_TS` and `AHEAD_OF_RECEIPT` added, and the
    stream's watermark (`delay_ms` behind the largest `WATERMARK_TS` seen) set on `WATERMARK_TS`.

    The watermark follows Kafka's clock, not the producers': an event whose time is ahead of its receipt counts
    for the watermark at its receipt time. However far ahead a device's clock runs (up to the hour that intake
    accepts), the watermark stays at least `delay_ms` behind the newest receipt time, so no event makes the
    traffic that follows it late. The rule still reads the event's own time (`attribute`).
    """
    received = F.timestamp_millis(F.col("received_ms"))
    return (
        events.withColumn(WATERMARK_TS, F.least(F.col("event_ts"), received))
        .withColumn(AHEAD_OF_RECEIPT, F.col("event_ts") - F.col(WATERMARK_TS))
        .withWatermark(WATERMARK_TS, f"{int(delay_ms)} milliseconds")
    )


def dedupe(events: DataFrame, id_col: str) -> DataFrame:
    """One copy of each event id: the first to arrive.

    On a stream: `dropDuplicatesWithinWatermark([id_col])` on events set up by `watermarked`. The first copy
    processed is kept while its id stays in state (until the watermark passes `watermark_ts` + the watermark
    delay); later copies are dropped, identical or not: the stream cannot tell a conflict from a
    duplicate, and reconciliation quarantines the conflicts with `conflicts`.
    In a batch: the first copy by arrival (`received_ms`, then `partition`, `offset`), as `billing.intake`.
    """
    if events.isStreaming:
        return events.dropDuplicatesWithinWatermark([id_col])
    ranked = events.withColumn("_arrival", F.row_number().over(_arrival(id_col)))
    return ranked.filter(F.col("_arrival") == 1).drop("_arrival")


def conflicts(events: DataFrame, id_col: str) -> DataFrame:
    """The later copies of an event id whose content differs from the first copy, as quarantine rows
    (`reason` `id_conflict`, `QUARANTINE_COLUMNS`). Batch only.

    Pass valid events (after `split`): a quarantined copy does not claim its id, so a valid copy arriving
    after it is no conflict, as in `billing.intake`. Later identical copies are duplicates, not returned here.
    """
    if events.isStreaming:
        raise ValueError("conflicts() needs every copy of an id at once: use it on a batch DataFrame")
    arrival = _arrival(id_col)
    first_of = {name: F.first(name).over(arrival) for name in _CONTENT}
    differs = [~F.col(name).eqNullSafe(first_of[name]) for name in _CONTENT]
    later = events.select(
        "*",
        F.row_number().over(arrival).alias("_arrival"),
        (differs[0] | differs[1] | differs[2]).alias("_differs"),
    ).filter((F.col("_arrival") > 1) & F.col("_differs"))
    return to_quarantine(later, F.lit(QuarantineReason.ID_CONFLICT.value), id_col)


def match_clicks(
    impressions: DataFrame,
    clicks: DataFrame,
    window_ms: int = ATTRIBUTION_WINDOW_MS,
    carry: tuple[str, ...] = (),
) -> DataFrame:
    """Matched clicks: THE rule, on two streaming or two batch DataFrames of valid, de-duplicated events; the
    catalog prices them afterwards (`attribution.pricing`).

    A click is matched to the impressions of the same `ad_id` and `user_id` with
    `imp_ts <= click_ts <= imp_ts + window_ms`, both bounds inclusive to the millisecond (`event_ts` is
    exactly `event_time`, and the interval is exact in Spark's microsecond timestamps). One row per click:

    - batch: the latest qualifying impression, ties to the smallest `impression_id` (a window function), which
      is `billing.rule.bill`'s match exactly; repeated copies of a click or an impression change nothing;
    - stream: window functions are not allowed, so the first match the join emits is kept
      (`dropDuplicatesWithinWatermark(["click_id"])`); the amount does not depend on the impression and
      reconciliation carries the latest one. Only the click's watermark column leaves the join: with both
      sides' in its input the de-duplication fails at run time ("More than one event time columns are
      available").

    A stream's inputs come from `watermarked`: the watermarks are on `watermark_ts` (`imp_wm`, `click_wm` here;
    Spark's global watermark is the minimum of the two, `spark.sql.streaming.multipleWatermarkPolicy=min`), join
    keys `ad_id, user_id`. Spark evicts join state only through conditions on the watermarked columns, so the
    join also requires `imp_wm <= click_wm <= imp_wm + window_ms`. For events whose time is not ahead of their
    receipt, `watermark_ts` is the event time and the rule implies this condition: the stream bills exactly what
    the rule bills. For a pair with a clock ahead of Kafka's it compares receipt times instead (both ahead: Kafka
    received the click no earlier than the impression and at most `window_ms` after it); a pair it leaves out is
    billed by reconciliation. Then:

    - a click waits in state for impressions until the watermark passes `click_wm` (no later impression can
      precede it), so roughly the larger watermark delay;
    - an impression waits for clicks until the watermark passes `imp_wm + window_ms`: window plus delay;
    - input rows with `watermark_ts` at or below the watermark are dropped by the join (the engine's "late
      rows"), and a pair whose other half arrives after that half left state is never emitted: the stream misses
      those clicks and reconciliation books them (`late_click`, `late_impression`). Both watermark delays must
      cover the lag between the two topics, or clicks are missed routinely;
    - the first-match de-duplication keeps each `click_id` until the watermark passes `click_wm` + the click
      delay, which outlives the click's join state, so a click can never be billed twice by the stream.

    `carry` names click columns the result carries after `MATCH_COLUMNS` (the stream's sink judges invalid traffic
    by the click's `user_agent` and `ip`).
    """
    streaming = clicks.isStreaming
    if impressions.isStreaming != streaming:
        raise ValueError("match_clicks() joins two streams or two batches, not one of each")
    imps = impressions.select(
        F.col("ad_id").alias("imp_ad_id"),
        F.col("user_id").alias("imp_user_id"),
        F.col("impression_id"),
        F.col("event_time").alias("impression_time"),
        F.col("event_ts").alias("imp_ts"),
        *_watermark_columns("imp", streaming),
    )
    clks = clicks.select(
        F.col("ad_id"),
        F.col("user_id"),
        F.col("click_id"),
        F.col("event_time").alias("click_time"),
        F.col("received_ms").alias("click_received_ms"),
        F.col("event_ts").alias("click_ts"),
        *[F.col(name) for name in carry],
        *_watermark_columns("click", streaming),
    )
    window = F.expr(f"INTERVAL {int(window_ms)} MILLISECONDS")
    if streaming:
        imp_wm, click_wm = imps["imp_wm"], clks["click_wm"]
        # The event times, as `watermark_ts + ahead_of_receipt` (equal to `event_ts`): Spark tries each
        # comparison of the condition as a bound for evicting state, and one between two plain timestamp
        # columns of the two sides makes it log a warning with a stack trace on every micro-batch; one with two
        # columns of a side it passes over in silence (StreamingJoinHelper.getStateValueWatermark).
        imp_time = imp_wm + imps["imp_ahead"]
        click_time = click_wm + clks["click_ahead"]
    else:
        imp_time, click_time = imps["imp_ts"], clks["click_ts"]
    # ad_id first: both topics are keyed by ad_id, and the join shuffles by its keys in this order.
    condition = (
        (clks["ad_id"] == imps["imp_ad_id"])
        & (clks["user_id"] == imps["imp_user_id"])
        & (imp_time <= click_time)
        & (click_time <= imp_time + window)
    )
    if streaming:
        condition = condition & (imp_wm <= click_wm) & (click_wm <= imp_wm + window)
    matches = clks.join(imps, condition, "inner").select(*MATCH_COLUMNS, *carry, *(["click_wm"] if streaming else []))
    if streaming:
        one_per_click = matches.dropDuplicatesWithinWatermark(["click_id"])
    else:
        latest = Window.partitionBy("click_id").orderBy(F.col("impression_time").desc(), F.col("impression_id"))
        ranked = matches.withColumn("_rank", F.row_number().over(latest))
        one_per_click = ranked.filter(F.col("_rank") == 1).drop("_rank")
    return one_per_click.select(*MATCH_COLUMNS, *carry)


def _watermark_columns(side: str, streaming: bool) -> list[Column]:
    """A stream side's `watermark_ts` and `ahead_of_receipt` as `{side}_wm` and `{side}_ahead`; none in a batch."""
    if not streaming:
        return []
    return [F.col(WATERMARK_TS).alias(f"{side}_wm"), F.col(AHEAD_OF_RECEIPT).alias(f"{side}_ahead")]


def _arrival(id_col: str) -> WindowSpec:
    return Window.partitionBy(id_col).orderBy("received_ms", "partition", "offset")
