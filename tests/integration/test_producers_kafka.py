"""The producers against a real Kafka broker: what is sent is read back exactly, keyed and partitioned by ad_id."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from billing.events import Click, Impression
from billing.schema_registry import open_registry
from ops.settings import Settings
from producers.capture import capture_line
from producers.publisher import replay_to_kafka, simulate_to_kafka
from producers.simulator import SimulationConfig, simulate
from producers.wire import EventDeserializer, RawRecord

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


def test_replay_sends_the_capture_in_order_and_reports_the_bad_line(settings: Settings, tmp_path: Path):
    capture = tmp_path / "capture.jsonl"
    raw = RawRecord(topic="clicks", key=b"ad-x", value=b"\x00\x00\x00\x00\x63not avro")
    lines = [
        capture_line(Impression("i1", "ad-1", "u1", T0)),
        capture_line(Click("c1", "ad-1", "u1", T0 + 5_000)),
        '{"type": "click", "click_id": "c2", "ad_id": "ad-1"',  # cut short: not JSON
        capture_line(raw),
        capture_line(Click("c3", "ad-2", "u2", T0 + 6_000)),
    ]
    capture.write_text("\n".join(lines) + "\n")
    registry = open_registry(str(tmp_path / "registry.json"))

    result = replay_to_kafka(capture, settings.kafka_bootstrap, registry, topics=settings.topics, progress=False)

    assert (result.lines, result.events, result.raw, result.bad_lines) == (5, 3, 1, 1)
    assert [e.line_number for e in result.errors] == [3]
    assert result.publish.delivery_failures == 0
    clicks = read_all(settings.kafka_bootstrap, settings.topic_clicks, 3)
    deserializer = EventDeserializer(registry)
    values = sorted(m.value() for m in clicks)
    assert raw.value in values, "the raw line is sent as given"
    decoded = {deserializer.deserialize("click", v) for v in values if v != raw.value}
    assert decoded == {Click("c1", "ad-1", "u1", T0 + 5_000), Click("c3", "ad-2", "u2", T0 + 6_000)}
    impressions = read_all(settings.kafka_bootstrap, settings.topic_impressions, 1)
    assert [deserializer.deserialize("impression", m.value()) for m in impressions] == [
        Impression("i1", "ad-1", "u1", T0)
    ]
