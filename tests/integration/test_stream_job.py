"""The streaming job on real Kafka, Redis and Spark: the rule's cases, simulated traffic against its ground truth,
and restarts after SIGKILL."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY, CollectorRegistry
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from attribution.job import checkpoint_conf, checkpoint_join_state_format, start
from attribution.progress import BillingCollector, HealthListener
from attribution.restore import restore_redis
from attribution.session import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER, join_state_conf
from attribution.stream_position import committed_offsets, end_offsets
from billing.catalog import Ad, AdChange, Catalog
from billing.events import Click, Event, Impression
from billing.periods import Periods
from billing.store.dead_letters import DeadLetters
from billing.store.parquet_ledger import read_ledger
from billing.store.schema_registry import open_registry
from ops.kafka_service import ensure_topics
from ops.process import free_port
from ops.redis_service import LocalRedis
from ops.settings import Settings
from ops.spark import join_state_format as join_state_format_of
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.publisher import EventPublisher, simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator
from producers.wire import EventSerializer
from tests import oracle
from tests.conftest import child_env
from tests.integration.test_reconcile import read_back
from tests.redis_figures import RedisFigures

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


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 120.0, every_s: float = 0.5) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


def ledger_rows(settings: Settings) -> list[dict]:
    return read_ledger(settings.root / "ledger").to_pylist()


def redis_ad_totals(settings: Settings) -> dict[str, tuple[int, int]]:
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
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
    delays = {"impressions": settings.impression_watermark_ms, "clicks": settings.click_watermark_ms}
    listener = HealthListener(settings.redis_url, settings.redis_prefix, delays)
    spark.streams.addListener(listener)

    def run() -> list[StreamingQuery]:
        ensure_schemas(settings)
        started.extend(start(spark, stream_config(settings)))
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


def quiet(query: StreamingQuery, for_s: float = 3.0, deadline_s: float = 60.0) -> None:
    """Wait until the query has run no batch for `for_s` seconds: processAllAvailable returns once the data is read,
    and the batch without data that moves the watermark on may still follow it."""
    deadline = time.monotonic() + deadline_s
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = (query.lastProgress or {}).get("batchId"), query.status["isTriggerActive"]
        if now != seen:
            seen, since = now, time.monotonic()
        elif not now[1] and time.monotonic() - since >= for_s:
            return
        time.sleep(0.2)
    raise AssertionError(f"the query ran batches for {deadline_s} s after its data was read")


class Feed:
    """Events sent to Kafka and read by the running queries, one call a step; `sent` counts them (what the oracle
    reads back), and `check` runs after each step (an invariant that holds at every batch)."""

    def __init__(
        self, settings: Settings, queries: list[StreamingQuery], check: Callable[[], None] = lambda: None
    ) -> None:
        self.settings, self.queries, self.check, self.sent = settings, queries, check, 0

    def __call__(self, events: list[Event]) -> None:
        send(self.settings, events)  # type: ignore[arg-type]
        self.sent += len(events)
        process(self.queries)
        self.check()


def test_the_rule_cases_through_kafka_and_the_job(settings: Settings, job) -> None:
    settings.catalog_store().start(CATALOG)
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
        # A click on an ad the catalog does not know: kept and counted as unbilled (`unknown_ad`), not quarantined.
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
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert totals.advertiser("20260101T0000Z", "adv-2").micros == 1_500_000 * 2 + 70_000 * 2

    # Bad input: in the quarantine table with its raw bytes and coordinates, counted in Redis, on the topic.
    quarantine = ds.dataset(settings.root / "quarantine", format="parquet", partitioning="hive").to_table()
    reasons = Counter(quarantine.column("reason").to_pylist())
    assert reasons == Counter({"undecodable": 1})
    bad = [r for r in quarantine.to_pylist() if r["reason"] == "undecodable"][0]
    assert (bad["value"], bad["topic"]) == (b"definitely not avro", clicks)
    assert totals.quarantined() == {"undecodable": {clicks: 1}}
    dead_letters = consume(settings.kafka_bootstrap, settings.topic_quarantine, 1)
    assert sorted(dict(m.headers())["reason"] for m in dead_letters) == [b"undecodable"]
    # The click on the unknown ad: archived for reconciliation, and counted where people see it.
    archived = ds.dataset(settings.root / "archive", format="parquet", partitioning="hive").to_table()
    assert {"i-unknown", "c-unknown"} <= set(archived.column("event_id").to_pylist())
    assert totals.client.hgetall(totals.keys.unbilled("20260101T0000Z", "ad", "ad-zzz")) == {"unknown_ad": "1"}

    # The health listener recorded the billing query's batches. It hears of a batch on Spark's listener bus, after
    # processAllAvailable() has returned: wait for the record of the last batch, this query's own (the test session's
    # Spark also reports other tests' queries of the same name).
    # The last batch that read data: an idle trigger's progress names the batch still to come, which the listener
    # hears of as idle, not as a batch.
    billing = next(query for query in queries if query.name == "billing")
    last_batch = max(int(p["batchId"]) for p in billing.recentProgress if p["numInputRows"] > 0)

    def last_record() -> dict | None:
        history = totals.client.lrange(totals.keys.health_history("billing"), 0, -1)
        own = [r for r in map(json.loads, history) if r["run_id"] == str(billing.runId)]
        return max(own, key=lambda r: r["batch_id"]) if own else None

    wait_for(lambda: (last_record() or {}).get("batch_id", -1) >= last_batch, "the last batch's health", 120)
    health = last_record()
    assert health is not None
    assert int(health["batch_id"]) >= 1
    assert health["stream_watermarks_ms"]["clicks"] == T0 + 12 * S - settings.click_watermark_ms

    # Prometheus: the records read per topic (this test's own topics), and the running counts of billing in Redis.
    def records_read(topic: str) -> float | None:
        return REGISTRY.get_sample_value("adbill_input_records_total", {"query": "billing", "topic": topic})

    deadline = time.monotonic() + 120
    while records_read(clicks) != 14 and time.monotonic() < deadline:  # progress events arrive after the batch
        time.sleep(0.2)
    assert (records_read(settings.topic_impressions), records_read(clicks)) == (12, 14)  # the raw bytes included
    scraped = CollectorRegistry()
    scraped.register(BillingCollector(settings.redis_url, settings.redis_prefix))
    assert scraped.get_sample_value("adbill_billed_clicks_total") == 6
    assert scraped.get_sample_value("adbill_quarantined_records_total", {"reason": "undecodable", "topic": clicks}) == 1
    assert scraped.get_sample_value("adbill_late_events_total", {"type": "click"}) == 0
    assert scraped.get_sample_value("adbill_unbilled_clicks_total", {"reason": "unknown_ad"}) == 1
    assert scraped.get_sample_value("adbill_unbilled_clicks_total", {"reason": "ad_paused"}) == 0


def test_late_events_are_archived_flagged_and_counted_as_the_join_drops_them(settings: Settings, job) -> None:
    settings.catalog_store().start(CATALOG)
    assert settings.impression_watermark_ms == settings.click_watermark_ms
    # Both streams reach T0 + 100 s; the watermark becomes that less the delays (the defaults), W.
    front = T0 + 100 * S
    watermark = front - settings.click_watermark_ms
    send(settings, [Impression("i-front", "ad-1", "u-front", front), Click("c-front", "ad-1", "u-x", front)])
    queries = job()
    process(queries)
    send(
        settings,
        [
            # Events at or below the watermark are late: kept out of the join, so never billed by the stream
            # (reconciliation books this click as a late click).
            Impression("i-late", "ad-1", "u-late", watermark - 5 * S),
            Click("c-late", "ad-1", "u-late", watermark),
            # A late impression with a click above the watermark: the click finds nothing to join.
            Impression("i-late-2", "ad-2", "u-late-2", watermark - 1 * S),
            Click("c-orphan", "ad-2", "u-late-2", watermark + 5 * S),
            # 1 ms above the watermark: joined and billed.
            Impression("i-edge", "ad-3", "u-edge", watermark + 1),
            Click("c-edge", "ad-3", "u-edge", watermark + 5 * S),
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
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert totals.late("20260101T0000Z", "ad", "ad-1") == {"click": 1, "impression": 1}
    assert totals.late("20260101T0000Z", "ad", "ad-2") == {"impression": 1}
    assert totals.late("20260101T0000Z", "adv", "adv-2") == {"impression": 1}


def test_a_checkpoint_of_30_s_delays_goes_on_with_the_10_s_defaults(spark: SparkSession, settings: Settings) -> None:
    """An existing deployment started with the earlier defaults (30 s watermark delays) restarts with today's: the
    checkpoint takes the new delays, nothing is lost and nothing billed twice."""
    settings.catalog_store().start(CATALOG)
    ensure_schemas(settings)
    earlier = dataclasses.replace(settings, impression_watermark_ms=30_000, click_watermark_ms=30_000)
    assert settings.click_watermark_ms == settings.impression_watermark_ms == 10_000

    def run(config: Settings, events: list[Event | tuple[str, bytes]]) -> str:
        """Sends `events` to the job with `config` until it has read them; the job's watermark then."""
        queries = start(spark, stream_config(config))
        try:
            send(config, events)
            process(queries)
            return str(queries[0].lastProgress["eventTime"]["watermark"])
        finally:
            for query in queries:
                query.stop()

    before = run(
        earlier,
        [
            Impression("i-a", "ad-1", "u-a", T0),
            Click("c-a", "ad-1", "u-a", T0 + 5 * S),
            Impression("i-front", "ad-2", "u-front", T0 + 100 * S),
            Click("c-front", "ad-2", "u-front", T0 + 100 * S),
        ],
    )
    after = run(
        settings,
        [
            Impression("i-b", "ad-3", "u-b", T0 + 95 * S),
            Click("c-b", "ad-3", "u-b", T0 + 98 * S),
            Click("c-a", "ad-1", "u-a", T0 + 5 * S),  # a copy, long past the watermark
        ],
    )

    # The watermark: 30 s behind the newest impression and click (T0 + 100 s), then 10 s behind those read since
    # the restart (the impression at T0 + 95 s; Spark keeps the watermark of a checkpoint, not each stream's).
    assert (before, after) == ("2026-01-01T00:01:10.000Z", "2026-01-01T00:01:25.000Z")
    billed = Counter(row["click_id"] for row in ledger_rows(settings))
    assert billed == {"c-a": 1, "c-front": 1, "c-b": 1}
    assert redis_ad_totals(settings) == {"ad-1": (1, 250_000), "ad-2": (1, 1_500_000), "ad-3": (1, 70_000)}


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


