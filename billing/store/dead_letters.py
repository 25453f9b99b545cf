"""Adapter: quarantine rows to the quarantine topic (the dead-letter topic of "Bad input"), sent from the driver.

In: quarantine rows (`attribution.decode.QUARANTINE_COLUMNS`), from the streaming job's batches and from
reconciliation's id conflicts. Out: one message per row on the quarantine topic:

- key: the record's coordinates, `topic/partition/offset` (the topic is at-least-once: a batch replayed after a
  crash sends its rows again, and a consumer drops repeats by key);
- value: the record's raw bytes, or none (a stub) when the row has none to give: the record is larger than
  `QUARANTINE_VALUE_LIMIT`, or Kafka refused the message for its size;
- headers: `reason`, `topic`, `partition`, `offset`, `value_size`, `value_sha256`, and on a stub
  `value_omitted`, which says why the bytes are not there.

A record that Kafka will not take for its size therefore never fails a batch: it goes as a stub. librdkafka's
local queue holds 100,000 messages; a batch with more bad rows than that waits for room instead of failing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from billing.intake import QUARANTINE_VALUE_LIMIT

log = logging.getLogger(__name__)

HEADERS = ("reason", "topic", "partition", "offset", "value_size", "value_sha256")
"""Columns of a quarantine row sent as headers, in this order."""

_TOO_LARGE = KafkaError.MSG_SIZE_TOO_LARGE


class DeliveryError(RuntimeError):
    """Some rows did not reach the quarantine topic in time (Kafka down or refusing them)."""

    def __init__(self, message: str, delivered: set[str]) -> None:
        super().__init__(message)
        self.delivered = delivered
        """The keys (`topic/partition/offset`) of the rows that did reach it."""


class DeadLetters:
    """Quarantine rows to the quarantine topic, with the reason and the record's coordinates as headers."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        timeout_s: float = 60.0,
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "logger": log,  # the client's connection errors go to the job's log, not to stderr
                **(producer_config or {}),
            }
        )

    def send(self, rows: pa.Table) -> set[str]:
        """Send every row of `rows` and wait for Kafka to have them all, within `timeout_s`; returns their keys.
        DeliveryError if any was not delivered. A row Kafka refuses for its size is sent again as a stub."""
        delivered: set[str] = set()
        if rows.num_rows == 0:
            return delivered
        deadline = time.monotonic() + self.timeout_s
        failures: list[str] = []
        refused: list[tuple[dict[str, Any], str]] = []

        def on_delivery(row: dict[str, Any]) -> Any:
            def report(error: Any, message: Any) -> None:
                if error is None:
                    delivered.add(message.key().decode())
                elif error.code() == _TOO_LARGE and row["value"] is not None:
                    refused.append((row, f"refused by Kafka: {error.str()}"))
                else:
                    failures.append(str(error))

            return report

        try:
            for row in rows.select(["value", *HEADERS]).to_pylist():
                self._produce(row, _omitted(row), on_delivery(row), deadline)
            left = self.producer.flush(max(0.0, deadline - time.monotonic()))
            if refused:
                log.warning("%s refused %d record(s) for their size: sent as stubs", self.topic, len(refused))
                for row, why in refused:
                    self._produce({**row, "value": None}, why, on_delivery(row), deadline)
                left = self.producer.flush(max(0.0, deadline - time.monotonic()))
        except (BufferError, KafkaException) as exc:
            left, failures = len(self.producer), [*failures, str(exc)]
        if left or failures:
            # Whatever is still queued is sent again with the replayed batch or the next run: drop it here.
            self.producer.purge(in_queue=True, in_flight=False)
            self.producer.poll(0)
            raise DeliveryError(
                f"quarantine topic {self.topic}: {rows.num_rows - len(delivered)} of {rows.num_rows} record(s) not "
                f"delivered within {self.timeout_s:.0f} s; errors: {failures[:3]}",
                delivered,
            )
        return delivered

    def _produce(self, row: dict[str, Any], omitted: str | None, on_delivery: Any, deadline: float) -> None:
        headers: list[tuple[str, str | bytes | None]] = [
            (name, str(row[name]).encode()) for name in HEADERS if row[name] is not None
        ]
        value = row["value"]
        if omitted is not None:
            headers.append(("value_omitted", omitted.encode()))
            value = None
        key = f"{row['topic']}/{row['partition']}/{row['offset']}".encode()
        while True:
            try:
                self.producer.produce(self.topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: let deliveries make room
                if time.monotonic() > deadline:
                    raise
                self.producer.poll(0.05)
            except KafkaException as exc:
                if exc.args[0].code() != _TOO_LARGE or value is None:
                    raise
                headers.append(("value_omitted", f"refused by the producer: {exc.args[0].str()}".encode()))
                value = None
        self.producer.poll(0)


def _omitted(row: dict[str, Any]) -> str | None:
    """Why the row goes as a stub (its bytes were left out of the quarantine row), or None."""
    if row["value"] is None and row["value_size"] is not None and row["value_size"] > QUARANTINE_VALUE_LIMIT:
        return (
            f"{row['value_size']} bytes, over the quarantine limit of {QUARANTINE_VALUE_LIMIT}: the quarantine table "
            f"keeps its size and SHA-256, and the record is at {row['topic']}/{row['partition']}/{row['offset']} "
            "for as long as Kafka retains it"
        )
    return None
