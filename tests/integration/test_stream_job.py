"""The streaming job on real Kafka, Redis and Spark: the rule's cases, simulated traffic against its ground truth,
and restarts after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from confluent_kafka import Consumer
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from attribution.job import start
from attribution.progress import HealthListener
from attribution.restore import restore_redis
from attribution.stream_position import committed_offsets, end_offsets
from billing.catalog import Ad, Catalog
from billing.events import Click, Event, Impression
from billing.parquet_ledger import read_ledger
from billing.periods import Periods
from billing.redis_totals import RedisTotals
from billing.schema_registry import open_registry
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.publisher import EventPublisher, simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator
from producers.wire import EventSerializer
from tests import oracle
from tests.integration.test_reconcile import read_back

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
S = 1_000

CATALOG = Catalog(
    [
        Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"),
        Ad("ad-2", "cmp-2", "adv-2", 1_500_000, "EUR"),
        Ad("ad-3", "cmp-2", "adv-2", 70_000, "EUR"),
    ]
)


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 120.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def ledger_rows(settings: Settings) -> list[dict]:
    return read_ledger(settings.root / "ledger").to_pylist()


def redis_ad_totals(settings: Settings) -> dict[str, tuple[int, int]]:
    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    out: dict[str, tuple[int, int]] = {}
    for (_, ad), t in totals.all_ad_totals().items():
        clicks, micros = out.get(ad, (0, 0))
        out[ad] = (clicks + t.clicks, micros + t.micros)
    return out


def ledger_ad_totals(rows: list[dict]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        out[row["ad_id"]][0] += 1
        out[row["ad_id"]][1] += row["amount_micros"]
    return {ad: (c, m) for ad, (c, m) in out.items()}


@pytest.fixture
def job(spark: SparkSession, settings: Settings) -> Iterator[Callable[[], list[StreamingQuery]]]:
    """Starts the job's queries in the test's Spark session (with its health listener); stops them after."""
    started: list[StreamingQuery] = []
    listener = HealthListener(settings.redis_url, settings.redis_prefix, {"impressions": 30_000, "clicks": 30_000})
    spark.streams.addListener(listener)

    def run() -> list[StreamingQuery]:
        ensure_schemas(settings)
        started.extend(start(spark, stream_config(settings), Catalog.load(settings.catalog_file)))
        return started

    yield run
    for query in started:
        query.stop()
    spark.streams.removeListener(listener)


def publisher(settings: Settings) -> EventPublisher:
    return EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )


def send(settings: Settings, items: list[Event | tuple[str, bytes]]) -> None:
    out = publisher(settings)
    for item in items:
        if isinstance(item, tuple):
            out.publish_raw(item[0], b"ad-1", item[1])
        else:
            out.publish_event(item)
    assert out.flush(30) == 0
    assert out.summary().delivery_failures == 0


def process(queries: list[StreamingQuery]) -> None:
    for query in queries:
        query.processAllAvailable()
        assert query.isActive, query.exception()


def test_the_rule_cases_through_kafka_and_the_job(settings: Settings, job) -> None:
    CATALOG.save(settings.catalog_file)
    clicks = settings.topic_clicks
    # Every case has its own user; all times lie within 30 s (the watermark delay), so nothing here is late.
    first_phase: list[Event | tuple[str, bytes]] = [
        # Exactly 10 s after the impression: billed (the window's upper bound is inclusive).
        Impression("i-edge", "ad-1", "u-edge", T0),
        Click("c-edge", "ad-1", "u-edge", T0 + 10 * S),
        # 10 s + 1 ms after: not billed.
        Impression("i-past", "ad-1", "u-past", T0),
        Click("c-past", "ad-1", "u-past", T0 + 10 * S + 1),
        # A click 1 ms before its impression: not billed.
        Impression("i-before", "ad-1", "u-before", T0 + 5 * S),
        Click("c-before", "ad-1", "u-before", T0 + 5 * S - 1),
        # Two qualifying impressions: the click is billed once.
        Impression("i-two-a", "ad-2", "u-two", T0),
        Impression("i-two-b", "ad-2", "u-two", T0 + 3 * S),
        Click("c-two", "ad-2", "u-two", T0 + 5 * S),
        # The same user on another ad: not billed.
        Impression("i-other", "ad-1", "u-other", T0),
        Click("c-other", "ad-2", "u-other", T0 + S),
        # A duplicate click (same id, same content): billed once.
        Impression("i-dupc", "ad-3", "u-dupc", T0),
        Click("c-dupc", "ad-3", "u-dupc", T0 + S),
        Click("c-dupc", "ad-3", "u-dupc", T0 + S),
        # A duplicate impression: its click is billed once.
        Impression("i-dupi", "ad-3", "u-dupi", T0),
        Impression("i-dupi", "ad-3", "u-dupi", T0),
        Click("c-dupi", "ad-3", "u-dupi", T0 + 2 * S),
        # An id conflict: the first copy is billed; the later one (next phase) changes nothing.
        Impression("i-conf", "ad-1", "u-conf", T0),
        Click("c-conf", "ad-1", "u-conf", T0 + 2 * S),
        # A click on an ad the catalog does not know: quarantined, not billed.
        Impression("i-unknown", "ad-zzz", "u-unknown", T0),
        Click("c-unknown", "ad-zzz", "u-unknown", T0 + S),
        # Bytes that are not framed Avro: quarantined; the query keeps running.
        (clicks, b"definitely not avro"),
    ]
    second_phase: list[Event | tuple[str, bytes]] = [
        Click("c-conf", "ad-1", "u-conf-other", T0 + 3 * S),  # the conflicting later copy
        Click("c-dupc", "ad-3", "u-dupc", T0 + S),  # one more resend, in a later batch
        # After the bad bytes the job still bills.
        Impression("i-after", "ad-2", "u-after", T0 + 10 * S),
        Click("c-after", "ad-2", "u-after", T0 + 12 * S),
    ]
    send(settings, first_phase)
    queries = job()
    process(queries)
    send(settings, second_phase)
    process(queries)

    rows = ledger_rows(settings)
    billed = Counter(row["click_id"] for row in rows)
    assert billed == Counter(["c-edge", "c-two", "c-dupc", "c-dupi", "c-conf", "c-after"]), billed
    by_click = {row["click_id"]: row for row in rows}
    assert by_click["c-two"]["impression_id"] in {"i-two-a", "i-two-b"}  # the stream may bill the first match
    assert by_click["c-conf"]["user_id"] == "u-conf", "the first copy stands"
    assert by_click["c-edge"]["amount_micros"] == 250_000
    assert by_click["c-two"]["amount_micros"] == 1_500_000
    assert {row["period"] for row in rows} == {"20260101T0000Z"}

    # Redis holds the same totals as the ledger, per ad and per advertiser.
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)
    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    assert totals.advertiser("20260101T0000Z", "adv-2").micros == 1_500_000 * 2 + 70_000 * 2

    # Bad input: in the quarantine table with its raw bytes and coordinates, counted in Redis, on the topic.
    quarantine = ds.dataset(settings.root / "quarantine", format="parquet", partitioning="hive").to_table()
    reasons = Counter(quarantine.column("reason").to_pylist())
    assert reasons == Counter({"unknown_ad": 2, "undecodable": 1})
    bad = [r for r in quarantine.to_pylist() if r["reason"] == "undecodable"][0]
    assert (bad["value"], bad["topic"]) == (b"definitely not avro", clicks)
    assert totals.quarantined() == {
        "unknown_ad": {settings.topic_impressions: 1, clicks: 1},
        "undecodable": {clicks: 1},
    }
    dead_letters = consume(settings.kafka_bootstrap, settings.topic_quarantine, 3)
    assert sorted(dict(m.headers())["reason"] for m in dead_letters) == [b"undecodable", b"unknown_ad", b"unknown_ad"]

    # The health listener recorded the billing query's batches.
    health = totals.client.hgetall(f"{settings.redis_prefix}:health:query:billing")
    assert int(health["batch_id"]) >= 1
    assert json.loads(health["stream_watermarks_ms"])["clicks"] == T0 + 12 * S - 30_000


def test_late_events_are_archived_flagged_and_counted_as_the_join_drops_them(settings: Settings, job) -> None:
    CATALOG.save(settings.catalog_file)
    # Both streams reach T0 + 100 s; with 30 s delays the watermark becomes T0 + 70 s.
    send(
        settings,
        [Impression("i-front", "ad-1", "u-front", T0 + 100 * S), Click("c-front", "ad-1", "u-x", T0 + 100 * S)],
    )
    queries = job()
    process(queries)
    send(
        settings,
        [
            # Events at or below the watermark (T0 + 70 s) are late: kept out of the join, so never billed by
            # the stream (reconciliation books this click as a late click).
            Impression("i-late", "ad-1", "u-late", T0 + 65 * S),
            Click("c-late", "ad-1", "u-late", T0 + 70 * S),
            # A late impression with a click above the watermark: the click finds nothing to join.
            Impression("i-late-2", "ad-2", "u-late-2", T0 + 69 * S),
            Click("c-orphan", "ad-2", "u-late-2", T0 + 75 * S),
            # 1 ms above the watermark: joined and billed.
            Impression("i-edge", "ad-3", "u-edge", T0 + 70 * S + 1),
            Click("c-edge", "ad-3", "u-edge", T0 + 75 * S),
        ],
    )
    process(queries)

    assert {row["click_id"] for row in ledger_rows(settings)} == {"c-edge"}
    archive = ds.dataset(settings.root / "archive", format="parquet", partitioning="hive").to_table().to_pylist()
    late = {row["event_id"] for row in archive if row["late"]}
    assert late == {"c-late", "i-late", "i-late-2"}
    assert len(archive) == 8, "every valid event is archived, late or not"
    # Our flag agrees with the engine's own count of the rows its watermark dropped.
    dropped = sum(op["numRowsDroppedByWatermark"] for p in queries[0].recentProgress for op in p["stateOperators"])
    assert dropped == 3
    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    assert totals.late("20260101T0000Z", "ad", "ad-1") == {"click": 1, "impression": 1}
    assert totals.late("20260101T0000Z", "ad", "ad-2") == {"impression": 1}
    assert totals.late("20260101T0000Z", "adv", "adv-2") == {"impression": 1}


def consume(bootstrap: str, topic: str, expected: int, deadline_s: float = 30.0) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    messages: list = []
    deadline = time.monotonic() + deadline_s
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            messages += [m for m in consumer.consume(100, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    return messages


def ground_truth(run_dir: Path) -> dict[str, int]:
    with (run_dir / "billable.jsonl").open() as lines:
        return {row["click_id"]: row["amount_micros"] for row in map(json.loads, lines)}


def simulated_run(settings: Settings, run_dir: Path, events: int, rate: float | None = None) -> dict[str, int]:
    """Simulated traffic without late events, through Kafka; returns what the DuckDB oracle bills for the records
    read back from Kafka (click id -> micros), which the simulator's own ground truth must agree with."""
    config = SimulationConfig(events=events, seed=11, users=300, late_fraction=0.0, bad_fraction=0.005)
    config.catalog().save(settings.catalog_file)
    summary = simulate_to_kafka(
        config, settings.kafka_bootstrap, settings.registry_location, run_dir, settings.topics, rate, progress=False
    )
    assert summary.delivery_failures == 0
    raw = sum(1 for a in Simulator(config).arrivals() if a.raw is not None)
    received = read_back(settings, summary.delivered, undecodable=raw)
    expected = {row["click_id"]: row["amount_micros"] for row in oracle.billable(received, config.catalog())}
    assert ground_truth(run_dir) == expected, "the simulator's ground truth disagrees with the oracle"
    return expected