def simulated_run(
    settings: Settings, run_dir: Path, events: int, rate: float | None = None
) -> tuple[dict[str, int], set[str]]:
    """Simulated traffic without late events, through Kafka; returns what the DuckDB oracle bills for the records
    read back from Kafka (click id -> micros), which the simulator's own ground truth must agree with, and the click
    ids with a conflicting later copy. The stream cannot tell a conflict from a first copy (it keeps no content per
    id): when the first copy of such a click matched no impression and the later one does, the stream bills the later
    one, and reconciliation retracts it (`test_reconcile.py`). The stream is held to the truth on every other click."""
    config = SimulationConfig(events=events, seed=11, users=300, late_fraction=0.0, bad_fraction=0.005)
    settings.catalog_store().start(config.catalog())
    summary = simulate_to_kafka(
        config, settings.kafka_bootstrap, settings.registry_location, run_dir, settings.topics, rate, progress=False
    )
    assert summary.delivery_failures == 0
    raw = sum(1 for a in Simulator(config).arrivals() if a.raw is not None)
    received = read_back(settings, summary.delivered, undecodable=raw)
    expected = {row["click_id"]: row["amount_micros"] for row in oracle.billable(received, config.catalog())}
    assert ground_truth(run_dir) == expected, "the simulator's ground truth disagrees with the oracle"
    return expected, oracle.conflicting_ids(received, config.catalog())["click"]


