"""The invalid traffic rules on DataFrames (`billing.invalid` is the reference, in plain Python).

- `known_bot(user_agent)`: the crawler list matched in the JVM (`rlike`, Java's `find`: a search anywhere in the text,
  case-sensitive, as the package's `is_crawler`), never a Python function per row. The list's 1,504 patterns are
  matched as one expression with their literal prefixes merged (`billing.store.crawler_list.factored_regex`): Java
  tries every branch of an alternation at every position of the text, and the plain alternation cost about a
  millisecond per user agent; merged, the branches whose first character does not fit are skipped.
- `judged_clicks(clicks, rules)`: on a batch of every click received (one copy per id), the flood and duplicate
  rules as window functions: `click_flood` when some window of `flood_window_ms` holding the click holds more than
  `flood_clicks` of the user's clicks, `duplicate_click` when the previous click of the user on the ad (by time, then
  id) is at most `duplicate_window_ms` before it. Reconciliation's final bills apply them (`attribution.final_bills`);
  `excluded_ip` is read on the driver against the catalog's exclusion history, on the matched clicks only.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from billing.invalid import IvtRules
from billing.store.crawler_list import CrawlerList, crawler_list, factored_regex


def known_bot(user_agent: Column, crawlers: CrawlerList | None = None) -> Column:
    """Whether the user agent matches the crawler list (the installed one unless given; false for a null one)."""
    return F.coalesce(user_agent.rlike(factored_regex((crawlers or crawler_list()).patterns)), F.lit(False))


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
