"""Where the billing query stands in Kafka: the offsets its checkpoint committed, Kafka's end offsets, and the lag
between them, read from the two sources themselves (never from the job's last report, which freezes exactly when
the job is stuck).

The checkpoint is Spark's own record of what the query has read and written: `offsets/N` holds the end offsets of
micro-batch N, one line per source after two header lines, and `commits/N` exists once batch N's sink finished. The
offsets of the newest committed batch are what the job has provably billed, archived and counted. Reconciliation's
gate (`attribution.stream_position`) and the health page read both through here.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Offsets = dict[str, dict[int, int]]
"""Kafka offsets: topic -> partition -> the next offset to read (or the end offset)."""


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


def end_offsets(bootstrap: str, topics: Sequence[str], timeout_s: float = 10.0) -> Offsets:
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


def records_behind(committed: Offsets | None, end: Offsets) -> dict[str, int]:
    """Per topic, the records Kafka holds past what the query committed (a partition the query never read counts
    from offset 0)."""
    committed = committed or {}
    return {
        topic: sum(max(0, offset - committed.get(topic, {}).get(partition, 0)) for partition, offset in parts.items())
        for topic, parts in sorted(end.items())
    }


def answers(bootstrap: str, timeout_s: float) -> bool:
    """Whether any of the bootstrap servers accepts a TCP connection within `timeout_s` (a broker that is down
    refuses at once; asking Kafka's client would wait its whole timeout)."""
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


@dataclass(frozen=True)
class LagReading:
    """The billing query's lag as Kafka and the checkpoint say it now: records waiting per topic (None when Kafka
    could not be asked: `error` says why), whether the query has committed any batch, and when it was read."""

    lag: dict[str, int] | None
    committed: bool
    read_at_ms: int
    error: str | None = None

    @property
    def total(self) -> int | None:
        return None if self.lag is None else sum(self.lag.values())


class KafkaLag:
    """Reads the lag of the query whose checkpoint is `checkpoint` on `topics` (`read()`), kept `keep_s` seconds so
    that a page refreshed by several people asks Kafka once."""

    def __init__(
        self, checkpoint: Path, bootstrap: str, topics: Sequence[str], timeout_s: float = 2.0, keep_s: float = 5.0
    ) -> None:
        self.checkpoint, self.bootstrap, self.topics = checkpoint, bootstrap, list(topics)
        self.timeout_s, self.keep_s = timeout_s, keep_s
        self._kept: tuple[float, LagReading] | None = None
        self._lock = threading.Lock()

    def read(self) -> LagReading:
        with self._lock:
            if self._kept is not None and time.monotonic() - self._kept[0] < self.keep_s:
                return self._kept[1]
            reading = self._read()
            self._kept = (time.monotonic(), reading)
            return reading

    def _read(self) -> LagReading:
        now = int(time.time() * 1000)
        try:
            committed = committed_offsets(self.checkpoint)
        except (OSError, ValueError) as exc:
            return LagReading(None, False, now, f"the checkpoint {self.checkpoint} does not read: {exc}")
        if not answers(self.bootstrap, min(self.timeout_s, 1.0)):
            return LagReading(None, committed is not None, now, f"Kafka at {self.bootstrap} does not answer")
        try:
            end = end_offsets(self.bootstrap, self.topics, self.timeout_s)
        except Exception as exc:  # confluent_kafka's KafkaException, or a topic missing
            return LagReading(None, committed is not None, now, str(exc))
        return LagReading(records_behind(committed, end), committed is not None, now)
