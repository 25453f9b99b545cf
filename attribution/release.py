"""Quarantined records whose schema id the registry learnt after they arrived: decoded and put in the archive, once.

A record whose schema id the registry did not know when its batch ran is quarantined as `unknown_schema`
(`attribution.decode`). When the job starts its query (at start-up, or again for new schema versions:
`attribution.schema_follow`), the first micro-batch N of that query releases every such record that it can now
decode: it becomes an archive row of batch N (`ARCHIVE/event_type=T/period=P/batch_id=N/released.parquet`,
flagged `late`: the streaming join never saw it), so reconciliation bills it from the archive like any event the
join missed (a `late_click` or `late_impression` correction, or an adjustment when its period is closed: batch N
makes the period's data newer). Its coordinates go to `RELEASED/batch_id=N/released.parquet`, and a record released
by an earlier batch is not released again. In Redis its quarantine count goes down and its late count up, with
batch N's figures, once.

Pure pyarrow and fastavro, on the driver: the records are few (what arrived before a producer's schema was known)
and this runs once per start of the query, not per batch. A record that decodes but fails a check (a missing
field, a time out of range) stays in quarantine, as one whose id is still unknown does.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from attribution.batch_output import ARCHIVE_COLUMNS, late_counts, write_batch_files
from attribution.decode import HEADER_SIZE, event_fields, reader_schema, required_fields
from billing.intake import MAX_FUTURE_MS, MIN_EVENT_TIME_MS, QuarantineReason
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.redis_totals import LateCount, QuarantineCount

RELEASE_FILE = "released.parquet"
"""The name of a release's files: beside the tasks' `part-NNNNN.parquet` of the same batch, never one of them."""

RELEASE_COLUMNS = ("topic", "partition", "offset", "event_type", "event_id", "period", "quarantine_batch_id")

_REASON = QuarantineReason.UNKNOWN_SCHEMA.value


@dataclass(frozen=True)
class Release:
    """What one batch released: its archive rows and files, and the Redis figures they change."""

    events: pa.Table
    """Archive rows (`ARCHIVE_COLUMNS`)."""
    files: list[Path]
    late: list[LateCount]
    quarantined: list[QuarantineCount]
    """Negative counts: the released records leave the `unknown_schema` count."""

    @property
    def count(self) -> int:
        return self.events.num_rows

    @classmethod
    def none(cls) -> Release:
        return cls(ARCHIVE_SCHEMA.empty_table(), [], [], [])


def release_quarantined(
    layout: DataLayout,
    batch_id: int,
    writer_schemas: Mapping[str, Mapping[int, str]],
    event_type_of_topic: Mapping[str, str],
    periods: Periods,
    advertiser_of: Mapping[str, str],
) -> Release:
    """Release, as part of batch `batch_id`, every `unknown_schema` record of an earlier batch that decodes with
    `writer_schemas` (event type -> schema id -> text) and was not released before (module doc)."""
    held = held_records(layout, batch_id)
    decoders = {event_type: _Decoder(event_type, schemas) for event_type, schemas in writer_schemas.items()}
    rows: list[dict[str, Any]] = []
    released: list[dict[str, Any]] = []
    for record in held.to_pylist():
        event_type = event_type_of_topic.get(record["topic"])
        decoder = decoders.get(event_type or "")
        event = decoder.decode(record["value"], record["received_ms"]) if decoder is not None else None
        if event is None or event_type is None:
            continue
        period_start = periods.start_of(event["event_time"])
        period = periods.key(period_start)
        rows.append(
            {
                "event_type": event_type,
                "event_id": event[f"{event_type}_id"],
                "ad_id": event["ad_id"],
                "user_id": event["user_id"],
                "event_time": event["event_time"],
                "received_ms": record["received_ms"],
                "topic": record["topic"],
                "partition": record["partition"],
                "offset": record["offset"],
                "value": record["value"],
                "user_agent": event.get("user_agent"),
                "ip": event.get("ip"),
                "late": True,
                "period_start_ms": period_start,
                "period": period,
                "batch_id": batch_id,
            }
        )
        released.append(
            {
                "topic": record["topic"],
                "partition": record["partition"],
                "offset": record["offset"],
                "event_type": event_type,
                "event_id": event[f"{event_type}_id"],
                "period": period,
                "quarantine_batch_id": record["batch_id"],
                "batch_id": batch_id,
            }
        )
    events = pa.Table.from_pylist(rows, schema=ARCHIVE_SCHEMA)
    files: list[Path] = []
    if rows:
        files += write_batch_files(events, layout.archive, ("event_type", "period", "batch_id"), RELEASE_FILE, False)
        files += write_batch_files(
            pa.Table.from_pylist(released, schema=RELEASED_SCHEMA), layout.released, ("batch_id",), RELEASE_FILE, False
        )
    per_topic: dict[str, int] = {}
    for row in rows:
        per_topic[row["topic"]] = per_topic.get(row["topic"], 0) + 1
    known = events.filter(pc.is_in(events.column("ad_id"), pa.array(list(advertiser_of), pa.string())))
    return Release(
        events=events,
        files=files,
        late=late_counts(known, advertiser_of),
        # Quarantined as `unknown_schema`, the record had no readable ad: it was counted without an advertiser.
        quarantined=[QuarantineCount(_REASON, topic, None, -n) for topic, n in sorted(per_topic.items())],
    )


def held_records(layout: DataLayout, before_batch: int) -> pa.Table:
    """The `unknown_schema` quarantine rows of batches before `before_batch` that no batch before it released."""
    if not layout.quarantine.is_dir() or not any(layout.quarantine.glob("batch_id=*/*.parquet")):
        return pa.table({name: [] for name in ("topic", "partition", "offset", "received_ms", "value", "batch_id")})
    quarantine = ds.dataset(layout.quarantine, format="parquet", partitioning="hive")
    wanted = (ds.field("reason") == _REASON) & (ds.field("batch_id") < before_batch)
    # The raw bytes only when there is a record to release: a quarantine of junk can be large.
    if not quarantine.count_rows(filter=wanted):
        return pa.table({name: [] for name in ("topic", "partition", "offset", "received_ms", "value", "batch_id")})
    held = quarantine.to_table(
        columns=["topic", "partition", "offset", "received_ms", "value", "batch_id"], filter=wanted
    )
    done = released_before(layout, before_batch)
    if done and held.num_rows:
        keys = [
            f"{t}/{p}/{o}"
            for t, p, o in zip(*(held.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True)
        ]
        held = held.filter(pa.array([key not in done for key in keys]))
    return held


def without_released(layout: DataLayout, quarantine: pa.Table) -> pa.Table:
    """The rows of `quarantine` (with `topic`, `partition`, `offset`) that no batch released."""
    done = released_before(layout, 2**62)
    if not done or not quarantine.num_rows:
        return quarantine
    keys = zip(*(quarantine.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True)
    return quarantine.filter(pa.array([f"{t}/{p}/{o}" not in done for t, p, o in keys], pa.bool_()))


def released_before(layout: DataLayout, before_batch: int) -> set[str]:
    """`topic/partition/offset` of every record a batch before `before_batch` released."""
    if not layout.released.is_dir() or not any(layout.released.glob("batch_id=*/*.parquet")):
        return set()
    table = ds.dataset(layout.released, format="parquet", partitioning="hive").to_table(
        columns=["topic", "partition", "offset"], filter=ds.field("batch_id") < before_batch
    )
    return {
        f"{t}/{p}/{o}"
        for t, p, o in zip(*(table.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True)
    }


class _Decoder:
    """One event type's records: the writer schema by the frame's id, resolved against the shipped fields."""

    def __init__(self, event_type: str, writer_schemas: Mapping[int, str]) -> None:
        self.event_type = event_type
        self.fields = event_fields(event_type)
        self.required = required_fields(event_type)
        reader = json.loads(reader_schema(event_type))
        reader["fields"] = [f for f in reader["fields"] if f["name"] in self.fields]
        self.reader = fastavro.parse_schema(reader)
        self.writers = {
            schema_id: fastavro.parse_schema(_without_logical_types(json.loads(text)))
            for schema_id, text in writer_schemas.items()
        }

    def decode(self, value: bytes | None, received_ms: int) -> dict[str, Any] | None:
        """The event's fields, or None when the record does not decode or fails a check of the intake."""
        if value is None or len(value) < HEADER_SIZE or value[0] != 0:
            return None
        writer = self.writers.get(int.from_bytes(value[1:HEADER_SIZE], "big"))
        if writer is None:
            return None
        try:
            record = fastavro.schemaless_reader(io.BytesIO(value[HEADER_SIZE:]), writer, self.reader)
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError, KeyError):
            return None
        if not isinstance(record, dict) or any(record.get(name) is None for name in self.required):
            return None
        if not MIN_EVENT_TIME_MS <= record["event_time"] <= received_ms + MAX_FUTURE_MS:
            return None
        return record


def _without_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_logical_types(value) for key, value in node.items() if key != "logicalType"}
    if isinstance(node, list):
        return [_without_logical_types(item) for item in node]
    return node


ARCHIVE_SCHEMA = pa.schema(
    [
        ("event_type", pa.string()),
        ("event_id", pa.string()),
        ("ad_id", pa.string()),
        ("user_id", pa.string()),
        ("event_time", pa.int64()),
        ("received_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("value", pa.binary()),
        ("user_agent", pa.string()),
        ("ip", pa.string()),
        ("late", pa.bool_()),
        ("period_start_ms", pa.int64()),
        ("period", pa.string()),
        ("batch_id", pa.int64()),
    ]
)
assert tuple(ARCHIVE_SCHEMA.names) == ARCHIVE_COLUMNS

RELEASED_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("event_type", pa.string()),
        ("event_id", pa.string()),
        ("period", pa.string()),
        ("quarantine_batch_id", pa.int64()),
        ("batch_id", pa.int64()),
    ]
)
