"""A producer whose clock runs ahead must not stall live billing.

Steady simulated traffic is sent live while the job runs (`LiveSchedule`), so its event times follow the wall clock
as live traffic's do; halfway through, events whose time is 50 minutes ahead of the time Kafka receives them are sent
too (valid: intake quarantines only what is more than an hour ahead). The same traffic (same seed) without them
is the baseline, run once for the module. Each run is held to: the stream bills at least 99 % of what it bills
in the baseline, and makes nothing late; the skewed events are counted as clock ahead; after reconciliation the
ledger plus corrections equal the rule applied to everything sent, skewed clicks included, each billed once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from prometheus_client import REGISTRY
from pyspark.sql import SparkSession

from attribution.job import start
from attribution.progress import HealthListener
from attribution.restore import restore_redis
from billing.events import Click, Event, Impression
from billing.periods import Periods
from billing.store.corrections_arrow import corrections_from_arrow
from billing.store.parquet_ledger import read_ledger
from billing.store.schema_registry import open_registry
from ops.kafka_service import LocalKafka
from ops.postgres_service import LocalPostgres
from ops.reconcile import reconcile, reconcile_config
from ops.redis_service import LocalRedis
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.arrivals import Arrival, ArrivalKind
from producers.ground_truth import GroundTruth
from producers.publisher import EventPublisher
from producers.simulator import LiveSchedule, SimulationConfig, Simulator, system_clock_ms
from producers.wire import EventSerializer
from tests.conftest import fresh_topics, new_database, own_settings
from tests.redis_figures import RedisFigures
from web.advertiser_figures import AdvertiserFigures
from web.job_health import JobHealth
from web.model import EventCounts
from web.readers import CatalogView, PeriodReader

pytestmark = pytest.mark.integration

S = 1_000
SKEW_MS = 50 * 60 * S
"""How far ahead of the time Kafka receives them the skewed events' clocks are."""

STEADY = SimulationConfig(events=6_400, seed=16, users=300, late_fraction=0.0, bad_fraction=0.0).at_arrival_rate(400)
"""400 events/s for 16 s, nothing late or bad: whatever the stream misses, a skewed clock made it miss."""

HALFWAY = STEADY.events // 2 if STEADY.events else 0

WATERMARK_DELAY_MS = 5_000
"""Both streams' delay: short, so that the traffic spans several (the join evicts state within a run, and a
watermark run ahead would show at once); still above the simulator's disorder, so nothing steady is late."""

Injection = Callable[[int], list[Event]]
"""Events to send at one point of the traffic, made from the time they are sent (epoch ms)."""


@dataclass
class LiveRun:
    settings: Settings
    truth: dict[str, int]
    """The rule applied to everything sent, skewed events included: click id -> micros."""
    skewed: list[Event]
    ledger: list[dict[str, Any]]
    progress: list[dict[str, Any]]
    metrics: Counter[str]
    """What the job's `/metrics` counted as clock ahead during the run, per stream."""

    @property
    def skewed_clicks(self) -> set[str]:
        return {e.event_id for e in self.skewed if isinstance(e, Click)}

    @property
    def steady_billed(self) -> set[str]:
        """The stream's bills of the steady traffic's clicks."""
        return {row["click_id"] for row in self.ledger} - self.skewed_clicks


def publisher(settings: Settings) -> EventPublisher:
    return EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )


def send_live(settings: Settings, run_dir: Path, inject: Mapping[int, Injection]) -> tuple[dict[str, int], list]:
    """The steady traffic live (event times follow the clock), with `inject[n]`'s events sent before arrival n;
    (truth, injected)."""
    simulator = Simulator(STEADY, system_clock_ms, live=True)
    truth = GroundTruth(simulator.catalog, workdir=run_dir / "truth")
    out = publisher(settings)
    injected: list[Event] = []
    for arrival in LiveSchedule().run(simulator.arrivals()):
        if arrival.position in inject:
            now = system_clock_ms()
            for event in inject[arrival.position](now):
                out.publish_event(event)
                truth.observe(Arrival(-1, now, event, ArrivalKind.EVENT))
                injected.append(event)
        out.publish(arrival)
        truth.observe(arrival)
    assert out.flush(30) == 0
    assert out.summary().delivery_failures == 0
    result = truth.finish(run_dir / "billable.jsonl")
    return {row["click_id"]: row["amount_micros"] for row in result.billable()}, injected


