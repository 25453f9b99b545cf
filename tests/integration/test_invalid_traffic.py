"""Invalid traffic and daily budgets under the running streaming job, on real Kafka, Redis and Spark: what the stream
charges live, what reconciliation corrects (in an open period, then as adjustments after close), a range added
while the job runs, a late click that makes a billed click a duplicate, a late click earlier in the day than
clicks charged up to the budget, the books audited and Redis restored."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

import attribution.final_bills
import billing.store.click_story
import billing.store.crawler_list
import ops.reconcile
from attribution.audit import audit
from attribution.job import start
from attribution.restore import restore_redis
from billing.budgets import BudgetChange, utc_day
from billing.catalog import Ad, Catalog, ExclusionSetting
from billing.events import Click, Impression
from billing.invalid import INVALID_REASONS, ExclusionChange, IpExclusions, IvtRules
from billing.periods import Periods
from billing.reconcile_run import RunReport
from billing.store.click_story import ClickStories
from billing.store.crawler_list import CrawlerList, crawler_list
from billing.store.parquet_ledger import read_ledger
from billing.store.redis_totals import RedisTotals
from ops.reconcile import audit_table, reconcile, reconcile_config
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.publisher import simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator
from tests import oracle
from tests.integration.test_closing_follows_stream import Stop, stop_at
from tests.integration.test_reconcile import corrections, final_ledger, read_back, while_open
from tests.integration.test_stream_job import Feed
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
S = 1_000
H = 3_600_000
P0 = "20260101T0000Z"
UNTIL = T0 + 3 * H
WRITTEN = re.compile(rf"period {P0}: [1-9][0-9]* new correction\(s\) written")
"""A reconciliation's progress once it has written the period's new corrections, before Redis."""
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"

CATALOG = Catalog(
    [
        *(Ad(f"ad-{n}", "cmp-1", "adv-1", 1_000_000, "EUR") for n in range(1, 24)),
        Ad("ad-b", "cmp-b", "adv-1", 2_000_000, "EUR"),
    ],
    budgets={"cmp-b": [BudgetChange(0, 5_000_000, 0)]},
    exclusions=IpExclusions([ExclusionChange("203.0.113.0/24", 0, True, 0)]),
)


def pair(name: str, ad_id: str, click_ms: int, user: str | None = None, ua: str = BROWSER, ip: str = "192.0.2.1"):
    """An impression 1 s before its click, on `ad_id`, for a user of their own unless given."""
    user = user or f"u-{name}"
    return [
        Impression(f"i-{name}", ad_id, user, click_ms - S, ua, ip),
        Click(f"c-{name}", ad_id, user, click_ms, ua, ip),
    ]


def not_charged(settings: Settings) -> dict[str, str]:
    folder = settings.root / "not_charged"
    if not folder.exists():
        return {}
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=["click_id", "reason"])
    return dict(zip(table["click_id"].to_pylist(), table["reason"].to_pylist(), strict=True))


def charged(settings: Settings) -> set[str]:
    return set(read_ledger(settings.root / "ledger")["click_id"].to_pylist())


def stream_rows(settings: Settings) -> list[tuple[str, int, str, int]]:
    """(click, micros, ad, batch) of the stream's ledger."""
    table = read_ledger(settings.root / "ledger")
    return list(zip(*(table[c].to_pylist() for c in ("click_id", "amount_micros", "ad_id", "batch_id")), strict=True))