def read_to_the_end(settings: Settings) -> bool:
    """The billing query has committed batches up to the end of both topics: nothing is in flight."""
    committed = committed_offsets(settings.root / "checkpoints" / "billing") or {}
    end = end_offsets(settings.kafka_bootstrap, [settings.topic_impressions, settings.topic_clicks])
    return all(committed.get(t, {}).get(p, 0) >= o for t, parts in end.items() for p, o in parts.items())


def test_simulated_traffic_bills_exactly_the_ground_truth(settings: Settings, job, tmp_path: Path) -> None:
    truth = simulated_run(settings, tmp_path / "run", events=20_000)
    assert len(truth) > 500
    queries = job()
    process(queries)

    rows = ledger_rows(settings)
    assert len(rows) == len({row["click_id"] for row in rows}), "one bill per click"
    assert {row["click_id"]: row["amount_micros"] for row in rows} == truth
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)

    # Redis can be restored from the data folder alone: wipe it, restore, and the totals are the same again.
    for query in queries:
        query.stop()
    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    totals.wipe_billing()
    assert redis_ad_totals(settings) == {}
    catalog = Catalog.load(settings.catalog_file)
    # The job was stopped here, a moment ago: no need to wait for its heartbeat to age.
    restored = restore_redis(settings.root, totals, catalog, Periods(), "billing", quiet_ms=0, wait_for_heartbeat_s=0)
    assert (restored.billed_clicks, restored.billed_micros) == (len(truth), sum(truth.values()))
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)