def live_run(spark: SparkSession, settings: Settings, run_dir: Path, inject: Mapping[int, Injection]) -> LiveRun:
    """The job started first, then the traffic sent while it runs, then everything processed."""
    settings = dataclasses.replace(
        settings, impression_watermark_ms=WATERMARK_DELAY_MS, click_watermark_ms=WATERMARK_DELAY_MS
    )
    settings.catalog_store().start(STEADY.catalog())
    ensure_schemas(settings)
    listener = HealthListener(
        settings.redis_url,
        settings.redis_prefix,
        {"impressions": settings.impression_watermark_ms, "clicks": settings.click_watermark_ms},
    )
    spark.streams.addListener(listener)
    counted_before = clock_ahead_metric()
    queries = start(spark, stream_config(settings))
    try:
        truth, skewed = send_live(settings, run_dir, inject)
        for query in queries:
            query.processAllAvailable()
            assert query.isActive, query.exception()
        progress = list(queries[0].recentProgress)
        # The listener hears of each batch a little after it ends.
        last = progress[-1]["batchId"]
        wait_for(
            lambda: (health_history(settings) or [{"batch_id": -1}])[0]["batch_id"] == last, "the last health record"
        )
    finally:
        for query in queries:
            query.stop()
        spark.streams.removeListener(listener)
    ledger = read_ledger(settings.root / "ledger").to_pylist()
    return LiveRun(settings, truth, skewed, ledger, progress, clock_ahead_metric() - counted_before)


def clock_ahead_metric() -> Counter[str]:
    """The job's Prometheus counter of clock-ahead events, per stream (the process's registry)."""
    counted: Counter[str] = Counter()
    for stream in ("impressions", "clicks"):
        labels = {"query": "billing", "stream": stream}
        counted[stream] = int(REGISTRY.get_sample_value("adbill_clock_ahead_events_total", labels) or 0)
    return counted


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def baseline(
    spark: SparkSession,
    kafka: LocalKafka,
    redis_server: LocalRedis,
    postgres_server: LocalPostgres,
    tmp_path_factory: pytest.TempPathFactory,
) -> LiveRun:
    """The steady traffic alone."""
    folder = tmp_path_factory.mktemp("steady")
    settings = own_settings(folder, kafka, fresh_topics(kafka), redis_server, new_database(postgres_server))
    run = live_run(spark, settings, folder / "run", {})
    assert run.steady_billed == set(run.truth), "without a skewed clock the stream bills every billable click"
    return run


def skewed_pair(user: str, ad_id: str, tag: str) -> Injection:
    """An impression and, 2 s later by its clock, a click: both `SKEW_MS` ahead of their receipt."""
    return lambda now: [
        Impression(f"skewed-i-{tag}", ad_id, user, now + SKEW_MS),
        Click(f"skewed-c-{tag}", ad_id, user, now + SKEW_MS + 2 * S),
    ]


def test_one_skewed_impression_and_click_do_not_stall_the_stream(
    spark: SparkSession, settings: Settings, baseline: LiveRun, tmp_path: Path
) -> None:
    ad = next(iter(STEADY.catalog()))
    run = live_run(spark, settings, tmp_path / "run", {HALFWAY: skewed_pair("skewed-user", ad.ad_id, "1")})
    assert run.skewed_clicks <= set(run.truth), "the skewed click is billable by the rule"
    holds_up(run, baseline)
    assert clock_ahead(run) == {(ad.ad_id, "impression"): 1, (ad.ad_id, "click"): 1}
    # Shown to people: on the advertiser's dashboard for the period of the events' own time, and on the health page
    # by period and ad.
    catalog = CatalogView(settings.catalog_store())
    periods = PeriodReader(
        RedisFigures.from_url(settings.redis_url, settings.redis_prefix).client, settings.redis_prefix, catalog
    )
    period = Periods(settings.period_ms).key_of(run.skewed[0].event_time)
    dashboard = AdvertiserFigures(periods, catalog).dashboard(ad.advertiser_id, period)
    assert dashboard is not None and dashboard.clock_ahead == EventCounts(impressions=1, clicks=1)
    health = JobHealth(periods, catalog).health()
    assert [(c.period.key, c.advertiser_id, c.ad_id, c.counts) for c in health.clock_ahead] == [
        (period, ad.advertiser_id, ad.ad_id, EventCounts(impressions=1, clicks=1))
    ]
    # The join still evicts its state as the watermark moves.
    join = [op for p in run.progress for op in p["stateOperators"] if op["operatorName"] == "symmetricHashJoin"]
    assert sum(op["numRowsRemoved"] for op in join) > 0
    reconciled_exactly(spark, run)
    # Redis lost and restored from the data folder: the counts come back from the archive.
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    totals.wipe_billing()
    restore_redis(
        settings.root,
        totals,
        STEADY.catalog(),
        Periods(settings.period_ms),
        "billing",
    )
    assert clock_ahead(run) == {(ad.ad_id, "impression"): 1, (ad.ad_id, "click"): 1}


def test_skewed_clicks_on_one_stream_only(
    spark: SparkSession, settings: Settings, baseline: LiveRun, tmp_path: Path
) -> None:
    ad = next(iter(STEADY.catalog()))
    user = "skewed-clicks-user"
    run = live_run(
        spark,
        settings,
        tmp_path / "run",
        {
            HALFWAY: lambda now: [
                Click("skewed-c-1", ad.ad_id, user, now + SKEW_MS),
                Click("skewed-c-2", ad.ad_id, user, now + SKEW_MS + S),
            ]
        },
    )
    assert not run.skewed_clicks & set(run.truth), "no impression qualifies them"
    holds_up(run, baseline)
    assert clock_ahead(run) == {(ad.ad_id, "click"): 2}
    reconciled_exactly(spark, run)


