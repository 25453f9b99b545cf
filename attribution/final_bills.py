"""The final bills: the attribution rule applied by Spark to every event the stream archived.

Spark's one job in reconciliation (`billing.reconcile_run`, through `SparkFinalBills`) and in the audit
(`attribution.audit`, through `final_charges`): the archived impressions of the due periods and of the period before
each (a click may be attributed to an impression up to 10 s earlier) and the clicks of the due periods and of the
periods beside them, with every other copy of their ids from any period, de-duplicated by first arrival, through the
same `match_clicks()` as the stream (`attribution.join`), each matched click with what the flood and duplicate rules
find (`attribution.invalid`) and its user agent and address; id conflicts and late events beside (`final_bills`).
The matches come back unpriced; `final_charges` collects them as Arrow, prices them with the catalog's history
(`attribution.pricing`), judges the crawler list and the exclusion list on the driver, and charges them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from attribution.invalid import judged_clicks
from attribution.join import MATCH_COLUMNS, conflicts, dedupe, match_clicks
from attribution.periods import period_columns
from attribution.pricing import price_matches
from billing.catalog import Catalog
from billing.corrections import ArrivalFacts
from billing.invalid import DEFAULT_RULES, IvtRules, first_reason
from billing.layout import DataLayout
from billing.periods import DAY_MS, Periods
from billing.rule import BILLABLE_FIELDS, NOT_CHARGED_FIELDS, BillableClick, charge
from billing.store.columns import schema
from billing.store.crawler_list import PACKAGE as CRAWLER_PACKAGE
from billing.store.crawler_list import CrawlerList, crawler_list, kept_list
from billing.store.export_files import MANIFEST_FILE, read_manifest
from billing.store.not_charged_clicks import not_charged_by_stream, unbilled_by_stream
from billing.store.redis_totals import NOT_CHARGED_REASONS

V = TypeVar("V")

FINAL_MATCH_COLUMNS = (*MATCH_COLUMNS[:6], "period", "user_agent", "ip", "click_flood", "duplicate_click")
"""The final matches' columns: the click, its attributed impression and their times, the click's period, and what
the invalid traffic rules read or found (the click's `user_agent` and `ip`; whether it is in a flood, a duplicate
click)."""


def scope_of(due: list[str], periods: Periods, whole_days: bool) -> list[str]:
    """The periods whose final bills a run computes: the due ones and, with `whole_days` (some campaign has a daily
    budget), every other period of their UTC days: the earlier ones because a click's charge depends on the clicks
    before it that day, the later ones (still open, as received so far) for the bills a late click earlier in the
    day leaves over the budget (`billing.reconcile_run.budget_room`)."""
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
    `through_batch` when given (the batch a reconciliation run reads the ledger up to as well).

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


@dataclass(frozen=True)
class SparkFinalBills:
    """The final bills of a run's due periods, collected from Spark as Arrow: the charged clicks, and the billable
    clicks not charged with the reason (no price, an invalid traffic rule, the budget)."""

    bills: pa.Table
    conflicts: pa.Table
    facts: ArrivalFacts
    not_charged: pa.Table = field(default_factory=lambda: pa.table({"click_id": pa.array([], pa.string())}))
    rules: IvtRules = DEFAULT_RULES

    @classmethod
    def of(
        cls, charges: FinalCharges, layout: DataLayout, due: list[str], rules: IvtRules = DEFAULT_RULES
    ) -> SparkFinalBills:
        """The final bills of `final_charges`' answer for the due periods (judged with `rules`), with what the
        data says about how their events arrived and what the stream decided (its files under `layout`)."""
        charged, not_charged, quarantined, late = charges
        refused = not_charged.filter(pc.is_in(not_charged["reason"], pa.array(sorted(NOT_CHARGED_REASONS))))
        facts = ArrivalFacts(
            late_click_ids=_ids_of(late, "click"),
            late_impression_ids=_ids_of(late, "impression"),
            conflicting_click_ids=_ids_of(quarantined, "click"),
            conflicting_impression_ids=_ids_of(quarantined, "impression"),
            unpriced_click_ids=set(
                not_charged.filter(pc.is_in(not_charged["reason"], pa.array(["ad_paused", "unknown_ad"])))[
                    "click_id"
                ].to_pylist()
            )
            | unbilled_by_stream(layout, due),
            not_charged_reasons=dict(zip(refused["click_id"].to_pylist(), refused["reason"].to_pylist(), strict=True)),
            stream_not_charged=not_charged_by_stream(layout, due),
        )
        return cls(charged, quarantined, facts, not_charged, rules)

    @property
    def clicks(self) -> int:
        return self.bills.num_rows

    @property
    def judged_with(self) -> dict[str, Any]:
        return {
            "crawler_list_version": crawler_list().version,
            "crawler_list_package": CRAWLER_PACKAGE,
            **self.rules.as_dict(),
        }

    def of_period(self, period: str) -> list[dict[str, Any]]:
        return self.bills.filter(pc.equal(self.bills["period"], period)).drop(["period"]).to_pylist()

    def not_charged_of(self, period: str) -> list[dict[str, Any]]:
        return self.not_charged.filter(pc.equal(self.not_charged["period"], period)).to_pylist()


class FinalCharges(NamedTuple):
    """What `final_charges` finds for the due periods."""

    charged: pa.Table
    """The charged clicks with their `period` (`BILLABLE_FIELDS`)."""
    not_charged: pa.Table
    """The billable clicks not charged, with `period` and `reason`."""
    quarantined: pa.Table
    """The id conflicts."""
    late: pa.Table
    """The late events."""


def final_charges(
    spark: SparkSession,
    layout: DataLayout,
    period_ms: int,
    due: list[str],
    catalog: Catalog,
    through_batch: int | None = None,
    rules: IvtRules = DEFAULT_RULES,
) -> FinalCharges:
    """The due periods' `FinalCharges`: Spark's final matches priced by the catalog's history, judged
    (`billing.invalid`: the flood and duplicate rules found by Spark, the crawler list and the exclusion list on the
    driver, each period with the list it was judged with) and charged in event-time order within each campaign's UTC
    day (`billing.rule.charge`). With budgets in the catalog, the due periods' whole UTC days are computed
    (`scope_of`), since a click's charge depends on the clicks before it that day; the clicks not charged are given
    for all of them, so that a run sees which bills of a still open period of the day are over the budget now.

    The crawler list is searched in Python, as the stream and the click's story search it and as the package's own
    `is_crawler` does, once per distinct user agent: Java's expressions differ from Python's on a few texts (`\\d`
    and a non-ASCII digit, `$` before a trailing carriage return), and one list must give one verdict."""
    periods = Periods(period_ms)
    scope = scope_of(due, periods, catalog.has_budgets)
    thresholds, lists = judged_as_closed(layout, scope, rules)
    final_df, quarantined_df, late_df = final_bills(
        spark, layout.archive, period_ms, scope, through_batch, rules, thresholds
    )
    matches = final_df.toArrow()
    priced = price_matches(matches, catalog)
    rows = priced.bills.to_pylist()
    installed = crawler_list()
    invalid: dict[str, str] = {}
    for row in rows:
        reason = first_reason(
            bot=lists.get(row["period"], installed).matches(row["user_agent"]),
            excluded=catalog.exclusions.excluding(row["ip"], row["click_time"]) is not None,
            flood=bool(row["click_flood"]),
            duplicate=bool(row["duplicate_click"]),
        )
        if reason is not None:
            invalid[row["click_id"]] = reason.value
    period_of = {row["click_id"]: row["period"] for row in rows}
    charged, refused = charge(
        [BillableClick(**{name: row[name] for name in BILLABLE_FIELDS}) for row in rows], invalid, catalog
    )
    wanted = set(due)
    bills = pa.Table.from_pylist(
        [{**r.to_dict(), "period": period_of[r.click_id]} for r in charged if period_of[r.click_id] in wanted],
        schema=FINAL_BILL_SCHEMA,
    )
    unpriced = [
        {**{n: row.get(n) for n in NOT_CHARGED_FIELDS}, "period": row["period"]}
        for row in priced.unbilled.to_pylist()
        if row["period"] in wanted
    ]
    not_charged = pa.Table.from_pylist(
        [*unpriced, *({**r.to_dict(), "period": period_of[r.click_id]} for r in refused)],
        schema=FINAL_NOT_CHARGED_SCHEMA,
    )
    quarantined = quarantined_df.toArrow()
    quarantined = quarantined.filter(pc.is_in(quarantined["period"], pa.array(due, pa.string())))
    late = late_df.toArrow()
    return FinalCharges(bills, not_charged, quarantined, late)


def judged_as_closed(
    layout: DataLayout, scope: Iterable[str], rules: IvtRules
) -> tuple[dict[str, IvtRules], dict[str, CrawlerList]]:
    """What each closed period of `scope` was judged with, from its export's manifest, where it differs from
    today's: the flood and duplicate thresholds, and the crawler list's version (its patterns as `keep_list` kept
    them). A change of either applies to periods not yet closed, so a closed period reconciled again (a late event,
    a catalog change) is judged as it was. An export that names neither, or a version whose patterns were not kept,
    is judged with today's."""
    thresholds: dict[str, IvtRules] = {}
    crawlers: dict[str, CrawlerList] = {}
    installed = crawler_list().version
    for period in scope:
        folder = layout.export(period)
        if not (folder / MANIFEST_FILE).exists():
            continue
        judged = read_manifest(folder).judged_with
        if (kept := rules.or_judged_with(judged)) != rules:
            thresholds[period] = kept
        version = judged.get("crawler_list_version")
        if version and version != installed and (listed := kept_list(layout.crawler_lists, str(version))):
            crawlers[period] = listed
    return thresholds, crawlers


FINAL_BILL_SCHEMA = schema((*BILLABLE_FIELDS, "period"))
FINAL_NOT_CHARGED_SCHEMA = schema((*NOT_CHARGED_FIELDS, "period"))


def _ids_of(table: pa.Table, event_type: str) -> set[str]:
    return set(pc.filter(table["event_id"], pc.equal(table["event_type"], event_type)).to_pylist())


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