def test_the_stream_filters_invalid_traffic_and_holds_budgets_and_reconciliation_corrects_it_exactly(
    spark: SparkSession, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = settings.catalog_store()
    store.start(CATALOG)
    ensure_schemas(settings)
    queries = start(spark, stream_config(settings))
    read = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    day = utc_day(T0)

    def day_total() -> int:
        return int(read.client.hget(read.keys.budget_day(day, "cmp-b"), "charged_micros") or 0)

    def within_budget() -> None:
        # At every batch, not only at the end: no day's live total passes its budget.
        assert day_total() <= 5_000_000

    stream = Feed(settings, queries, within_budget)

    try:
        flood = [e for n in range(21) for e in pair(f"flood-{n:02d}", f"ad-{n + 1}", T0 + 30 * S + n * S, "u-flood")]
        stream(
            pair("ok", "ad-1", T0 + 10 * S)
            + pair("bot", "ad-1", T0 + 10 * S, ua=BOT)
            + pair("net", "ad-1", T0 + 10 * S, ip="203.0.113.9")
            + pair("twice-1", "ad-2", T0 + 10 * S, "u-twice")
            + pair("twice-2", "ad-2", T0 + 11 * S, "u-twice")
            + flood
            # cmp-b: 2.00 a click against 5.00 a day; the third and fourth do not fit.
            + pair("b1", "ad-b", T0 + 20 * S)
            + pair("b2", "ad-b", T0 + 21 * S)
            + pair("b3", "ad-b", T0 + 22 * S)
            + pair("b4", "ad-b", T0 + 23 * S)
        )
        live = not_charged(settings)
        assert charged(settings) == {"c-ok", "c-twice-1", "c-b1", "c-b2"}
        assert {c: r for c, r in live.items() if not c.startswith("c-flood")} == {
            "c-bot": "known_bot",
            "c-net": "excluded_ip",
            "c-twice-2": "duplicate_click",
            "c-b3": "over_budget",
            "c-b4": "over_budget",
        }
        assert {r for c, r in live.items() if c.startswith("c-flood")} == {"click_flood"}
        assert len([c for c in live if c.startswith("c-flood")]) == 21
        assert day_total() == 4_000_000
        counts = read.client.hgetall(read.keys.not_charged(P0, "adv", "adv-1"))
        assert (counts["known_bot"], counts["known_bot:micros"]) == ("1", "1000000")
        assert (counts["click_flood"], counts["over_budget"], counts["over_budget:micros"]) == ("21", "2", "4000000")

        # A range excluded while the job runs applies from its effective time only (a back-fill: the traffic's
        # times are 2026-01-01's, in the past of the machine's clock).
        now_ms = int(time.time() * 1000)
        store.change(ExclusionSetting("198.51.100.0/24", T0 + 100 * S, True), lambda: now_ms, backfill=True)
        stream(
            pair("before-range", "ad-3", T0 + 100 * S - 1, ip="198.51.100.7")
            + pair("in-range", "ad-3", T0 + 100 * S, ip="198.51.100.8")
            + pair("v6", "ad-3", T0 + 100 * S, ip="2001:db8::1")
        )
        assert "c-before-range" in charged(settings) and "c-v6" in charged(settings)
        assert not_charged(settings)["c-in-range"] == "excluded_ip"

        # The traffic moves on (the watermark passes 3 minutes), then two late clicks: one 10 s before a click the
        # stream charged for the same user and ad (which makes that one a duplicate click), and one on cmp-b
        # earlier in the day than the clicks charged up to its budget.
        stream(pair("charged-first", "ad-4", T0 + 200 * S, "u-late"))
        stream(pair("later", "ad-5", T0 + 400 * S))
        assert "c-charged-first" in charged(settings)
        late = pair("late-twin", "ad-4", T0 + 190 * S, "u-late") + pair("late-budget", "ad-b", T0 + 15 * S)
        stream([late[0], late[2]])  # the impressions on time ...
        stream(pair("later-still", "ad-6", T0 + 500 * S))
        stream([late[1], late[3]])  # ... the clicks late: the stream does not bill them
        assert {"c-late-twin", "c-late-budget"}.isdisjoint(charged(settings))

        history = store.current()
        received = read_back(settings, stream.sent)
        outcomes = {row["click_id"]: row["outcome"] for row in oracle.outcomes(received, history)}
        assert outcomes["c-late-twin"] == "charged" and outcomes["c-charged-first"] == "duplicate_click"
        assert [outcomes[c] for c in ("c-late-budget", "c-b1", "c-b2", "c-b3")] == [
            "charged",
            "charged",
            "over_budget",
            "over_budget",
        ]

        rc = reconcile_config(settings)
        # A reconciliation killed at each of its steps (its corrections written, applied to Redis, the export
        # written before Redis knows the period closed), then one that completes: each correction, not-charged count
        # and budget day is booked once (Redis is compared with a restore from the files at the end).
        for step in (
            WRITTEN,
            f"period {P0}: corrections applied to Redis",
            f"period {P0}: exported",
        ):
            with pytest.raises(Stop):
                reconcile(spark, rc, history, until_ms=UNTIL, force=True, progress=stop_at(step))
        reconcile(spark, rc, history, until_ms=UNTIL, force=True)
        assert P0 in read.closed_periods()
        expected = {r["click_id"]: r["amount_micros"] for r in oracle.billable(received, history)}
        assert final_ledger(settings) == expected
        fixes = {(c.click_id, c.kind.value, c.reason.value) for c in corrections(settings)}
        assert {
            ("c-charged-first", "retraction", "duplicate_click"),
            ("c-late-twin", "addition", "late_click"),
            ("c-b2", "retraction", "over_budget"),
            ("c-late-budget", "addition", "late_click"),
        } <= fixes
        # The day's final charged total of cmp-b is within its budget, in Redis as in the books.
        assert day_total() == 4_000_000
        export = settings.root / "exports" / P0
        assert (export / "not_charged.parquet").exists()
        manifest = (export / "manifest.json").read_text()
        assert '"crawler_list_version"' in manifest and '"click_flood"' in manifest

        # After the close, a late click that makes a click of the closed period a duplicate: an invalid activity
        # adjustment in the open period, pointing at the period it corrects. The thresholds and the crawler list
        # change meanwhile: they apply to periods not yet closed, so the closed period is judged again as it was
        # (under these, its flood of 21, its twin 1 s apart and its crawler would be charged, and the late twin below
        # would not make a duplicate).
        rc = dataclasses.replace(rc, ivt_rules=IvtRules(flood_clicks=30, duplicate_window_ms=500))
        installed = crawler_list()
        assert (settings.layout.crawler_lists / f"{installed.version}.json").exists(), "kept by the reconciliation runs"
        upgraded = CrawlerList("99.0.0", tuple(p for p in installed.patterns if not re.search(p, BOT)))
        assert not upgraded.matches(BOT)
        for module in (attribution.final_bills, ops.reconcile, billing.store.crawler_list, billing.store.click_story):
            monkeypatch.setattr(module, "crawler_list", lambda: upgraded)
        stream(pair("closed-twin", "ad-7", T0 + 300 * S, "u-closed"))  # billed after the close ...
        stream(pair("closed-twin-0", "ad-7", T0 + 295 * S, "u-closed"))

        def killed_then_again() -> RunReport:
            with pytest.raises(Stop):  # killed with the adjustment written, before Redis
                reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True, progress=stop_at(WRITTEN))
            return reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True)

        again, open_then = while_open(killed_then_again)
        assert P0 in again.periods and P0 not in again.closed
        adjustments = {
            (c.click_id, c.reason.value, c.booked_period)
            for c in corrections(settings)
            if c.corrects_period == P0 and c.booked_period != P0
        }
        booked = {
            period
            for click, reason, period in adjustments
            if click == "c-closed-twin-0" and reason in ("billed_after_close", "late_click")
        }
        assert len(booked) == 1 and booked <= open_then, (adjustments, open_then)
        received = read_back(settings, stream.sent)
        assert final_ledger(settings) == {
            r["click_id"]: r["amount_micros"] for r in oracle.billable(received, store.current())
        }
        audits = audit(spark, rc, store.current())
        # The crawler's story tells the verdict of its period's list, with the pattern it matched there.
        told = ClickStories(settings.layout, store, Periods(), rc.ivt_rules, settings.topic_clicks).tell("c-bot")
        assert told.invalid is not None and told.invalid.reason == "known_bot", told.invalid
        assert told.invalid.crawler_list_version == installed.version
        assert told.invalid.bot_pattern in installed.matching(BOT) and not upgraded.matches(BOT)
        assert audits and all(a.balanced for a in audits), audit_table(audits)

        # Redis restored from the data folder gives back the not-charged figures and each campaign's day.
        for query in queries:
            query.stop()
        pattern_keys = ("not-charged:*", "budget-day:*", "totals:*", "corrections:*")
        kept = {
            key: read.client.hgetall(key)
            for pattern in pattern_keys
            for key in read.client.scan_iter(match=f"{settings.redis_prefix}:{pattern}")
            if read.client.type(key) == "hash"
        }
        totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
        totals.wipe_billing()
        restore_redis(settings.root, totals, store.current(), Periods(), "billing")
        back = {
            key: read.client.hgetall(key)
            for pattern in pattern_keys
            for key in read.client.scan_iter(match=f"{settings.redis_prefix}:{pattern}")
            if read.client.type(key) == "hash"
        }
        assert back == kept
    finally:
        for query in queries:
            query.stop()


