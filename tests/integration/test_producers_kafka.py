"""The producers against a real Kafka broker: what is sent is read back exactly, keyed and partitioned by ad_id."""

from __future__ import annotations

import io
import json
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from itertools import islice
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import Consumer, TopicPartition

from billing.catalog import AdChange, Catalog
from billing.events import Click, Impression
from billing.intake import MIN_EVENT_TIME_MS
from billing.schemas import schema_text
from billing.store.schema_registry import open_registry
from ops.cli import _traffic_args
from ops.kafka_service import ensure_topics
from ops.settings import Settings
from ops.stack import ensure_catalog
from producers.capture import BudgetLine, ExclusionLine, capture_line
from producers.publisher import DEPLOYED_FIELD, apply_to_store, replay_to_kafka, simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator, simulate, system_clock_ms
from producers.wire import EventDeserializer, EventSerializer, RawRecord, UnknownSchemaError, WireFormatError
from tests.conftest import child_env

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z


def read_all(bootstrap: str, topic: str, expected: int, deadline_s: float = 60.0) -> list:
    """Every message of `topic`, polling until `expected` arrived (then a little longer, to see any extra)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages = []
    deadline = time.monotonic() + deadline_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(num_messages=10_000, timeout=0.5)
            for message in batch:
                assert message.error() is None, message.error()
                messages.append(message)
            if len(messages) >= expected:
                quiet_until = quiet_until or time.monotonic() + 2.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return messages


def end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def test_simulated_events_are_read_back_exactly_keyed_and_partitioned_by_ad(settings: Settings, tmp_path: Path):
    config = SimulationConfig(
        events=3_000,
        seed=7,
        start_ms=T0,
        users=50,
        bad_fraction=0.0,
        late_fraction=0.02,
        duplicate_fraction=0.02,
    )
    # What the simulator sends, computed on its own (it is deterministic), to compare with what Kafka holds.
    expected = [a.item for a in simulate(config, tmp_path / "expected-run")]
    registry = open_registry(str(tmp_path / "registry.json"))

    summary = simulate_to_kafka(
        config, settings.kafka_bootstrap, registry, tmp_path / "run", topics=settings.topics, progress=False
    )

    assert summary.delivery_failures == 0
    assert summary.total == len(expected) == 3_000
    deserializer = EventDeserializer(registry)
    received: Counter = Counter()
    partitions_of_ad: dict[str, set[int]] = defaultdict(set)
    for event_type, topic in settings.topics.items():
        messages = read_all(settings.kafka_bootstrap, topic, sum(1 for e in expected if e.type == event_type))
        for message in messages:
            event = deserializer.deserialize(event_type, message.value())
            assert message.key() == event.ad_id.encode()
            partitions_of_ad[event.ad_id].add(message.partition())
            received[event] += 1
    assert received == Counter(expected)
    # One ad's impressions and clicks share one partition number across both topics.
    assert all(len(parts) == 1 for parts in partitions_of_ad.values())
    assert len({p for parts in partitions_of_ad.values() for p in parts}) > 1, "ads spread over partitions"
    # Nothing more than what was sent: the idempotent producer wrote no duplicate on retry.
    assert sum(end_offsets(settings.kafka_bootstrap, t, 4) for t in settings.topics.values()) == 3_000
    truth = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert truth == json.loads((tmp_path / "expected-run" / "summary.json").read_text())
    assert (tmp_path / "run" / "billable.jsonl").read_text() == (
        tmp_path / "expected-run" / "billable.jsonl"
    ).read_text()


def test_a_run_that_deploys_a_schema_version_part_way_writes_the_rest_with_it(settings: Settings, tmp_path: Path):
    config = SimulationConfig(events=2_000, seed=8, start_ms=T0, users=50, bad_fraction=0.0)
    expected = [a.item for a in simulate(config, tmp_path / "expected-run")]
    registry = open_registry(str(tmp_path / "registry.json"))
    halfway_s = config.expected_span_ms() / 2 / 1000

    summary = simulate_to_kafka(
        config,
        settings.kafka_bootstrap,
        registry,
        tmp_path / "run",
        topics=settings.topics,
        progress=False,
        deploy_schema_at_s=halfway_s,
    )

    assert summary.delivery_failures == 0 and summary.total == 2_000
    deployed = summary.schema_deployed
    assert deployed is not None and set(deployed) == {"impression", "click"}
    first = EventSerializer(registry).schema_ids  # the shipped versions: registered already, found again
    assert all(deployed[t] != first[t] for t in deployed), (deployed, first)
    assert DEPLOYED_FIELD in registry.schema_by_id(deployed["click"]), "the new version adds the field"
    deserializer = EventDeserializer(registry)
    received: Counter = Counter()
    ids: Counter = Counter()
    for event_type, topic in settings.topics.items():
        for message in read_all(settings.kafka_bootstrap, topic, sum(1 for e in expected if e.type == event_type)):
            received[deserializer.deserialize(event_type, message.value())] += 1
            ids[int.from_bytes(message.value()[1:5], "big")] += 1
    assert received == Counter(expected), "the same events, whichever version wrote them"
    assert set(ids) == set(first.values()) | set(deployed.values())
    assert min(ids[i] for i in [*deployed.values(), *first.values()]) > 20, "each version wrote a share of each type"
    assert (tmp_path / "run" / "billable.jsonl").read_text() == (
        tmp_path / "expected-run" / "billable.jsonl"
    ).read_text()


def test_replay_sends_the_capture_in_order_and_reports_the_bad_line(settings: Settings, tmp_path: Path):
    capture = tmp_path / "capture.jsonl"
    # Topics of one partition, where the offsets show the send order (a raw line has no key: with more
    # partitions it would land in any); the last click's event time is the earliest, so a replay that sorted by
    # time would be seen.
    tag = uuid.uuid4().hex[:10]
    topics = {"impression": f"impressions-one-{tag}", "click": f"clicks-one-{tag}"}
    ensure_topics(settings.kafka_bootstrap, list(topics.values()), partitions=1)
    raw = RawRecord(topic="clicks", key=None, value=b"\x00\x00\x00\x00\x63not avro")
    lines = [
        capture_line(Impression("i1", "ad-1", "u1", T0)),
        capture_line(Click("c1", "ad-1", "u1", T0 + 5_000)),
        '{"type": "click", "click_id": "c2", "ad_id": "ad-1"',  # cut short: not JSON
        capture_line(raw),
        capture_line(Click("c3", "ad-1", "u2", T0 - 6_000)),
    ]
    capture.write_text("\n".join(lines) + "\n")
    registry = open_registry(str(tmp_path / "registry.json"))

    result = replay_to_kafka(capture, settings.kafka_bootstrap, registry, topics=topics, progress=False)

    assert (result.lines, result.events, result.raw, result.bad_lines) == (5, 3, 1, 1)
    assert [e.line_number for e in result.errors] == [3]
    assert result.publish.delivery_failures == 0
    clicks = read_all(settings.kafka_bootstrap, topics["click"], 3)
    deserializer = EventDeserializer(registry)
    values = [m.value() for m in sorted(clicks, key=lambda m: m.offset())]
    # In the capture's order, the raw line sent as given between the two clicks.
    assert [v if v == raw.value else deserializer.deserialize("click", v) for v in values] == [
        Click("c1", "ad-1", "u1", T0 + 5_000),
        raw.value,
        Click("c3", "ad-1", "u2", T0 - 6_000),
    ]
    impressions = read_all(settings.kafka_bootstrap, topics["impression"], 1)
    assert [deserializer.deserialize("impression", m.value()) for m in impressions] == [
        Impression("i1", "ad-1", "u1", T0)
    ]


def test_replay_backfills_budget_and_ip_exclusion_lines_and_sends_user_agents_and_ips(
    settings: Settings, tmp_path: Path
):
    """`budget` and `ip_exclusion` lines ("Recorded traffic", docs/billing-rules.md) are made in the catalog's store
    where they stand, with their own effective times, before the lines after them are sent; a refused one is a bad line;
    events go out with their user agent and IP."""
    tag = uuid.uuid4().hex[:10]
    topics = {"impression": f"impressions-one-{tag}", "click": f"clicks-one-{tag}"}
    ensure_topics(settings.kafka_bootstrap, list(topics.values()), partitions=1)
    store = settings.catalog_store()
    base = SimulationConfig(events=10, seed=3).catalog()
    store.start(base)
    campaign = base.campaign_ids[0]
    seen: list[Catalog] = []

    def apply_catalog(line) -> None:
        seen.append(apply_to_store(store, line, system_clock_ms()))

    bot = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
    lines = [
        capture_line(BudgetLine(campaign, T0, 5_000_000)),
        capture_line(ExclusionLine("203.0.113.0/24", T0, True)),
        capture_line(Click("c1", "ad-1", "u1", T0, bot, "203.0.113.9")),
        capture_line(BudgetLine(campaign, T0 + 3_600_000, None)),
        capture_line(ExclusionLine("203.0.113.0/24", T0 + 1, True)),  # already excluded then: refused
        capture_line(BudgetLine("no-such-campaign", T0, 1)),  # refused
        capture_line(Click("c2", "ad-1", "u2", T0 + 1, None, "2001:db8::7")),
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("\n".join(lines) + "\n")
    registry = open_registry(str(tmp_path / "registry.json"))

    result = replay_to_kafka(
        capture, settings.kafka_bootstrap, registry, topics=topics, progress=False, apply_catalog=apply_catalog
    )

    assert (result.lines, result.events, result.catalog_changes, result.bad_lines) == (7, 2, 3, 2)
    assert [e.line_number for e in result.errors] == [5, 6]
    assert "already excluded" in result.errors[0].message and "unknown campaign" in result.errors[1].message
    catalog = settings.catalog_store().current()  # a reader of its own: what the database holds
    assert catalog == seen[-1] and catalog.version == base.version + 3
    assert catalog.budget_at(campaign, T0) == 5_000_000 and catalog.budget_at(campaign, T0 + 3_600_000) is None
    assert catalog.exclusions.excluding("203.0.113.9", T0) == "203.0.113.0/24"
    deserializer = EventDeserializer(registry)
    clicks = sorted(read_all(settings.kafka_bootstrap, topics["click"], 2), key=lambda m: m.offset())
    assert [deserializer.deserialize("click", m.value()) for m in clicks] == [
        Click("c1", "ad-1", "u1", T0, bot, "203.0.113.9"),
        Click("c2", "ad-1", "u2", T0 + 1, None, "2001:db8::7"),
    ]


def test_a_run_with_invalid_traffic_and_budgets_makes_them_in_the_pipelines_catalog(settings: Settings, tmp_path: Path):
    """`adbill produce`'s path: the run's budgets and IP exclusion list are made in the catalog's store as the run
    goes, and its ground truth, billed by that store, is the one the run's own history gives."""
    config = SimulationConfig(
        events=6_000,
        seed=9,
        start_ms=T0,
        users=2_000,
        impression_rate=20.0,  # four minutes of event time: floods take up to a minute
        click_through_rate=0.3,
        bad_fraction=0.0,
        crawler_fraction=0.05,
        excluded_ip_fraction=0.05,
        flood_fraction=0.1,
        double_click_fraction=0.05,
        late_duplicate_fraction=0.05,
        budget_campaigns=2,
    )
    expected = [a.item for a in simulate(config, tmp_path / "expected-run")]
    store = settings.catalog_store()
    store.start(config.catalog())
    registry = open_registry(str(tmp_path / "registry.json"))

    summary = simulate_to_kafka(
        config,
        settings.kafka_bootstrap,
        registry,
        tmp_path / "run",
        topics=settings.topics,
        progress=False,
        catalog_store=store,
    )

    assert summary.delivery_failures == 0 and summary.total == len(expected)
    assert settings.catalog_store().current() == Simulator(config).catalog, "budgets and exclusions made in the store"
    for name in ("billable.jsonl", "not_charged.jsonl", "summary.json"):
        assert (tmp_path / "run" / name).read_text() == (tmp_path / "expected-run" / name).read_text(), name
    counts = json.loads((tmp_path / "run" / "summary.json").read_text())
    reasons = counts["not_charged"]["by_reason"]
    assert all(reasons[r]["clicks"] > 0 for r in ("known_bot", "excluded_ip", "click_flood", "duplicate_click"))
    assert reasons["over_budget"]["clicks"] > 0
    deserializer = EventDeserializer(registry)
    messages = read_all(
        settings.kafka_bootstrap, settings.topics["click"], sum(1 for e in expected if e.type == "click")
    )
    received = Counter(deserializer.deserialize("click", m.value()) for m in messages)
    assert received == Counter(e for e in expected if isinstance(e, Click)), "with their user agents and IPs"


