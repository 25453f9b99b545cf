"""The Confluent wire format: byte 0, a 4-byte big-endian schema id, then the Avro binary body (fastavro).

`EventSerializer` turns `billing` events into Kafka values and `EventDeserializer` turns them back. Both sit
on the producers' hot path (tens of thousands of events a second), so schemas are parsed once and looked up
once per id, and a record is built from the event's fields directly rather than through `dataclasses.asdict`.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import fastavro
from fastavro.read import SchemaResolutionError

from billing.compatibility import reader_for_writer
from billing.events import Click, Event, EventType, Impression, event_from_record
from billing.schemas import schema_text, subject_of, without_logical_types
from billing.store.schema_registry import SchemaRegistry
from billing.store.schema_registry import UnknownSchemaError as _RegistryUnknownSchema

MAGIC = 0
"""The first byte of every Confluent-framed value."""

HEADER_SIZE = 5
"""Magic byte plus the 4-byte schema id."""

_HEADER = struct.Struct(">BI")
_EVENT_TYPES: tuple[EventType, ...] = ("impression", "click")
_FIELDS: dict[EventType, tuple[str, ...]] = {
    "impression": tuple(f.name for f in fields(Impression)),
    "click": tuple(f.name for f in fields(Click)),
}


class WireFormatError(ValueError):
    """The bytes are not a Confluent-framed value (too short, or a wrong magic byte)."""


class UnknownSchemaError(WireFormatError):
    """The frame names a schema id that the registry does not know."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A Kafka record given as bytes: bad input no event can express, sent as is to show the quarantine."""

    topic: str
    key: bytes | None
    value: bytes


def frame(schema_id: int, body: bytes) -> bytes:
    """Prefix an Avro body with the magic byte and the big-endian schema id."""
    if not 0 <= schema_id <= 0xFFFFFFFF:
        raise ValueError(f"a schema id is an unsigned 32-bit integer, got {schema_id}")
    return _HEADER.pack(MAGIC, schema_id) + body


def unframe(data: bytes) -> tuple[int, bytes]:
    """Split a framed value into (schema_id, body); WireFormatError when it is not framed."""
    if data is None or len(data) < HEADER_SIZE:
        size = "no value" if data is None else f"{len(data)} bytes"
        raise WireFormatError(f"a framed value has at least {HEADER_SIZE} bytes, got {size}")
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireFormatError(f"wrong magic byte {magic:#04x}, expected {MAGIC:#04x}")
    return schema_id, bytes(data[HEADER_SIZE:])


def parse_avro_schema(text: str) -> dict[str, Any]:
    """Parse Avro schema text with fastavro, once; the result can be passed to the reader and writer as is."""
    parsed = fastavro.parse_schema(json.loads(text))
    if not isinstance(parsed, dict):
        raise ValueError("an event schema is an Avro record")
    return parsed


