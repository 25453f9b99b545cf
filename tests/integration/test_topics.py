"""The stack's topics on a real broker: created, or brought into line, with `LogAppendTime`, so a record's timestamp is
when Kafka received it, whatever the producer said."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition

from ops.kafka_service import LocalKafka, ensure_topics, topic_configs
from ops.settings import Settings
from ops.stack import ensure_stack_topics

pytestmark = pytest.mark.integration

YEAR_2001_MS = 978_307_200_000


def test_the_stacks_topics_keep_the_time_kafka_received_each_record(kafka: LocalKafka, settings: Settings) -> None:
    tag = uuid.uuid4().hex[:10]
    settings = dataclasses.replace(
        settings,
        topic_impressions=f"impressions-{tag}",
        topic_clicks=f"clicks-{tag}",
        topic_quarantine=f"quarantine-{tag}",
    )
    # One topic is already there, made by an older version with the broker's default, CreateTime.
    ensure_topics(kafka.bootstrap, [settings.topic_clicks], partitions=4)
    assert topic_configs(kafka.bootstrap, settings.topic_clicks)["message.timestamp.type"] == "CreateTime"

    names = ensure_stack_topics(settings)
    for name in names:
        assert topic_configs(kafka.bootstrap, name)["message.timestamp.type"] == "LogAppendTime", name

    # A producer that stamps its record with a time of its own does not decide when Kafka received it.
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    before_ms = int(time.time() * 1000)
    producer.produce(settings.topic_clicks, value=b"stamped", key=b"ad-1", timestamp=YEAR_2001_MS)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"t-{tag}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(settings.topic_clicks, p, 0) for p in range(4)])
    try:
        deadline = time.monotonic() + 30
        messages: list = []
        while not messages and time.monotonic() < deadline:
            messages = [m for m in consumer.consume(10, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    assert len(messages) == 1
    kind, stamp = messages[0].timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before_ms - 5_000 <= stamp <= int(time.time() * 1000) + 5_000