def settled(bills: dict[str, int], conflicted: set[str]) -> dict[str, int]:
    """`bills` without the clicks that had a conflicting copy (`simulated_run`)."""
    return {click: micros for click, micros in bills.items() if click not in conflicted}


def read_to_the_end(settings: Settings) -> bool:
    """The billing query has committed batches up to the end of both topics: nothing is in flight."""
    committed = committed_offsets(settings.root / "checkpoints" / "billing") or {}
    end = end_offsets(settings.kafka_bootstrap, [settings.topic_impressions, settings.topic_clicks])
    return all(committed.get(t, {}).get(p, 0) >= o for t, parts in end.items() for p, o in parts.items())


@pytest.fixture
def join_state_format(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    """The test's session with the join state format of `ADBILL_JOIN_STATE_FORMAT=<param>` for a new checkpoint (the
    job's own sessions get it from the settings, `ops.spark`), in RocksDB, the one store format 4 runs on; the
    session's defaults again after."""
    value: str = request.param
    chosen = Settings.from_env({"ADBILL_JOIN_STATE_FORMAT": value, "ADBILL_STATE_STORE": "rocksdb"})
    conf = join_state_conf(join_state_format_of(chosen))
    if value == "4":
        conf[STATE_STORE_PROVIDER] = ROCKSDB_PROVIDER
    before = {key: spark.conf.get(key, None) for key in conf}
    for key, setting in conf.items():
        spark.conf.set(key, setting)
    yield value
    for key, setting in before.items():
        if setting is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, setting)


