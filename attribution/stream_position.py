"""Where the streaming job stands, for reconciliation: the billing query's committed offsets (read from its
checkpoint), the topics' end offsets (asked of Kafka) (both `billing.store.stream_offsets`, which the health page
reads too), and the job's heartbeat and what it says it waits for (in Redis).
"""

from __future__ import annotations

import time
from pathlib import Path

import redis

from billing.reconcile_plan import Offsets, StreamPosition
from billing.store.part_status import STREAM_PART, describe_wait, read_status
from billing.store.redis_keys import RedisKeys
from billing.store.redis_totals import connect
from billing.store.stream_offsets import committed_offsets, end_offsets

__all__ = ["BILLING_QUERY", "committed_offsets", "end_offsets", "stream_position"]

BILLING_QUERY = "billing"
"""The streaming job's one query: its checkpoint folder's name, its heartbeat's and its applied batches' key."""


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