def test_many_skewed_events_from_one_user(
    spark: SparkSession, settings: Settings, baseline: LiveRun, tmp_path: Path
) -> None:
    # One phone with a wrong clock keeps using the app: ten impressions and ten clicks over about six seconds, on
    # ten ads (ten clicks on one ad within seconds would be double clicks, not charged: billing.invalid).
    ads = [ad.ad_id for ad in STEADY.catalog()][:10]
    pairs = {HALFWAY + 250 * k: skewed_pair("skewed-phone", ads[k], str(k)) for k in range(10)}
    run = live_run(spark, settings, tmp_path / "run", pairs)
    assert run.skewed_clicks <= set(run.truth)
    holds_up(run, baseline)
    assert clock_ahead(run) == {(ad, kind): 1 for ad in ads for kind in ("impression", "click")}
    reconciled_exactly(spark, run)


def holds_up(run: LiveRun, baseline: LiveRun) -> None:
    """The stream bills what it bills without the skewed events, nothing is late, and no watermark ran ahead."""
    assert set(run.truth) - run.skewed_clicks == set(baseline.truth), "the same steady traffic (same seed)"
    billed = Counter(row["click_id"] for row in run.ledger)
    assert set(billed.values()) == {1}, "one bill per click"
    billable, share, base = len(baseline.truth), len(run.steady_billed), len(baseline.steady_billed)
    skewed = run.skewed_clicks & set(run.truth)
    print(
        f"\nthe stream billed {share} of {billable} billable clicks of the steady traffic ({share / billable:.1%}) "
        f"with {len(run.skewed)} skewed events, {base} ({base / billable:.1%}) without them; "
        f"{len(skewed & set(billed))} of the {len(skewed)} billable skewed clicks"
    )
    assert share >= 0.99 * base
    archive = ds.dataset(run.settings.root / "archive", format="parquet", partitioning="hive").to_table()
    assert not any(archive.column("late").to_pylist()), "a skewed clock made other events late"
    assert sum(op["numRowsDroppedByWatermark"] for p in run.progress for op in p["stateOperators"]) == 0
    # The watermarks on the health page follow Kafka's clock: never ahead of the last receipt time.
    last_received = max(archive.column("received_ms").to_pylist())
    history = health_history(run.settings)
    for record in history:
        assert all(wm is None or wm <= last_received for wm in record["stream_watermarks_ms"].values()), record
    ahead: Counter[str] = Counter()
    for record in history:
        ahead.update(record["clock_ahead_events"])
    assert ahead == Counter(f"{e.type}s" for e in run.skewed), "the clock-ahead events in the health records"
    assert run.metrics == ahead, "the clock-ahead events in /metrics"


def clock_ahead(run: LiveRun) -> dict[tuple[str, str], int]:
    """Clock-ahead counts in Redis per (ad, event type), over the periods of the skewed events."""
    totals = RedisFigures.from_url(run.settings.redis_url, run.settings.redis_prefix)
    periods = Periods(run.settings.period_ms)
    counted: Counter[tuple[str, str]] = Counter()
    for period in {periods.key_of(e.event_time) for e in run.skewed}:
        for ad_id in {e.ad_id for e in run.skewed}:
            for event_type, n in totals.clock_ahead(period, "ad", ad_id).items():
                counted[(ad_id, event_type)] += n
    return dict(counted)


def health_history(settings: Settings) -> list[dict[str, Any]]:
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    return [json.loads(line) for line in totals.client.lrange(totals.keys.health_history("billing"), 0, -1)]


def reconciled_exactly(spark: SparkSession, run: LiveRun) -> None:
    """After reconciliation of every period the run touched, ledger + corrections = the rule, click by click."""
    periods = Periods(run.settings.period_ms)
    last = max(max(e.event_time for e in run.skewed), max(row["click_time"] for row in run.ledger))
    until = periods.end_of(last)
    # The job read everything and was stopped: a forced run closes the periods without asking where it stands.
    reconcile(spark, reconcile_config(run.settings), STEADY.catalog(), until_ms=until, force=True)
    nets: Counter[str] = Counter()
    micros: Counter[str] = Counter()
    for row in run.ledger:
        nets[row["click_id"]] += 1
        micros[row["click_id"]] += row["amount_micros"]
    for c in corrections(run.settings):
        nets[c.click_id] += c.clicks
        micros[c.click_id] += c.amount_micros
    assert set(nets.values()) <= {0, 1}, "every click nets to one bill or none"
    final = {click: micros[click] for click, n in nets.items() if n == 1}
    assert final == run.truth
    for click in run.skewed_clicks & set(run.truth):
        assert nets[click] == 1, f"{click} is billed exactly once"


def corrections(settings: Settings) -> Iterator[Any]:
    folder = settings.root / "corrections"
    if folder.exists() and any(folder.rglob("*.parquet")):
        yield from corrections_from_arrow(ds.dataset(folder, format="parquet", partitioning="hive").to_table())
