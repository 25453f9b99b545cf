"""The Confluent wire format and the event (de)serializers, against a file registry in tmp_path."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from billing.events import Click, Impression
from billing.schemas import schema_text, subject_of
from billing.store.schema_registry import open_registry
from producers.wire import (
    MAGIC,
    EventDeserializer,
    EventSerializer,
    UnknownSchemaError,
    WireFormatError,
    event_record,
    frame,
    unframe,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

IMPRESSION = Impression("i-1", "adv-0000-cmp-000-ad-000", "u0000001", T0)
CLICK = Click("c-1", "adv-0000-cmp-000-ad-000", "u0000001", T0 + 5_000)


@pytest.fixture
def registry(tmp_path):
    return open_registry(str(tmp_path / "registry.json"))


def schemaless_body(event_type: str, record: dict) -> bytes:
    """The reference encoding, computed the plain way."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(schema_text(event_type))), record)
    return out.getvalue()


@pytest.mark.parametrize("event", [IMPRESSION, CLICK], ids=["impression", "click"])
def test_round_trip(registry, event):
    data = EventSerializer(registry).serialize(event)
    assert EventDeserializer(registry).deserialize(event.type, data) == event


@pytest.mark.parametrize("event", [IMPRESSION, CLICK], ids=["impression", "click"])
def test_exact_wire_bytes(registry, event):
    serializer = EventSerializer(registry)
    data = serializer.serialize(event)
    schema_id = registry.latest(subject_of(event.type))[0]
    assert serializer.schema_ids[event.type] == schema_id
    assert data[0] == 0 == MAGIC
    assert int.from_bytes(data[1:5], "big") == schema_id
    assert data[5:] == schemaless_body(event.type, event.to_record())


def test_both_schemas_registered_once_with_distinct_ids(registry):
    first = EventSerializer(registry).schema_ids
    again = EventSerializer(registry).schema_ids  # registering the same schemas is idempotent
    assert first == again
    assert first["impression"] != first["click"]
    assert registry.ids(subject_of("impression")) == [first["impression"]]
    assert registry.ids(subject_of("click")) == [first["click"]]


def test_event_record_is_to_record():
    assert event_record(IMPRESSION) == IMPRESSION.to_record()
    assert event_record(CLICK) == CLICK.to_record()


def test_frame_and_unframe():
    assert frame(258, b"body") == b"\x00\x00\x00\x01\x02body"
    assert unframe(b"\x00\x00\x00\x01\x02body") == (258, b"body")
    assert unframe(frame(0xFFFFFFFF, b"")) == (0xFFFFFFFF, b"")


@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing at all
        b"\x00",  # magic byte only
        b"\x00\x00\x00\x01",  # one byte short of a header
    ],
)
def test_unframe_refuses_short_data(data):
    with pytest.raises(WireFormatError, match="at least 5 bytes"):
        unframe(data)


@pytest.mark.parametrize("magic", [1, 0x7B, 0xFF])
def test_unframe_refuses_wrong_magic_byte(magic):
    with pytest.raises(WireFormatError, match="magic byte"):
        unframe(bytes([magic]) + b"\x00\x00\x00\x01body")


@pytest.mark.parametrize(
    "value",
    [
        b"\x00\x00\x01",  # shorter than a frame header
        b"\x01" + b"\x00\x00\x00\x01" + b"body",  # a wrong magic byte
        json.dumps(CLICK.to_record()).encode(),  # JSON where Avro was expected
        frame(2_000_000_000, b"\x02c"),  # a schema id the registry does not know
        "known id, body cut short",
        "known id, empty body",
    ],
)
def test_every_kind_of_bad_bytes_raises_one_wire_format_error_a_value_error_too(registry, value):
    """What a consumer catches to quarantine a record: one exception family (also a ValueError), never an
    EOFError, IndexError or KeyError of the decoder leaking through."""
    schema_id = EventSerializer(registry).schema_ids["click"]
    if value == "known id, body cut short":
        value = frame(schema_id, schemaless_body("click", CLICK.to_record())[:-3])
    elif value == "known id, empty body":
        value = frame(schema_id, b"")
    with pytest.raises(WireFormatError) as caught:
        EventDeserializer(registry).deserialize("click", value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("schema_id", [-1, 2**32])
def test_frame_refuses_ids_outside_32_bits(schema_id):
    with pytest.raises(ValueError, match="32-bit"):
        frame(schema_id, b"")


def test_deserialize_unknown_schema_id(registry):
    EventSerializer(registry)
    data = frame(999_999, schemaless_body("click", CLICK.to_record()))
    with pytest.raises(UnknownSchemaError, match="999999"):
        EventDeserializer(registry).deserialize("click", data)


def test_deserialize_body_that_does_not_decode(registry):
    schema_id = EventSerializer(registry).schema_ids["click"]
    with pytest.raises(WireFormatError, match="does not decode"):
        EventDeserializer(registry).deserialize("click", frame(schema_id, b"\x08ab"))  # string cut short


def test_deserialize_with_an_evolved_writer_schema(registry):
    """A value written with a newer, compatible schema version decodes to the event we know."""
    EventSerializer(registry)
    evolved = json.loads(schema_text("click"))
    evolved["fields"].append({"name": "referrer", "type": ["null", "string"], "default": None})
    evolved_text = json.dumps(evolved)
    schema_id = registry.register(subject_of("click"), evolved_text)
    record = {**CLICK.to_record(), "referrer": "https://example.com"}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(evolved), record)
    assert EventDeserializer(registry).deserialize("click", frame(schema_id, out.getvalue())) == CLICK


def test_serializer_reads_no_schema_per_event(registry, monkeypatch):
    """The hot path parses nothing: schemas were parsed when the serializer was built."""
    serializer = EventSerializer(registry)

    def fail(*args, **kwargs):
        raise AssertionError("parse_schema called on the hot path")

    monkeypatch.setattr("producers.wire.parse_avro_schema", fail)
    monkeypatch.setattr("producers.wire.schema_text", fail)
    clicks = [Click(f"c-{n}", "a", "u", T0 + n) for n in range(3)]
    values = [serializer.serialize(click) for click in clicks]
    monkeypatch.undo()
    # What the hot path wrote is the reference encoding, framed with the registered id.
    schema_id = serializer.schema_ids["click"]
    assert values == [frame(schema_id, schemaless_body("click", c.to_record())) for c in clicks]