IN_MEMORY_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
"""Spark's in-memory state store (`ADBILL_STATE_STORE=hdfs`), as the offset log records it."""


def assert_join_state_format(settings: Settings, value: str) -> None:
    """The job's checkpoint runs the join state format asked for: Spark's default is 2."""
    recorded = checkpoint_join_state_format(settings.layout.checkpoint("billing"))
    assert recorded == (2 if value == "default" else int(value))


@pytest.mark.parametrize("join_state_format", ["default", "4"], indirect=True)
def test_simulated_traffic_bills_exactly_the_ground_truth(
    settings: Settings, job, tmp_path: Path, join_state_format: str
) -> None:
    truth, conflicted = simulated_run(settings, tmp_path / "run", events=20_000)
    assert len(truth) > 500
    queries = job()
    process(queries)
    assert_join_state_format(settings, join_state_format)

    rows = ledger_rows(settings)
    assert len(rows) == len({row["click_id"] for row in rows}), "one bill per click"
    assert settled({row["click_id"]: row["amount_micros"] for row in rows}, conflicted) == settled(truth, conflicted)
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)

    # Redis can be restored from the data folder alone: wipe it, restore, and the totals are the same again.
    for query in queries:
        query.stop()
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    totals.wipe_billing()
    assert redis_ad_totals(settings) == {}
    catalog = settings.catalog_store().current()
    # The job was stopped here, a moment ago: the restore waits for it to let go of its lock.
    restored = restore_redis(settings.root, totals, catalog, Periods(), "billing")
    by_currency: dict[str, int] = {}
    for r in rows:
        by_currency[r["currency"]] = by_currency.get(r["currency"], 0) + r["amount_micros"]
    assert (restored.billed_clicks, restored.billed_micros_by_currency) == (len(rows), by_currency)
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)


