"""A click's story on real Kafka, Redis and Spark, against the DuckDB oracle: one run of the streaming job and two
of reconciliation, with a click of each outcome (charged; retracted as a duplicate click; added late; billed by the
stream after its period closed, an adjustment; an unknown ad; a paused ad; a conflicting copy; a known bot; over
budget). The open period's cold batches are compacted first, as `reconcile --every` does between its runs. Each
story's outcome is the oracle's, and says why with the evidence the files hold. Then the closed period's batch files
are compacted (`billing.store.compaction`): every story, the audit and Redis restored from the files read the same."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from attribution.audit import audit
from attribution.job import start
from attribution.restore import restore_redis
from billing.budgets import BudgetChange
from billing.catalog import Ad, AdChange, Catalog, MadeBy
from billing.events import Click, Event, Impression
from billing.periods import Periods
from billing.store.click_filters import DayFilter
from billing.store.click_story import ClickStories
from billing.store.redis_totals import RedisTotals
from billing.story import ClickStory, story_text
from ops.reconcile import compact_open_periods, reconcile, reconcile_config, run_lock
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from tests import oracle
from tests.integration.test_reconcile import read_back, while_open
from tests.integration.test_stream_job import Feed

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
S = 1_000
P0 = "20260101T0000Z"
UNTIL = T0 + 3 * 3_600_000
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 1_000_000, "EUR"),
        Ad("ad-2", "cmp-1", "adv-1", 1_000_000, "EUR"),
        Ad("ad-b", "cmp-b", "adv-1", 2_000_000, "EUR"),
        Ad("ad-p", "cmp-p", "adv-2", 500_000, "EUR"),
    ],
    budgets={"cmp-b": [BudgetChange(0, 5_000_000, 0)]},
)


def pair(name: str, ad_id: str, click_ms: int, user: str | None = None, ua: str = BROWSER) -> list[Event]:
    """An impression 1 s before its click, on `ad_id`, for a user of their own unless given."""
    user = user or f"u-{name}"
    return [Impression(f"i-{name}", ad_id, user, click_ms - S, ua), Click(f"c-{name}", ad_id, user, click_ms, ua)]


def outcome_of(story: ClickStory) -> str | None:
    """The story's outcome in the oracle's words: `charged`, the reason, or None (not billable)."""
    if story.outcome.status == "charged":
        return "charged"
    return story.outcome.reason if story.outcome.status == "not_charged" else None


def test_each_clicks_story_tells_the_oracles_outcome_and_why(spark: SparkSession, settings: Settings) -> None:
    store = settings.catalog_store()
    store.start(CATALOG)
    ensure_schemas(settings)
    now_ms = int(time.time() * 1000)
    # ad-p is paused from T0 + 5 s, by an admin's page (a back-fill: the traffic's times are 2026-01-01's).
    store.change(AdChange("ad-p", T0 + 5 * S, None), lambda: now_ms, backfill=True, made_by=MadeBy("ada", "page"))
    queries = start(spark, stream_config(settings))
    stream = Feed(settings, queries)

    try:
        stream(
            pair("ok", "ad-1", T0 + 10 * S)
            + pair("bot", "ad-1", T0 + 10 * S, ua=BOT)
            + pair("paused", "ad-p", T0 + 10 * S)
            + pair("unknown", "ad-x", T0 + 10 * S)
            + pair("conflict", "ad-1", T0 + 12 * S)
            + pair("b1", "ad-b", T0 + 20 * S)
            + pair("b2", "ad-b", T0 + 21 * S)
            + pair("b3", "ad-b", T0 + 22 * S)
            + pair("charged-first", "ad-2", T0 + 200 * S, "u-twin")
        )
        # The same click id again with other content: the first copy stands, this one is an id conflict.
        stream([Click("c-conflict", "ad-2", "u-conflict", T0 + 13 * S)])
        stream(pair("later", "ad-1", T0 + 400 * S))
        late = pair("late-twin", "ad-2", T0 + 190 * S, "u-twin") + pair("late", "ad-1", T0 + 150 * S)
        stream([late[0], late[2]])  # the impressions on time ...
        stream(pair("later-still", "ad-1", T0 + 500 * S))
        stream([late[1], late[3]])  # ... the clicks late: the stream does not bill them
        rc = dataclasses.replace(reconcile_config(settings), compact_closed=False)  # compacted at the end
        # While the period is open, a pass of `reconcile --every` compacts its cold batches of every kind (the
        # ledger, the archive's clicks and impressions, unbilled/, not_charged/): the run, the stories, the audit and
        # the stream's next batches read them after.
        with run_lock(rc):
            opened = compact_open_periods(rc)
        print(opened.describe())
        assert opened.through is not None and opened.periods >= 1 and not opened.failed, opened.describe()
        assert list((settings.root / "archive/event_type=click").rglob("compacted-*.parquet")), opened.describe()
        assert P0 in reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True).closed
        # After the close, a click the stream bills in the closed period: an adjustment in the open period.
        stream(pair("after-close", "ad-1", T0 + 900 * S))
        _, open_then = while_open(lambda: reconcile(spark, rc, store.current(), until_ms=UNTIL, force=True))
    finally:
        for query in queries:
            query.stop()

    truth = {
        row["click_id"]: row["outcome"] for row in oracle.outcomes(read_back(settings, stream.sent), store.current())
    }
    periods = Periods(settings.period_ms)
    stories = ClickStories(settings.layout, store, periods, settings.ivt_rules, settings.topic_clicks)
    told = {f"c-{n}": stories.tell(f"c-{n}") for n in (
        "ok", "bot", "paused", "unknown", "conflict", "b1", "b2", "b3", "charged-first", "late-twin", "late",
        "after-close",
    )}  # fmt: skip
    assert {c: outcome_of(s) for c, s in told.items()} == {c: truth.get(c) for c in told}, "\n\n".join(
        story_text(s) for s in told.values()
    )
    assert {c: truth[c] for c in told} == {
        "c-ok": "charged",
        "c-bot": "known_bot",
        "c-paused": "ad_paused",
        "c-unknown": "unknown_ad",
        "c-conflict": "charged",
        "c-b1": "charged",
        "c-b2": "charged",
        "c-b3": "over_budget",
        "c-charged-first": "duplicate_click",
        "c-late-twin": "charged",
        "c-late": "charged",
        "c-after-close": "charged",
    }

    ok = told["c-ok"]
    assert ok.outcome.closed and ok.outcome.settled_by == "export" and ok.advertiser_id == "adv-1"
    assert ok.attributed is not None and ok.attributed.impression_id == "i-ok" and ok.attributed.gap_ms == 1_000
    assert ok.price is not None and (ok.price.cpc_micros, ok.price.version) == (1_000_000, 0)
    assert [(s.action, s.amount_micros) for s in ok.stream] == [("charged", 1_000_000)]
    (row,) = ok.exports
    assert (row.period, row.file, row.status, row.net_micros) == (P0, "billing.parquet", "billed", 1_000_000)
    assert [(c.topic, c.status) for c in ok.copies] == [(settings.topic_clicks, "stands")]

    bot = told["c-bot"]
    assert bot.invalid is not None and bot.invalid.bot_pattern and "Googlebot" in BOT
    assert [e.file for e in bot.exports] == ["not_charged.parquet"]

    paused = told["c-paused"]
    assert paused.price is not None and paused.price.unbillable == "ad_paused"
    assert paused.price.change is not None and (paused.price.change.who, paused.price.change.door) == ("ada", "page")
    assert paused.advertiser_id == "adv-2" and [s.action for s in paused.stream] == ["unbilled"]

    unknown = told["c-unknown"]
    assert unknown.advertiser_id is None and unknown.price is not None and unknown.price.unbillable == "unknown_ad"

    conflict = told["c-conflict"]
    assert [(c.status, c.ad_id, c.differs) for c in conflict.copies] == [
        ("stands", "ad-1", ()),
        ("id_conflict", "ad-2", ("ad_id", "event_time")),
    ]

    b3 = told["c-b3"]
    assert b3.budget is not None and not b3.budget.fits
    assert (b3.budget.budget_micros, b3.budget.charged_before_micros, b3.budget.charged_before_clicks) == (
        5_000_000,
        4_000_000,
        2,
    )

    twin = told["c-charged-first"]
    assert twin.invalid is not None and twin.invalid.twin is not None and twin.invalid.twin.click_id == "c-late-twin"
    assert [(c.kind, c.reason) for c in twin.corrections] == [("retraction", "duplicate_click")]
    assert [s.action for s in twin.stream] == ["charged"]

    late = told["c-late"]
    assert late.copies[0].late and not late.stream
    assert [(c.kind, c.reason, c.adjustment) for c in late.corrections] == [("addition", "late_click", False)]
    assert [(e.status, e.reason) for e in late.exports] == [("added", "late_click")]

    after = told["c-after-close"]
    assert after.outcome.settled_by == "adjustment" and not after.exports
    assert [(c.kind, c.adjustment) for c in after.corrections] == [("addition", True)]
    assert after.corrections[0].booked_period in open_then, (after.corrections, open_then)
    assert [s.action for s in after.stream] == ["charged"]

    nobody = stories.tell("c-never-sent")
    assert nobody.outcome.status == "not_received" and not nobody.copies

    # A run that closes nothing compacts the closed period's batch files (the newest few batches, hot, and the
    # other periods' stay as written): the stories, the audit and Redis restored from the files are the same.
    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    audits = audit(spark, rc, store.current())
    restored = restore_redis(settings.root, totals, store.current(), periods, "billing"), redis_dump(totals)
    files = closed_files(settings.root)
    reconcile(spark, reconcile_config(settings), store.current(), until_ms=UNTIL, force=True)
    left = closed_files(settings.root)
    assert sum(left.values()) < sum(files.values()), (files, left)
    for kind in ("ledger", "archive/event_type=click", "archive/event_type=impression"):
        assert len(list((settings.root / kind / f"period={P0}").glob("*/compacted-*.parquet"))) == 1, (kind, left)
    print(f"the closed period {P0}'s batch files before compaction: {files}; after: {left}")
    # The run wrote the closed period's day filter: the stories below read through it (billing.store.click_filters).
    assert P0 in DayFilter(settings.layout.click_day_filter(P0[:8])).parts
    assert {c: stories.tell(c) for c in told} == told
    day = dt.datetime.fromtimestamp(T0 / 1000, dt.UTC).date()  # every click's day: the same stories, that day read
    assert {c: stories.tell(c, day) for c in told} == told
    first, again = told["c-conflict"].copies  # two rows of one compacted file, each with its own batch
    assert first.batch_id is not None and again.batch_id is not None and first.batch_id < again.batch_id
    assert audit(spark, rc, store.current()) == audits
    assert (restore_redis(settings.root, totals, store.current(), periods, "billing"), redis_dump(totals)) == restored


def closed_files(root: Path) -> dict[str, int]:
    """The Parquet files of the closed period's batch folders, per kind."""
    kinds = ("ledger", "archive/event_type=click", "archive/event_type=impression", "unbilled", "not_charged")
    return {kind: sum(1 for _ in (root / kind / f"period={P0}").rglob("*.parquet")) for kind in kinds}


def redis_dump(totals: RedisTotals) -> dict[object, object]:
    """Every key under the prefix and its value, but the last reconciliation run's and compaction passes' records (a
    run's own) and the counters of `/metrics` (what every batch applied adds to, a restore too)."""
    client, out = totals.client, dict[object, object]()
    left_out = (
        totals.keys.last_reconciliation(),
        totals.keys.counters(),
        *(totals.keys.compaction(part) for part in ("closed", "open", "filters")),  # a pass's own record
    )
    for key in client.scan_iter(match=f"{totals.keys.prefix}*"):
        if (key.decode() if isinstance(key, bytes) else key) in left_out:
            continue
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        value = {
            "hash": lambda k: client.hgetall(k),
            "set": lambda k: sorted(client.smembers(k)),
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
            "list": lambda k: client.lrange(k, 0, -1),
        }.get(kind, lambda k: client.get(k))(key)
        out[key] = value
    return out
