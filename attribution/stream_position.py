"""Where the streaming job stands, for reconciliation: the billing query's committed offsets (read from its
checkpoint), the topics' end offsets (asked of Kafka), and the job's heartbeat and what it says it waits for (in
Redis).

The checkpoint is Spark's own record of what the query has read and written: `offsets/N` holds the end offsets of
micro-batch N, one line per source after two header lines, and `commits/N` exists once batch N's sink finished.
The offsets of the newest committed batch are what the job has provably billed, archived and counted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis

from billing.closing import Offsets, StreamPosition
from billing.store.part_status import STREAM_PART, describe_wait, read_status
from billing.store.redis_keys import RedisKeys
from billing.store.redis_totals import connect

BILLING_QUERY = "billing"
"""The streaming job's one query: its checkpoint folder's name, its heartbeat's and its applied batches' key."""


def committed_offsets(checkpoint: Path) -> Offsets | None:
    """The offsets up to which the query has committed (None: no batch committed yet)."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    batches = sorted((int(p.name) for p in commits.iterdir() if p.name.isdigit()), reverse=True)
    for batch in batches:
        offsets_file = checkpoint / "offsets" / str(batch)
        if not offsets_file.exists():
            continue
        merged: Offsets = {}
        for line in offsets_file.read_text().splitlines()[2:]:
            if not line.strip() or line.strip() == "-":
                continue
            for topic, parts in json.loads(line).items():
                merged.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
        return merged
    return None


def end_offsets(bootstrap: str, topics: list[str], timeout_s: float = 10.0) -> Offsets:
    """The end offset (the offset the next record will get) of every partition of `topics`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "adbill-reconcile-position",
            "enable.auto.commit": False,
            "socket.timeout.ms": int(timeout_s * 1000),
            "log_level": 0,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        out: Offsets = {}
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                raise RuntimeError(f"Kafka at {bootstrap} does not list topic {topic}")
            out[topic] = {
                partition: consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout_s, cached=False
                )[1]
                for partition in sorted(described.partitions)
            }
        return out
    finally:
        consumer.close()


def _heartbeat_ms(client: redis.Redis, prefix: str, query: str) -> int | None:
    """When the query last reported a batch or an idle trigger (epoch ms), None if never."""
    value = client.get(RedisKeys(prefix).heartbeat(query))
    return None if value is None else int(str(value))


def stream_position(
    checkpoint: Path,
    bootstrap: str,
    topics: list[str],
    redis_url: str,
    prefix: str,
    query: str,
    alive_within_ms: int,
) -> StreamPosition:
    """The job's position now (wall clock: the heartbeat is real time, whatever clock a run is given). Kafka
    out of reach leaves the end offsets unknown, which holds every period that would close."""
    end: Offsets | None
    error = None
    try:
        end = end_offsets(bootstrap, topics)
    except Exception as exc:  # confluent_kafka's KafkaException, or a topic missing
        end, error = None, str(exc)
    client = connect(redis_url)
    try:  # one connection: the heartbeat, and what the job says it waits for (`billing.store.part_status`)
        beat = _heartbeat_ms(client, prefix, query)
        status = read_status(client, prefix, STREAM_PART)
    finally:
        client.close()
    now = int(time.time() * 1000)
    return StreamPosition(
        committed=committed_offsets(checkpoint),
        end=end,
        silent_for_ms=None if beat is None else max(0, now - beat),
        alive_within_ms=alive_within_ms,
        error=error,
        waiting=describe_wait(status, now) if status else None,
    )