def test_the_stacks_live_traffic_keeps_event_time_on_the_wall_clock(settings: Settings, tmp_path: Path):
    """`adbill up`'s own traffic command, run for a few seconds: what reaches Kafka carries event times of now."""
    command = [sys.executable, "-m", "ops.cli", *_traffic_args(settings)]
    assert "--live" in command and "--follow-catalog" in command
    env = child_env(settings)
    # The stack's catalog, and an ad an admin created in it before the traffic started: the traffic follows the
    # catalog as it is, so the admin's ad gets its share.
    ensure_catalog(settings)
    store = settings.catalog_store()
    first = next(iter(store.current()))
    store.change(
        AdChange("admin-ad", 0, 750_000, first.campaign_id, first.advertiser_id, first.currency), backfill=True
    )
    log_path = tmp_path / "traffic.log"
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"live-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(list(settings.topics.values()))
    received: list[tuple[bytes, str, int, int]] = []  # value, topic, record timestamp, time this test read it

    def consume() -> None:
        for message in consumer.consume(num_messages=1_000, timeout=0.5):
            assert message.error() is None, message.error()
            received.append((message.value(), message.topic(), message.timestamp()[1], system_clock_ms()))

    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Five seconds of traffic by the records' own timestamps (the process takes a moment to start).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            consume()
            stamps = [stamp for _, _, stamp, _ in received]
            if stamps and max(stamps) - min(stamps) >= 5_000:
                break
        # Stopped as the stack stops it: SIGTERM, then what was sent is flushed and its ground truth written.
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log_path.read_text()
        total = sum(end_offsets(settings.kafka_bootstrap, topic, 4) for topic in settings.topics.values())
        while len(received) < total and time.monotonic() < deadline + 30:
            consume()
    finally:
        if process.poll() is None:
            process.kill()
        consumer.close()
    assert len(received) == total > 500

    run_dir = Path(command[command.index("--run-dir") + 1])
    summary = json.loads((run_dir / "summary.json").read_text())
    publish = json.loads((run_dir / "publish.json").read_text())
    config = SimulationConfig(**{**summary["config"], "start_ms": summary["start_ms"]})
    assert config.expected_arrival_rate() == pytest.approx(settings.traffic_rate)  # the rate the user set
    assert (summary["complete"], publish["delivery_failures"]) == (False, 0)
    assert 0 <= publish["live"]["offset_ms"] < 5_000, "the line starts now"

    registry = open_registry(settings.registry_location)
    deserializer = EventDeserializer(registry)
    lags, read_lags = [], []
    for value, topic, stamp, read_ms in received:
        try:
            event = deserializer.deserialize("impression" if topic == settings.topic_impressions else "click", value)
        except (WireFormatError, UnknownSchemaError):
            continue  # bad bytes, made to be quarantined
        if event.event_time < MIN_EVENT_TIME_MS:
            continue  # an event time before 2000, made to be quarantined
        lags.append(stamp - event.event_time)
        read_lags.append(read_ms - event.event_time)
    # Every event reached Kafka within the configured lateness of the wall clock, and never ahead of it; nearly
    # all at their event time, the out-of-order ones and re-sends a second or two after (a run this short
    # sends no late event: those come a minute or more after their event time).
    assert min(lags) >= 0, min(lags)
    assert max(read_lags) < settings.lateness_horizon_ms, max(read_lags)
    assert max(lags) < 10_000, max(lags)
    assert statistics.median(lags) < 1_000, statistics.median(lags)

    # The content is the seed's: the first records of the same run, simulated again over the same catalog (the run's
    # own changes start a minute in), byte for byte; the admin's ad among them.
    serializer = EventSerializer(registry)
    ads = sorted(settings.catalog_store().current().ad_ids)
    assert "admin-ad" in ads
    again = islice(Simulator(config).arrivals(lambda t: ads), len(received))
    expected = [a.item.value if isinstance(a.item, RawRecord) else serializer.serialize(a.item) for a in again]
    assert Counter(value for value, *_ in received) == Counter(expected)
    admin_events = [a for a in islice(Simulator(config).arrivals(lambda t: ads), len(received)) if a.event]
    assert any(a.event.ad_id == "admin-ad" for a in admin_events), "the admin's ad got traffic"