@pytest.mark.parametrize(
    ("writers", "join_state"),
    [
        ("driver", "default"),
        # Each task writing on its executor, as on a cluster: `test_cluster.py` kills that in the default run.
        pytest.param("executors", "default", marks=pytest.mark.slow),
        # Format 4 is a setting, not the default (docs/benchmarks.md: it did worse in make bench); its exactness in
        # the default run is `test_simulated_traffic_bills_exactly_the_ground_truth`.
        pytest.param("driver", "4", marks=pytest.mark.slow),
    ],
)
def test_sigkill_and_restart_lose_nothing_and_bill_nothing_twice(
    settings: Settings, tmp_path: Path, writers: str, join_state: str
) -> None:
    """Both ways of writing a batch (`ADBILL_SINK_WRITERS`): collected to the driver (local mode's), and each task
    its share on its executor (a cluster's), whose replayed tasks must replace their own files; and the join's
    state in format 4 (`ADBILL_JOIN_STATE_FORMAT`), restored after each kill. The first kill falls in the
    checkpoint's second batch, the others where they fall. The catalog changes while the job is down, between a
    batch's first attempt and its replay: the replay prices as the first attempt did, and every later batch by the
    new history. The traffic's double clicks are judged across each restart as without it."""
    settings.catalog_file.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(
        settings,
        ADBILL_METRICS_PORT="0",
        ADBILL_MAX_OFFSETS_PER_TRIGGER="4000",
        ADBILL_TRIGGER_MS="500",
        ADBILL_SINK_WRITERS=writers,
        ADBILL_JOIN_STATE_FORMAT=join_state,
        **({"ADBILL_STATE_STORE": "rocksdb"} if join_state == "4" else {}),
    )
    log = (tmp_path / "job.log").open("ab")

    def start_job() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ops.cli", "stream"], env=env, stdout=log, stderr=log)

    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    # Traffic first, so the job always has work in hand when it is killed: the kills fall in its first three or four
    # batches (17,000 of the 30,000 events on one machine), and the restart finds the rest (asserted below).
    truth, conflicted = simulated_run(settings, tmp_path / "run", events=30_000)
    store = settings.catalog_store()
    received = read_ledger_times(tmp_path / "run")
    killed_after: list[int] = []
    checkpoint = settings.layout.checkpoint("billing")
    for kill in range(3):
        process_ = start_job()
        if kill == 0:
            # The first kill in the checkpoint's second batch: it runs before Spark has set a watermark, and the
            # restarted driver must still judge double clicks by the first batch's clicks.
            wait_for(lambda: (checkpoint / "offsets" / "1").exists(), "the second batch", 180, every_s=0.05)
        else:
            # Then at a different point each time: once a new batch has been applied to Redis.
            after = killed_after[-1]
            wait_for(
                lambda after=after: (totals.last_applied("billing") or -1) > after,
                "a new billing batch",
                180,
                every_s=0.05,
            )
        killed_after.append(totals.last_applied("billing") or -1)
        process_.send_signal(signal.SIGKILL)
        assert process_.wait(timeout=30) == -signal.SIGKILL, "the job was running when it was killed"
        assert kill > 0 or not (checkpoint / "commits" / "1").exists(), "the first kill fell in the second batch"
        # A new price for every ad from the middle of the traffic on, made while the job is down (recorded
        # history: in the past of the clock): the batch in flight was priced, and is replayed, with the old one.
        for ad in sorted(store.current().ad_ids):
            store.change(AdChange(ad, received[len(received) // 2], 1_000 * (kill + 1)), lambda: 0, backfill=True)
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
    assert set(settled({row["click_id"]: 0 for row in rows}, conflicted)) == set(settled(truth, conflicted))
    # Each bill at the price of its click's time in the catalog version its batch was first priced with.
    history = store.current()
    versions = settings.root / "checkpoints" / "catalog-versions"
    for row in rows:
        as_of = history.as_of(int((versions / str(row["batch_id"])).read_text()))
        assert as_of.price(row["ad_id"], row["click_time"])[1] == row["amount_micros"], row  # type: ignore[index]
    assert {int((versions / str(row["batch_id"])).read_text()) for row in rows} > {0}, "the changes were used"
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)
    assert_join_state_format(settings, join_state)
    # The store the settings give a new checkpoint (in memory by default on one machine), kept through the kills.
    store = checkpoint_conf(settings.layout.checkpoint("billing"), STATE_STORE_PROVIDER)
    assert store == (ROCKSDB_PROVIDER if Settings.from_env(env).new_state_store == "rocksdb" else IN_MEMORY_PROVIDER)


def read_ledger_times(run_dir: Path) -> list[int]:
    """The click times of a run's ground truth, in order."""
    return sorted(json.loads(line)["click_time"] for line in (run_dir / "billable.jsonl").read_text().splitlines())


# --- Poison and flooding records, a hung Redis ---------------------------------------------------------------


def produce_raw(bootstrap: str, topic: str, values: list[bytes], key: bytes = b"ad-1") -> None:
    """Bytes as they are to `topic`, with a producer that takes records up to the broker's own limit (librdkafka's
    default stops at 1,000,000 bytes)."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 1_048_576, "linger.ms": 20})
    for value in values:
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def messages_on(bootstrap: str, topic: str) -> int:
    """How many messages `topic` holds, from its partitions' offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{topic}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


def quarantine_table(settings: Settings) -> list[dict]:
    return ds.dataset(settings.root / "quarantine", format="parquet", partitioning="hive").to_table().to_pylist()


def test_a_record_at_the_brokers_size_limit_is_quarantined_and_billing_goes_on(settings: Settings, job) -> None:
    settings.catalog_store().start(CATALOG)
    clicks = settings.topic_clicks
    # The quarantine topic takes less than the input topics (4 KiB): a bad record that the quarantine table keeps
    # whole (10 kB) but Kafka refuses on the topic goes there as a stub too.
    ensure_topics(settings.kafka_bootstrap, [settings.topic_quarantine], 4, configs={"max.message.bytes": "4096"})
    click_schema = ensure_schemas(settings)[clicks]
    # Framed as a click of a known schema, so the Avro decoder has to read a megabyte of noise.
    huge = b"\x00" + click_schema.to_bytes(4, "big") + random.Random(17).randbytes(1_040_000 - 5)
    medium = b"\xff" * 10_000
    small = b"definitely not avro"
    produce_raw(settings.kafka_bootstrap, clicks, [huge, medium, small])
    send(
        settings,
        [
            Impression("i-a", "ad-1", "u-a", T0),
            Click("c-a", "ad-1", "u-a", T0 + 2 * S),
            Impression("i-b", "ad-2", "u-b", T0 + 3 * S),
            Click("c-b", "ad-2", "u-b", T0 + 4 * S),
        ],
    )
    queries = job()
    process(queries)
    send(settings, [Impression("i-c", "ad-3", "u-c", T0 + 5 * S), Click("c-c", "ad-3", "u-c", T0 + 6 * S)])
    process(queries)  # the query stayed up, and bills what comes after

    rows = ledger_rows(settings)
    assert sorted(row["click_id"] for row in rows) == ["c-a", "c-b", "c-c"]
    assert redis_ad_totals(settings) == ledger_ad_totals(rows)

    # The table: the raw bytes up to 16 KiB, past that the size and SHA-256.
    table = {row["value_size"]: row for row in quarantine_table(settings)}
    assert sorted(table) == [len(small), len(medium), len(huge)]
    assert table[len(huge)]["value"] is None
    assert table[len(huge)]["value_sha256"] == hashlib.sha256(huge).hexdigest()
    assert table[len(huge)]["reason"] in {"undecodable", "missing_field"}
    assert (table[len(medium)]["value"], table[len(small)]["value"]) == (medium, small)
    assert all(row["topic"] == clicks for row in table.values())
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert sum(sum(topics.values()) for topics in totals.quarantined().values()) == 3

    # The topic: each record once, keyed by its coordinates; a stub that says why where the bytes cannot go.
    letters = {
        int(dict(m.headers())["value_size"]): m for m in consume(settings.kafka_bootstrap, settings.topic_quarantine, 3)
    }
    assert sorted(letters) == [len(small), len(medium), len(huge)]
    assert messages_on(settings.kafka_bootstrap, settings.topic_quarantine) == 3
    assert letters[len(small)].value() == small
    for size, why in ((len(huge), b"over the quarantine limit of 16384"), (len(medium), b"refused by Kafka")):
        headers = dict(letters[size].headers())
        assert letters[size].value() is None and why in headers["value_omitted"], headers
        assert headers["value_sha256"] == table[size]["value_sha256"].encode()
        row = table[size]
        assert letters[size].key() == f"{row['topic']}/{row['partition']}/{row['offset']}".encode()


def test_a_burst_of_100k_bad_records_neither_fails_nor_stalls_a_batch(settings: Settings, job) -> None:
    records = 100_000
    settings.catalog_store().start(CATALOG)
    produce_raw(settings.kafka_bootstrap, settings.topic_clicks, [b"bad %d" % i for i in range(records)])
    send(settings, [Impression("i-after", "ad-2", "u-after", T0), Click("c-after", "ad-2", "u-after", T0 + S)])
    queries = job()
    started = time.monotonic()
    process(queries)
    print(f"{records} bad records and a billable pair through the job in {time.monotonic() - started:.1f} s")

    assert [row["click_id"] for row in ledger_rows(settings)] == ["c-after"]
    table = quarantine_table(settings)
    assert len(table) == len({(row["partition"], row["offset"]) for row in table}) == records
    assert {row["reason"] for row in table} == {"undecodable"}
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert totals.quarantined() == {"undecodable": {settings.topic_clicks: records}}
    assert messages_on(settings.kafka_bootstrap, settings.topic_quarantine) == records
    durations = [progress["durationMs"]["triggerExecution"] for progress in queries[0].recentProgress]
    print(f"batch durations (ms): {durations}")


def test_dead_letters_wait_for_room_when_the_producers_queue_is_full(settings: Settings) -> None:
    rows = 20_000
    bad = pa.table(
        {
            "value": [b"bad %d" % i for i in range(rows)],
            "reason": ["undecodable"] * rows,
            "topic": [settings.topic_clicks] * rows,
            "partition": pa.array([0] * rows, pa.int32()),
            "offset": pa.array(range(rows), pa.int64()),
            "value_size": pa.array([len(b"bad %d" % i) for i in range(rows)], pa.int32()),
            "value_sha256": [hashlib.sha256(b"bad %d" % i).hexdigest() for i in range(rows)],
        }
    )
    # A queue of 1,000 messages: librdkafka raises BufferError 19 times over for this batch, and the sender waits.
    letters = DeadLetters(
        settings.kafka_bootstrap, settings.topic_quarantine, producer_config={"queue.buffering.max.messages": 1_000}
    )
    delivered = letters.send(bad)
    assert len(delivered) == rows
    assert messages_on(settings.kafka_bootstrap, settings.topic_quarantine) == rows


def test_a_hung_redis_delays_or_fails_the_batch_and_nothing_is_lost_or_doubled(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    # A Redis of the test's own, paused with SIGSTOP: it accepts connections and reads nothing, as a hung one does.
    server = LocalRedis(data_dir=tmp_path / "redis", port=free_port(), run_dir=tmp_path / "run", appendonly=False)
    server.start()
    pid = server.process.running_pid()
    assert pid is not None
    # One-second deadlines: a call gives up after about 6 x 1 s + 7.5 s of pauses between tries.
    settings = dataclasses.replace(settings, redis_url=server.url, redis_timeout_ms=1_000)
    settings.catalog_store().start(CATALOG)
    ensure_schemas(settings)
    config = stream_config(settings)
    queries: list[StreamingQuery] = []
    truth: set[str] = set()

    def bill(tag: str, at: int) -> None:
        send(settings, [Impression(f"i-{tag}", "ad-1", f"u-{tag}", at), Click(f"c-{tag}", "ad-1", f"u-{tag}", at + S)])
        truth.add(f"c-{tag}")

    def archived(tag: str) -> bool:
        """A batch has archived an event of `tag`: it reads Redis next (the day totals it charges on, then its
        apply). The impression and the click go to two topics, so the first such batch may hold either."""
        folder = settings.root / "archive"
        if not folder.is_dir():
            return False
        table = ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=["event_id"])
        return not {f"i-{tag}", f"c-{tag}"}.isdisjoint(table.column("event_id").to_pylist())

    try:
        bill("before", T0)
        queries += start(spark, config)
        process(queries)
        quiet(queries[-1])  # no batch of the first data still to come, to hang on the paused Redis

        # A pause shorter than the tries: the batch waits, then goes through; the query stays up.
        os.kill(pid, signal.SIGSTOP)
        try:
            bill("short", T0 + 10 * S)
            wait_for(lambda: archived("short"), "the batch's archive, written before Redis is called", 60)
            time.sleep(3)  # three of the one-second deadlines pass
        finally:
            os.kill(pid, signal.SIGCONT)
        process(queries)
        quiet(queries[-1])

        # A pause longer than the tries: the batch fails, the query stops and says why.
        os.kill(pid, signal.SIGSTOP)
        try:
            bill("long", T0 + 20 * S)
            wait_for(lambda: archived("long"), "the batch's archive, written before Redis is called", 60)
            wait_for(lambda: not queries[-1].isActive, "the batch to fail on the hung Redis", 60)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "Timeout" in str(queries[-1].exception()), queries[-1].exception()

        # The job restarted: the failed batch is replayed from the checkpoint; nothing lost, nothing twice.
        queries += start(spark, config)
        process(queries[-1:])
        rows = ledger_rows(settings)
        assert sorted(row["click_id"] for row in rows) == sorted(truth)
        assert redis_ad_totals(settings) == ledger_ad_totals(rows)
    finally:
        for query in queries:
            query.stop()
        server.stop()


def avro_long(n: int) -> bytes:
    """`n` as Avro writes a long: zigzag, then a varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def test_a_tiny_record_that_claims_a_huge_string_is_quarantined_and_billing_goes_on(settings: Settings, job) -> None:
    settings.catalog_store().start(CATALOG)
    click_schema = ensure_schemas(settings)[settings.topic_clicks]
    # Framed as a click of a known schema, its first field (the click id) says it is 2,000,000,000 bytes long: Avro
    # allocates what a string's length says before it reads it, and 2 GB is more than the job's heap.
    liar = b"\x00" + click_schema.to_bytes(4, "big") + avro_long(2_000_000_000) + b"abc"
    produce_raw(settings.kafka_bootstrap, settings.topic_clicks, [liar])
    send(settings, [Impression("i-a", "ad-1", "u-a", T0), Click("c-a", "ad-1", "u-a", T0 + S)])
    queries = job()
    process(queries)

    assert [row["click_id"] for row in ledger_rows(settings)] == ["c-a"]
    assert [(row["reason"], row["value"]) for row in quarantine_table(settings)] == [("undecodable", liar)]


def test_a_clock_ahead_pair_sent_again_minutes_later_is_not_billed_again_by_the_stream(
    spark: SparkSession, settings: Settings
) -> None:
    # Short watermark delays, so that "minutes later" (past the first bill's de-duplication state) is seconds here.
    settings = dataclasses.replace(settings, impression_watermark_ms=2_000, click_watermark_ms=2_000)
    catalog = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")])
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    publisher = EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )

    def send(events: list[Event]) -> None:
        for event in events:  # one at a time: Kafka receives the click after its impression
            publisher.publish_event(event)
            assert publisher.flush(30) == 0

    ahead = int(time.time() * 1000) + 10 * 60_000  # ten minutes ahead of Kafka's clock: valid, and clock ahead
    pair: list[Event] = [
        Impression("ahead-i", "ad-1", "ahead-u", ahead),
        Click("ahead-c", "ad-1", "ahead-u", ahead + 2_000),
    ]
    queries = start(spark, stream_config(settings))
    try:
        send(pair)
        queries[0].processAllAvailable()
        # Traffic on time moves the watermark past the first copies' receipt plus the delays, more than once.
        for round_ in range(3):
            time.sleep(3)
            now = int(time.time() * 1000)
            send(
                [
                    Impression(f"on-time-i{round_}", "ad-1", f"u{round_}", now),
                    Click(f"on-time-c{round_}", "ad-1", f"x{round_}", now),
                ]
            )
            queries[0].processAllAvailable()
        send(pair)  # the same events again: duplicates
        queries[0].processAllAvailable()
        time.sleep(3)
        now = int(time.time() * 1000)
        send([Impression("on-time-last", "ad-1", "u-last", now), Click("on-time-c-last", "ad-1", "x-last", now)])
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
    billed = [r["click_id"] for r in read_ledger(settings.root / "ledger").to_pylist()]
    assert billed.count("ahead-c") <= 1, billed
    # The on-time clicks have no impression of their user: the clock-ahead click is the only billable one.
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert sum(t.clicks for t in totals.all_ad_totals().values()) <= 1
