"""A campaign's daily budget through a Redis that lost its data, or its latest writes, under the running job, on real
Kafka, Spark and Redis: the stream decides nothing on the day totals of such a Redis, so no moment of the live totals
passes a budget, before the restore, during it or after. A watcher reads the campaign's day in Redis all along."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from attribution.job import start
from attribution.restore import restore_redis
from billing.budgets import BudgetChange, utc_day
from billing.catalog import Ad, Catalog
from billing.events import Click, Impression
from billing.invalid import ExclusionChange, IpExclusions
from billing.periods import Periods
from billing.store.parquet_ledger import read_ledger
from ops.process import free_port
from ops.redis_service import LocalRedis
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from tests import oracle
from tests.integration.test_closing_follows_stream import publish
from tests.integration.test_invalid_traffic import not_charged
from tests.integration.test_overlapping_faults import lose
from tests.integration.test_reconcile import read_back
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
S = 1_000
BUDGET = 5_000_000
CATALOG = Catalog(
    [Ad("ad-b", "cmp-b", "adv-1", 2_000_000, "EUR"), Ad("ad-free", "cmp-free", "adv-1", 1_000_000, "EUR")],
    budgets={"cmp-b": [BudgetChange(0, BUDGET, 0)]},
    exclusions=IpExclusions([ExclusionChange("203.0.113.0/24", 0, True, 0)]),
)


def pair(name: str, ad_id: str, click_ms: int, ip: str = "192.0.2.1") -> list[Impression | Click]:
    return [
        Impression(f"i-{name}", ad_id, f"u-{name}", click_ms - S, None, ip),
        Click(f"c-{name}", ad_id, f"u-{name}", click_ms, None, ip),
    ]


class DayWatch:
    """Reads cmp-b's charged total of the day in Redis every 20 ms, in a thread, while Redis answers: the highest
    value it ever saw."""

    def __init__(self, url: str, prefix: str) -> None:
        self.figures = RedisFigures(redis.Redis.from_url(url, decode_responses=True, socket_timeout=1), prefix)
        self.key = self.figures.keys.budget_day(utc_day(T0), "cmp-b")
        self.highest, self.reads = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                value = int(self.figures.client.hget(self.key, "charged_micros") or 0)
            except redis.RedisError:
                continue  # Redis is down or starting: nothing to read
            self.highest, self.reads = max(self.highest, value), self.reads + 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.highest


def _failure(query, deadline_s: float = 180) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not query.isActive, "the job went on counting into a Redis that lost data"
    return str(query.exception())


def _day_charged(settings: Settings) -> int:
    ledger = read_ledger(settings.root / "ledger").to_pylist()
    return sum(r["amount_micros"] for r in ledger if r["campaign_id"] == "cmp-b")


@pytest.fixture
def own_redis(tmp_path: Path):  # type: ignore[no-untyped-def]
    started = LocalRedis(data_dir=tmp_path / "redis", port=free_port(), run_dir=tmp_path / "redis-run")
    started.start()
    yield started
    started.stop()


def test_a_redis_lost_with_the_days_budget_spent_charges_nothing_past_it_before_or_after_the_restore(
    spark: SparkSession, settings: Settings, own_redis: LocalRedis
) -> None:
    """The budget is spent but for 1 EUR when Redis comes back empty; two more 2 EUR clicks arrive. Read from the
    empty Redis, the day would look unspent and both would be charged and pinned, and the replay after the restore
    would put 8 EUR on a 5 EUR day. The batch stops before it decides; after the restore it finds both over budget."""
    settings = dataclasses.replace(settings, redis_url=own_redis.url)
    settings.catalog_store().start(CATALOG)
    ensure_schemas(settings)
    watch = DayWatch(settings.redis_url, settings.redis_prefix)
    queries = start(spark, stream_config(settings))
    try:
        # 4 EUR charged, a third 2 EUR click over budget; a dual-stack server's IPv4-mapped address in the excluded
        # range is excluded like the IPv4 address it is.
        publish(settings, pair("b1", "ad-b", T0 + 10 * S) + pair("b2", "ad-b", T0 + 20 * S))
        publish(settings, pair("b3", "ad-b", T0 + 30 * S) + pair("v6", "ad-free", T0 + 31 * S, "::ffff:203.0.113.5"))
        queries[0].processAllAvailable()
        assert _day_charged(settings) == 4_000_000
        assert not_charged(settings) == {"c-b3": "over_budget", "c-v6": "excluded_ip"}
        applied = RedisFigures.from_url(settings.redis_url, settings.redis_prefix).last_applied("billing")
        assert applied is not None

        lose(own_redis, own_redis.data_dir)
        own_redis.start()
        publish(settings, pair("b4", "ad-b", T0 + 40 * S) + pair("b5", "ad-b", T0 + 41 * S))
        assert "restore-redis" in _failure(queries[0])
        pins = (settings.root / "checkpoints" / "decisions").glob("*.parquet")
        assert not [p.name for p in pins if int(p.stem) > applied], "nothing decided against the empty Redis"

        totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
        restore_redis(settings.root, totals, CATALOG, Periods(), "billing")
        queries = start(spark, stream_config(settings))
        queries[0].processAllAvailable()
        publish(settings, pair("free", "ad-free", T0 + 50 * S))
        queries[0].processAllAvailable()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
        highest = watch.stop()

    assert not_charged(settings) == {
        "c-b3": "over_budget",
        "c-v6": "excluded_ip",
        "c-b4": "over_budget",
        "c-b5": "over_budget",
    }
    assert _day_charged(settings) == 4_000_000
    figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert figures.budget_day(utc_day(T0), "cmp-b")["charged_micros"] == 4_000_000
    assert watch.reads > 50 and highest <= BUDGET, f"the live day total reached {highest} against {BUDGET}"
    # The stream charged what the rule charges over the complete data: nothing for reconciliation to take back.
    outcomes = {r["click_id"]: r["outcome"] for r in oracle.outcomes(read_back(settings, 14), CATALOG)}
    assert {c for c, o in outcomes.items() if o == "charged"} == set(
        read_ledger(settings.root / "ledger")["click_id"].to_pylist()
    )


def test_a_redis_back_from_a_power_loss_with_older_data_stops_the_job_until_restored(
    spark: SparkSession, settings: Settings, own_redis: LocalRedis, tmp_path: Path
) -> None:
    """Redis comes back from a power loss with its file of a moment before the last batches (a Redis whose file
    was not on disk when it answered, or a copy restored from before them): the record of the batches applied is
    older than the checkpoint's commits. The job's next batch refuses to decide or count on it (its totals would
    lack the lost batches for ever, and their share of each day's budget); after `restore-redis` every figure is the
    ledger's and the budget holds."""
    settings = dataclasses.replace(settings, redis_url=own_redis.url)
    settings.catalog_store().start(CATALOG)
    ensure_schemas(settings)
    older = tmp_path / "redis-before"
    queries = start(spark, stream_config(settings))
    try:
        publish(settings, pair("a1", "ad-b", T0 + 10 * S) + pair("a-free", "ad-free", T0 + 11 * S))
        queries[0].processAllAvailable()
        figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
        applied_then = figures.last_applied("billing")
        assert applied_then is not None
        shutil.copytree(own_redis.data_dir, older)  # what the disk held then (every write answered is on it)
        publish(settings, pair("a2", "ad-b", T0 + 20 * S))
        queries[0].processAllAvailable()
        assert (figures.last_applied("billing") or -1) > applied_then
        assert figures.budget_day(utc_day(T0), "cmp-b")["charged_micros"] == 4_000_000
    finally:
        queries[0].stop()

    lose(own_redis, own_redis.data_dir)  # the power goes: what Redis held in memory is gone
    shutil.copytree(older, own_redis.data_dir)
    own_redis.start()
    figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert figures.last_applied("billing") == applied_then
    assert figures.budget_day(utc_day(T0), "cmp-b")["charged_micros"] == 2_000_000, "a2's charge is lost"

    watch = DayWatch(settings.redis_url, settings.redis_prefix)
    queries = start(spark, stream_config(settings))
    try:
        # With a2's 2 EUR lost, the day would look 3 EUR short of its budget: a3 would be charged, 6 EUR in all.
        publish(settings, pair("a3", "ad-b", T0 + 30 * S) + pair("a4", "ad-b", T0 + 31 * S))
        failure = _failure(queries[0])
        assert "lost its latest writes" in failure and "restore-redis" in failure
        assert figures.last_applied("billing") == applied_then, "nothing counted on the older data"

        restore_redis(settings.root, figures, CATALOG, Periods(), "billing")
        queries = start(spark, stream_config(settings))
        queries[0].processAllAvailable()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
        highest = watch.stop()

    assert not_charged(settings) == {"c-a3": "over_budget", "c-a4": "over_budget"}
    assert figures.budget_day(utc_day(T0), "cmp-b")["charged_micros"] == _day_charged(settings) == 4_000_000
    assert watch.reads > 50 and highest <= BUDGET, f"the live day total reached {highest} against {BUDGET}"
    ledger = read_ledger(settings.root / "ledger").to_pylist()
    redis_micros = sum(t.micros for t in figures.all_ad_totals().values())
    assert redis_micros == sum(r["amount_micros"] for r in ledger), "every batch counted once, the lost ones too"


def test_a_day_total_moved_by_reconciliation_between_a_batchs_read_and_its_apply_makes_the_batch_decide_again(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconciliation run adds a late click's 2 EUR to the day while a batch, which read the day at 2 EUR, is
    writing its files: charged on what it read, b2 would take the day to 6 EUR against 5. The apply finds the day
    moved, and the batch decides again on 4 EUR: b2 is over budget, and no moment of the day passes the budget."""
    from attribution.charging import Charging

    settings.catalog_store().start(CATALOG)
    ensure_schemas(settings)
    figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    key = figures.keys.budget_day(utc_day(T0), "cmp-b")
    decide = Charging.charge
    moved: list[bool] = []

    def reconciliation_meanwhile(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        charged = decide(self, *args, **kwargs)
        if not moved and "c-b2" in charged.decisions:
            figures.client.hincrby(key, "charged_micros", 2_000_000)  # a late click's addition, as corrections do
            moved.append(charged.decisions["c-b2"] == "charged")
        return charged

    monkeypatch.setattr(Charging, "charge", reconciliation_meanwhile)
    watch = DayWatch(settings.redis_url, settings.redis_prefix)
    queries = start(spark, stream_config(settings))
    try:
        publish(settings, pair("b1", "ad-b", T0 + 10 * S))
        queries[0].processAllAvailable()
        assert figures.budget_day(utc_day(T0), "cmp-b")["charged_micros"] == 2_000_000
        publish(settings, pair("b2", "ad-b", T0 + 20 * S))
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
        highest = watch.stop()
    assert moved == [True], "the first decision charged b2 on the day it read, which then moved"
    assert not_charged(settings) == {"c-b2": "over_budget"}
    assert figures.budget_day(utc_day(T0), "cmp-b")["charged_micros"] == 4_000_000
    assert highest <= BUDGET, f"the live day total reached {highest} against {BUDGET}"


def test_a_bill_the_stream_counted_that_the_export_lacks_counts_once_on_its_day_after_its_adjustment(
    redis_settings: Settings,
) -> None:
    """A batch with a late bill of 00:00-01:00 reaches Redis (the period still open there, so its day counts it)
    while a reconciliation run that read the ledger before that batch was committed closes the period: the export
    lacks the bill, and the next run books it as a `billed_after_close` adjustment in the open period. The day counts
    it once: the close gives the period's share of the day to the export, the adjustment adds the bill."""
    from billing.corrections import Correction
    from billing.store.redis_totals import BudgetDayCount, RedisTotals, TotalsRow

    totals = RedisTotals.from_url(redis_settings.redis_url, redis_settings.redis_prefix)
    day = utc_day(T0)
    p0, p1 = "20260101T0000Z", "20260101T0100Z"
    # The stream: b1 (in the run's read) and b-late (applied, its batch not yet committed when the run read).
    for batch_id in (0, 1):  # b1, then b-late
        totals.apply_batch(
            "billing",
            batch_id,
            [TotalsRow(p0, T0, "adv-1", "cmp-b", "ad-b", 1, 2_000_000)],
            budget_days=[BudgetDayCount(p0, "cmp-b", day, T0, 1, 2_000_000)],
        )
    assert totals.budget_day(day, "cmp-b")["charged_micros"] == 4_000_000
    # The run closes 00:00 with b1 alone in its export.
    exported = {("adv", "adv-1"): (1, 2_000_000, "adv-1"), ("cmp", "cmp-b"): (1, 2_000_000, "adv-1")}
    totals.close_period(p0, T0, {**exported, ("ad", "ad-b"): (1, 2_000_000, "adv-1")})
    assert totals.budget_day(day, "cmp-b")["charged_micros"] == 2_000_000, "the period's share is its export's"
    # The next run books b-late as an adjustment of 00:00 in the open 01:00.
    late = Correction(
        "fix-b-late", "addition", "c-b-late", "i-b-late", "ad-b", "cmp-b", "adv-1", 2_000_000, "EUR",
        "billed_after_close", p0, p1, T0 + 2 * 3_600_000,
    )  # fmt: skip
    totals.apply_corrections([late], {p1: T0 + 3_600_000})
    assert totals.budget_day(day, "cmp-b")["charged_micros"] == 4_000_000, "b1 and b-late, each once"
    assert totals.budget_day(day, "cmp-b")["charged_clicks"] == 2
    # Closing again (a run repeated) changes nothing.
    totals.close_period(p0, T0, {**exported, ("ad", "ad-b"): (1, 2_000_000, "adv-1")})
    assert totals.budget_day(day, "cmp-b")["charged_micros"] == 4_000_000