def encode_body(parsed_schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """The Avro binary body of one record, without framing (what `schemaless_writer` writes)."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed_schema, record)
    return buffer.getvalue()


def event_record(event: Event) -> dict[str, Any]:
    """The Avro record of an event; the same dict as `event.to_record()`, built several times faster."""
    return {name: getattr(event, name) for name in _FIELDS[event.type]}


def with_optional_field(text: str, name: str) -> str:
    """The Avro schema `text` with one more field, an optional string with a null default: a new version that
    readers of the old one and the old one's records stay compatible with (BACKWARD and FORWARD), as a producer team
    deploys it."""
    schema = json.loads(text)
    if any(f["name"] == name for f in schema["fields"]):
        raise ValueError(f"the schema has a field {name!r} already")
    schema["fields"].append({"name": name, "type": ["null", "string"], "default": None})
    return json.dumps(schema)


class EventSerializer:
    """Serializes events to framed Avro with the schemas shipped in `billing.schemas`.

    The two schemas are registered (or found: registration is idempotent) once, when the serializer is built.
    """

    def __init__(self, registry: SchemaRegistry) -> None:
        self.schema_ids: dict[EventType, int] = {}
        self._schemas: dict[EventType, dict[str, Any]] = {}
        self._headers: dict[EventType, bytes] = {}
        for event_type in _EVENT_TYPES:
            text = schema_text(event_type)
            schema_id = registry.register(subject_of(event_type), text)
            self.schema_ids[event_type] = schema_id
            self._schemas[event_type] = parse_avro_schema(text)
            self._headers[event_type] = _HEADER.pack(MAGIC, schema_id)

    def use_version(self, registry: SchemaRegistry, event_type: EventType, text: str) -> int:
        """Register `text` as a version of `event_type`'s subject (or find it) and write that type's events with it
        from now on, as a producer that deployed the version does; its schema id."""
        schema_id = registry.register(subject_of(event_type), text)
        self.schema_ids[event_type] = schema_id
        self._schemas[event_type] = parse_avro_schema(text)
        self._headers[event_type] = _HEADER.pack(MAGIC, schema_id)
        return schema_id

    def serialize(self, event: Event, extra: Mapping[str, Any] | None = None) -> bytes:
        """The Kafka value of one event: framed Avro under its type's registered schema id. `extra` gives fields
        that the version in use adds to the event's; a field it adds and `extra` lacks takes its default."""
        event_type = event.type
        buffer = io.BytesIO(self._headers[event_type])
        buffer.seek(HEADER_SIZE)
        record = {name: getattr(event, name) for name in _FIELDS[event_type]}
        if extra:
            record = {**extra, **record}
        fastavro.schemaless_writer(buffer, self._schemas[event_type], record)
        return buffer.getvalue()


class EventDeserializer:
    """Decodes framed Avro back to events; each writer schema is fetched and parsed once per schema id.

    Values are read with the writer schema resolved against the shipped (reader) schema of the expected type,
    so events written with an older compatible schema decode too, and those of a version that renamed the record
    or a field keeping the old name as its alias (`billing.compatibility.reader_for_writer`). `timestamp-millis`
    stays an int of epoch ms.
    """

    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry
        self._writers: dict[int, dict[str, Any]] = {}
        self._readers: dict[tuple[EventType, int], dict[str, Any]] = {}
        self._shipped: dict[EventType, dict[str, Any]] = {
            event_type: json.loads(_without_logical_types(schema_text(event_type))) for event_type in _EVENT_TYPES
        }

    def deserialize(self, event_type: EventType, data: bytes) -> Event:
        """Decode one framed value of `event_type`.

        Raises WireFormatError (unframed bytes or an Avro body that does not decode), UnknownSchemaError, or
        KeyError/TypeError from `event_from_record` when a field is missing or ill-typed.
        """
        schema_id, body = unframe(data)
        writer = self._writers.get(schema_id)
        if writer is None:
            writer = self._writers[schema_id] = self._writer_schema(schema_id)
        reader = self._readers.get((event_type, schema_id))
        if reader is None:
            aliased = reader_for_writer(self._shipped[event_type], json.loads(_without_logical_types(writer["text"])))
            reader = self._readers[event_type, schema_id] = parse_avro_schema(json.dumps(aliased))
        try:
            record = fastavro.schemaless_reader(io.BytesIO(body), writer["parsed"], reader)
        except (
            EOFError,
            ValueError,
            TypeError,
            IndexError,
            UnicodeDecodeError,
            KeyError,
            SchemaResolutionError,
        ) as exc:
            raise WireFormatError(f"the Avro body under schema id {schema_id} does not decode: {exc!r}") from exc
        if not isinstance(record, dict):
            raise WireFormatError(f"schema id {schema_id} does not describe a record")
        return event_from_record(event_type, record)

    def _writer_schema(self, schema_id: int) -> dict[str, Any]:
        """{"text": the schema's text, "parsed": it parsed for fastavro}."""
        try:
            text = self._registry.schema_by_id(schema_id)
        except _RegistryUnknownSchema as exc:
            raise UnknownSchemaError(f"schema id {schema_id} is not in the registry") from exc
        return {"text": text, "parsed": parse_avro_schema(_without_logical_types(text))}


def _without_logical_types(text: str) -> str:
    """The schema text without `logicalType` annotations (`billing.schemas.without_logical_types`)."""
    return json.dumps(without_logical_types(json.loads(text)))
