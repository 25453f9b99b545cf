"""The shipped Avro schemas match the contract and the event classes."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import fastavro
import pytest

from billing.events import TOPIC_OF, Click, Impression, event_from_record
from billing.schemas import EVENT_TYPE_OF_TOPIC, SUBJECTS, schema_text, schema_v1_text, subject_of

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

EVENTS = {"impression": Impression("i1", "ad-1", "u1", T0), "click": Click("c1", "ad-1", "u1", T0 + 5_000)}


@pytest.mark.parametrize(("event_type", "id_field"), [("impression", "impression_id"), ("click", "click_id")])
def test_schema_fields_are_the_contract(event_type: str, id_field: str) -> None:
    schema = json.loads(schema_text(event_type))
    assert schema["type"] == "record"
    assert schema["name"] == event_type.capitalize()
    assert schema["namespace"] == "adbill.events"
    assert schema["doc"]
    fields = {f["name"]: f["type"] for f in schema["fields"]}
    assert fields == {
        id_field: "string",
        "ad_id": "string",
        "user_id": "string",
        "event_time": {"type": "long", "logicalType": "timestamp-millis"},
        # Version 2: optional, with null defaults, so records of version 1 stay valid (docs/billing-rules.md, Events).
        "user_agent": ["null", "string"],
        "ip": ["null", "string"],
    }
    assert [f.get("default", "none") for f in schema["fields"]][-2:] == [None, None]
    assert all(f["doc"] for f in schema["fields"])
    version_1 = json.loads(schema_v1_text(event_type))
    assert [f["name"] for f in version_1["fields"]] == [id_field, "ad_id", "user_id", "event_time"]


@pytest.mark.parametrize("event_type", ["impression", "click"])
def test_an_event_round_trips_through_the_schema(event_type: str) -> None:
    parsed = fastavro.parse_schema(json.loads(schema_text(event_type)))
    event = EVENTS[event_type]
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, event.to_record())
    buffer.seek(0)
    # fastavro reads timestamp-millis back as an aware UTC datetime at the same millisecond.
    record = fastavro.schemaless_reader(buffer, parsed, parsed, return_record_name=False)
    assert record["event_time"] == datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=event.event_time - T0)
    record["event_time"] = event.event_time
    assert event_from_record(event_type, record) == event


def test_subjects_and_topics() -> None:
    assert SUBJECTS == {"impressions": "impressions-value", "clicks": "clicks-value"}
    assert {topic: event_type for event_type, topic in TOPIC_OF.items()} == EVENT_TYPE_OF_TOPIC
    assert subject_of("click") == "clicks-value"
    assert subject_of("impression") == "impressions-value"


def test_unknown_event_type() -> None:
    with pytest.raises(ValueError, match="unknown event type"):
        schema_text("clicks")
    with pytest.raises(ValueError, match="unknown event type"):
        subject_of("view")
