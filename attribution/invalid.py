"""The invalid traffic rules on DataFrames (`billing.invalid` is the reference, in plain Python).

- `judged_clicks(clicks, rules)`: on a batch of every click received (one copy per id), the flood and duplicate
  rules as window functions: `click_flood` when some window of `flood_window_ms` holding the click holds more than
  `flood_clicks` of the user's clicks, `duplicate_click` when the previous click of the user on the ad (by time, then
  id) is at most `duplicate_window_ms` before it. Reconciliation's final bills apply them (`attribution.final_bills`);
  `known_bot` and `excluded_ip` are read on the driver, on the matched clicks only: the crawler list in Python, as
  the package's own `is_crawler` searches it, and the exclusion history of the catalog.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from billing.invalid import IvtRules


def judged_clicks(clicks: DataFrame, rules: IvtRules, id_col: str = "click_id") -> DataFrame:
    """`clicks` (one row per click id, with `user_id`, `ad_id`, `event_time`) with the booleans `click_flood` and
    `duplicate_click`. Batch only: the windows need every click of a user."""
    by_time = Window.partitionBy("user_id").orderBy("event_time")
    ahead = by_time.rangeBetween(0, rules.flood_window_ms)
    behind = by_time.rangeBetween(-rules.flood_window_ms, 0)
    starts = clicks.withColumn("_starts_flood", F.count(F.lit(1)).over(ahead) > F.lit(rules.flood_clicks))
    previous = Window.partitionBy("user_id", "ad_id").orderBy("event_time", id_col)
    return (
        starts.withColumn("click_flood", F.max(F.col("_starts_flood")).over(behind))
        .withColumn(
            "duplicate_click",
            F.coalesce(
                F.col("event_time") - F.lag("event_time").over(previous) <= F.lit(rules.duplicate_window_ms),
                F.lit(False),
            ),
        )
        .drop("_starts_flood")
    )