def test_a_days_budget_holds_over_its_periods_closed_in_separate_runs_and_a_late_click_after_both(
    spark: SparkSession, settings: Settings
) -> None:
    """One campaign's UTC day over two hourly periods, each closed by a run of its own; then a late click early in
    the day, after both closed, moves the budget's cut: the click is added to the first period and a click of the
    second, charged when it closed, is taken back as `over_budget`, both as adjustments booked in the open period.
    The day's charged total never passes the budget: live, after each close, and in the final books."""
    catalog = Catalog(
        [Ad("ad-b", "cmp-b", "adv-1", 2_000_000, "EUR"), Ad("ad-c", "cmp-b", "adv-1", 1_000_000, "EUR")],
        budgets={"cmp-b": [BudgetChange(0, 5_000_000, 0)]},
    )
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    p1 = "20260101T0100Z"
    read = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    rc = reconcile_config(settings)
    queries = start(spark, stream_config(settings))

    def day_total() -> int:
        return int(read.client.hget(read.keys.budget_day(utc_day(T0), "cmp-b"), "charged_micros") or 0)

    def within_budget() -> None:
        assert day_total() <= 5_000_000

    stream = Feed(settings, queries, within_budget)

    try:
        # 2.00 + 2.00 in the first hour, closed by a run (the machine's clock is long past the day's horizons).
        stream(pair("b1", "ad-b", T0 + 600 * S) + pair("b2", "ad-b", T0 + 1_200 * S))
        assert reconcile(spark, rc, catalog).closed == [P0]
        # Then the second hour's clicks: 1.00 reaches the day's 5.00, the 2.00 after it is not charged; its own run
        # closes it, reading the first hour's closed clicks for the day's order.
        stream(pair("c1", "ad-c", T0 + H + 600 * S) + pair("b3", "ad-b", T0 + H + 1_200 * S))
        assert charged(settings) == {"c-b1", "c-b2", "c-c1"}
        assert not_charged(settings) == {"c-b3": "over_budget"}
        assert reconcile(spark, rc, catalog, force=True).closed == [p1]
        assert day_total() == 5_000_000

        # After both closed: a 1.00 click at 00:05, ahead of every click of the day, arriving long after its time.
        stream(pair("early", "ad-c", T0 + 300 * S))
        assert "c-early" not in charged(settings)
        received = read_back(settings, stream.sent)
        outcomes = {row["click_id"]: row["outcome"] for row in oracle.outcomes(received, catalog)}
        assert [outcomes[c] for c in ("c-early", "c-b1", "c-b2", "c-c1", "c-b3")] == [
            "charged",
            "charged",
            "charged",
            "over_budget",
            "over_budget",
        ]

        third, open_periods = while_open(lambda: reconcile(spark, rc, catalog, force=True))
        assert set(third.periods) == {P0, p1} and third.closed == []
    finally:
        for query in queries:
            query.stop()

    assert final_ledger(settings) == {r["click_id"]: r["amount_micros"] for r in oracle.billable(received, catalog)}
    adjustments = {
        (c.click_id, c.kind.value, c.reason.value, c.corrects_period, c.booked_period)
        for c in corrections(settings)
        if c.booked_period not in (P0, p1)
    }
    booked = {a[4] for a in adjustments}
    assert len(booked) == 1 and booked <= open_periods, (booked, open_periods)
    open_period = booked.pop()
    assert ("c-c1", "retraction", "over_budget", p1, open_period) in adjustments
    assert {(a[0], a[1], a[3], a[4]) for a in adjustments} == {
        ("c-early", "addition", P0, open_period),
        ("c-c1", "retraction", p1, open_period),
    }
    # In Redis the day holds its budget with the adjustments applied: +1.00 and -1.00.
    assert day_total() == 5_000_000
    audits = audit(spark, rc, catalog)
    assert audits and all(a.balanced for a in audits), audit_table(audits)