def test_sigkill_and_restart_lose_nothing_and_bill_nothing_twice(settings: Settings, tmp_path: Path) -> None:
    settings.catalog_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}, **settings.to_env()}
    env.update(ADBILL_METRICS_PORT="0", ADBILL_MAX_OFFSETS_PER_TRIGGER="4000", ADBILL_TRIGGER_MS="500")
    log = (tmp_path / "job.log").open("ab")

    def start_job() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ops.cli", "stream"], env=env, stdout=log, stderr=log)

    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    # Traffic first, so the job always has work in hand when it is killed.
    truth = simulated_run(settings, tmp_path / "run", events=60_000)
    killed_after: list[int] = []
    for _ in range(3):
        process_ = start_job()
        # Kill it at a different point each time: once a new batch has been applied to Redis.
        after = killed_after[-1] if killed_after else -1
        wait_for(lambda after=after: (totals.last_applied("billing") or -1) > after, "a new billing batch", 180)
        killed_after.append(totals.last_applied("billing") or -1)
        process_.send_signal(signal.SIGKILL)
        assert process_.wait(timeout=30) == -signal.SIGKILL, "the job was running when it was killed"
    assert killed_after == sorted(set(killed_after)), "each kill came after a newer batch"
    assert not read_to_the_end(settings), "the kills left work for the restart, or the test proves nothing"
    final = start_job()
    try:
        # Committed up to the end of the topics: no batch is in flight, so a duplicate would be in the ledger now.
        wait_for(lambda: read_to_the_end(settings), "the job to commit up to the end of the topics", 240)
        rows = ledger_rows(settings)
    finally:
        final.send_signal(signal.SIGTERM)
        final.wait(timeout=60)
    assert len(rows) == len({row["click_id"] for row in rows}), "one bill per click across restarts"
    assert {row["click_id"]: row["amount_micros"] for row in rows} == truth
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)