def test_replay_registers_a_schema_line_and_writes_its_subjects_events_with_it(settings: Settings, tmp_path: Path):
    """A `schema` line ("Recorded traffic", docs/billing-rules.md): the version is registered, and the events of its
    subject after it are written with it, fields it adds taken from the event line or defaulted; an incompatible one
    is a bad line."""
    tag = uuid.uuid4().hex[:10]
    topics = {"impression": f"impressions-one-{tag}", "click": f"clicks-one-{tag}"}
    ensure_topics(settings.kafka_bootstrap, list(topics.values()), partitions=1)
    version_2 = json.loads(schema_text("click"))
    version_2["fields"].append({"name": "placement", "type": ["null", "string"], "default": None})
    incompatible = json.loads(schema_text("click"))
    incompatible["fields"].append({"name": "token", "type": "string"})  # required, no default
    lines = [
        capture_line(Click("c1", "ad-1", "u1", T0)),
        json.dumps({"type": "schema", "subject": "clicks-value", "schema": version_2}),
        capture_line(Impression("i2", "ad-1", "u2", T0)),  # another subject: unchanged
        json.dumps({**json.loads(capture_line(Click("c2", "ad-1", "u2", T0 + 1))), "placement": "feed"}),
        capture_line(Click("c3", "ad-1", "u3", T0 + 2)),  # the added field takes its default
        json.dumps({"type": "schema", "subject": "clicks-value", "schema": incompatible}),
        capture_line(Click("c4", "ad-1", "u4", T0 + 3)),  # still version 2
    ]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("\n".join(lines) + "\n")
    registry = open_registry(str(tmp_path / "registry.json"))

    result = replay_to_kafka(capture, settings.kafka_bootstrap, registry, topics=topics, progress=False)

    assert (result.lines, result.events, result.schemas, result.bad_lines) == (7, 5, 1, 1)
    assert [e.line_number for e in result.errors] == [6] and "token" in result.errors[0].message
    v1_id, v2_id = registry.ids("clicks-value")
    assert json.loads(registry.schema_by_id(v2_id)) == version_2
    clicks = sorted(read_all(settings.kafka_bootstrap, topics["click"], 4), key=lambda m: m.offset())
    assert [int.from_bytes(m.value()[1:5], "big") for m in clicks] == [v1_id, v2_id, v2_id, v2_id]
    reader = fastavro.parse_schema(version_2)
    added = [fastavro.schemaless_reader(io.BytesIO(m.value()[5:]), reader, reader)["placement"] for m in clicks[1:]]
    assert added == ["feed", None, None]
    deserializer = EventDeserializer(registry)
    assert [deserializer.deserialize("click", m.value()).click_id for m in clicks] == ["c1", "c2", "c3", "c4"]
    impressions = read_all(settings.kafka_bootstrap, topics["impression"], 1)
    assert [int.from_bytes(m.value()[1:5], "big") for m in impressions] == registry.ids("impressions-value")
