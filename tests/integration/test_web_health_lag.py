"""The health page reads the job's backlog from Kafka itself: Kafka's end offsets against the offsets of the billing
query's last committed batch (its checkpoint), not the job's last report, which freezes when the job is stuck.

Real Kafka (the session's broker, the test's own topics) and real Redis; the checkpoint is written as Spark writes
it. A stuck job: its report says 0 records waiting, its heartbeat is old, and records pile up in Kafka."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from billing.store.redis_keys import RedisKeys
from billing.store.stream_offsets import KafkaLag, committed_offsets, records_behind
from ops.settings import Settings
from tests.conftest import isolated_settings
from tests.web_support import Seeded, login, seed
from web.app import create_app

pytestmark = pytest.mark.integration


def write_checkpoint(folder: Path, batch: int, offsets: dict[str, dict[str, int]]) -> None:
    """A committed micro-batch in a Spark checkpoint: `offsets/N` (two header lines, one line per source) and
    `commits/N`."""
    (folder / "offsets").mkdir(parents=True, exist_ok=True)
    (folder / "commits").mkdir(parents=True, exist_ok=True)
    header = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n'
    (folder / "offsets" / str(batch)).write_text(header + json.dumps(offsets) + "\n")
    (folder / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def produce(settings: Settings, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(n):
        producer.produce(topic, key=f"ad-{i % 4}".encode(), value=b"x")
    assert producer.flush(30) == 0


def test_a_stuck_job_s_backlog_is_read_from_kafka_not_from_its_frozen_report(settings: Settings) -> None:
    seeded: Seeded = seed(settings)  # its progress record of the billing query: a lag of 120 and 80, then frozen
    checkpoint = settings.layout.checkpoint("billing")
    produce(settings, settings.topic_impressions, 400)
    produce(settings, settings.topic_clicks, 60)
    # The job committed a batch that read every record there was then.
    reader = KafkaLag(checkpoint, settings.kafka_bootstrap, [settings.topic_impressions, settings.topic_clicks])
    end = reader._read()
    assert end.error is None and end.lag == {settings.topic_clicks: 60, settings.topic_impressions: 400}
    assert not end.committed
    from billing.store.stream_offsets import end_offsets

    ends = end_offsets(settings.kafka_bootstrap, [settings.topic_impressions, settings.topic_clicks])
    write_checkpoint(checkpoint, 7, {t: {str(p): o for p, o in parts.items()} for t, parts in ends.items()})
    assert records_behind(committed_offsets(checkpoint), ends) == {t: 0 for t in ends}
    # Then it stopped: its heartbeat is two minutes old, and 23,000 records arrive meanwhile.
    keys = RedisKeys(settings.redis_prefix)
    now = int(time.time() * 1000)
    seeded.client.set(keys.heartbeat("billing"), str(now - 120_000))
    produce(settings, settings.topic_impressions, 20_000)
    produce(settings, settings.topic_clicks, 3_000)

    client = create_app(settings, cache_s=0).test_client()
    assert login(client, "ada").status_code == 302
    page = client.get("/health").text
    assert f'id="billing-lag-{settings.topic_impressions}">20,000<' in page
    assert f'id="billing-lag-{settings.topic_clicks}">3,000<' in page
    status = client.get("/api/v1/health").json
    kafka = next(c for c in status["status"]["components"] if c["name"] == "Kafka")
    assert kafka["level"] == "amber" and kafka["text"].startswith("23,000 records waiting, and the job last billed")
    assert status["kafka"]["lag"] == {settings.topic_clicks: 3_000, settings.topic_impressions: 20_000}
    assert status["queries"][0]["consumer_lag"] == status["kafka"]["lag"]
    assert status["queries"][0]["consumer_lag_reported"] == {"clicks": 80, "impressions": 120}  # the frozen report
    # The job reads again: its next committed batch takes the lag back to zero, and Kafka is fine.
    ends = end_offsets(settings.kafka_bootstrap, [settings.topic_impressions, settings.topic_clicks])
    write_checkpoint(checkpoint, 8, {t: {str(p): o for p, o in parts.items()} for t, parts in ends.items()})
    seeded.client.set(keys.heartbeat("billing"), str(int(time.time() * 1000)))
    client = create_app(settings, cache_s=0).test_client()  # a new app: the reading is kept 5 s per process
    assert login(client, "ada").status_code == 302
    kafka = next(c for c in client.get("/api/v1/health").json["status"]["components"] if c["name"] == "Kafka")
    assert (kafka["level"], kafka["text"]) == ("ok", "0 records waiting to be read.")


def test_kafka_out_of_reach_is_said_at_once_not_shown_as_no_backlog(redis_settings: Settings) -> None:
    from ops.process import free_port

    settings = isolated_settings(
        home=redis_settings.home,
        database_url=redis_settings.database_url,
        redis_url=redis_settings.redis_url,
        redis_prefix=redis_settings.redis_prefix,
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
    )
    seed(settings)
    client = create_app(settings, cache_s=0).test_client()
    assert login(client, "ada").status_code == 302
    started = time.monotonic()
    page = client.get("/health").text
    assert time.monotonic() - started < 5, "a broker that is down is told at once"
    assert "does not answer" in page and 'id="billing-lag-error"' in page
    assert 'id="billing-reported-lag-impressions">120<' in page  # the job's last report, named as such
    kafka = next(c for c in client.get("/api/v1/health").json["status"]["components"] if c["name"] == "Kafka")
    assert kafka["level"] == "red" and "does not answer" in kafka["text"]