def test_simulated_invalid_traffic_and_budgets_are_filtered_live_and_the_final_books_equal_the_ground_truth(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    """The simulator's crawlers, excluded ranges (one added halfway), floods, double clicks, late twins and budgets
    that run out (one changed halfway): the stream charges no click made by a crawler or from a range excluded at
    its time, no campaign's day passes its budget at any moment, and once reconciled the books are the ground
    truth, click for click and micro for micro. The share of the invalid clicks the stream caught live is printed."""
    config = SimulationConfig(
        events=24_000,
        seed=31,
        users=800,
        start_ms=T0,
        late_fraction=0.01,
        late_min_ms=60_000,
        late_max_ms=120_000,
        bad_fraction=0.0,
        crawler_fraction=0.03,
        excluded_ip_fraction=0.03,
        flood_fraction=0.05,  # expected flood clicks per ordinary click: about three floods
        double_click_fraction=0.03,
        late_duplicate_fraction=0.01,
        budget_campaigns=2,
        budget_share=0.4,
    )
    store = settings.catalog_store()
    store.start(config.catalog())
    ensure_schemas(settings)
    run_dir = tmp_path / "run"
    summary = simulate_to_kafka(
        config, settings.kafka_bootstrap, settings.registry_location, run_dir, settings.topics, None, progress=False,
        catalog_store=store,
    )  # fmt: skip
    assert summary.delivery_failures == 0
    history = store.current()
    budgeted = {campaign: entries for campaign, entries in history.budgets.items() if entries}
    assert budgeted, "the run has budgets"
    read = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    passed: list[str] = []
    watching = threading.Event()

    def watch() -> None:
        # While the job bills: no campaign's day ever shows more than a budget that was in force that day.
        while not watching.is_set():
            for campaign, entries in budgeted.items():
                limits = [b.daily_budget_micros for b in entries]
                if None in limits:
                    continue
                for day in read.client.zrange(read.keys.budget_days(), 0, -1):
                    total = int(read.client.hget(read.keys.budget_day(day, campaign), "charged_micros") or 0)
                    if total > max(limits):  # type: ignore[type-var]
                        passed.append(f"{campaign} {day}: {total} > {max(limits)}")  # type: ignore[type-var]
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    queries = start(spark, stream_config(settings))
    try:
        for query in queries:
            query.processAllAvailable()
            assert query.isActive, query.exception()
    finally:
        watching.set()
        watcher.join(5)
        for query in queries:
            query.stop()
    assert passed == []

    truth = {json.loads(line)["click_id"]: json.loads(line) for line in (run_dir / "billable.jsonl").open()}
    refused_rows = [json.loads(line) for line in (run_dir / "not_charged.jsonl").open()]
    refused = {row["click_id"]: row["reason"] for row in refused_rows}
    ad_of = {**{row["click_id"]: row["ad_id"] for row in refused_rows}, **{c: r["ad_id"] for c, r in truth.items()}}
    made = {a.event.event_id: a.made for a in Simulator(config).arrivals() if a.event is not None and a.made}
    live = charged(settings)
    # No click made by a crawler, nor from a range excluded at its time, is ever charged by the stream.
    bots = {c for c, reason in refused.items() if reason in ("known_bot", "excluded_ip")}
    assert bots and live.isdisjoint(bots)
    assert {c for c, m in made.items() if m == "crawler"} & set(truth) == set()
    invalid = {c for c, reason in refused.items() if reason in INVALID_REASONS}
    assert {refused[c] for c in invalid} == set(INVALID_REASONS), "every rule has clicks to judge"
    caught = {c for c, reason in not_charged(settings).items() if reason in INVALID_REASONS} & invalid
    print(
        f"\ninvalid clicks caught live: {len(caught)} of {len(invalid)} ({100 * len(caught) / len(invalid):.1f} %); "
        f"by rule: { {r: sum(1 for c in caught if refused[c] == r) for r in INVALID_REASONS} } of "
        f"{ {r: sum(1 for c in invalid if refused[c] == r) for r in INVALID_REASONS} }; over budget: "
        f"{sum(1 for r in refused.values() if r == 'over_budget')}"
    )

    rc = reconcile_config(settings)
    live_charged = {c: micros for c, micros, _, _ in stream_rows(settings)}
    reconcile(spark, rc, history, until_ms=T0 + 3 * H, force=True)
    assert final_ledger(settings) == {c: row["amount_micros"] for c, row in truth.items()}
    audits = audit(spark, rc, history)
    assert audits and all(a.balanced for a in audits), audit_table(audits)
    # Per budgeted campaign and day: charged (live, final, the truth) and over budget (the truth's), and the budget.
    final = final_ledger(settings)
    campaign_of = {click: history[ad].campaign_id for click, ad in ad_of.items()}
    for campaign, entries in sorted(budgeted.items()):

        def total(charges: dict[str, int], campaign: str = campaign) -> int:
            return sum(micros for click, micros in charges.items() if campaign_of[click] == campaign)

        over = sum(1 for c, r in refused.items() if r == "over_budget" and campaign_of[c] == campaign)
        print(
            f"{campaign}: budgets {[b.daily_budget_micros for b in entries]}; charged live {total(live_charged)}, "
            f"final {total(final)}, truth {total({c: r['amount_micros'] for c, r in truth.items()})}; "
            f"{over} clicks over budget"
        )
