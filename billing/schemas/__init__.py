"""The Avro schemas of the two event types, shipped as `.avsc` files in this package, and their registry
subjects.

Subjects follow the Confluent TopicNameStrategy: `<topic>-value`.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from billing.events import OPTIONAL_FIELDS, TOPIC_OF, EventType

SUBJECTS: dict[str, str] = {"impressions": "impressions-value", "clicks": "clicks-value"}
"""The Schema Registry subject of each topic's values."""

EVENT_TYPE_OF_TOPIC: dict[str, EventType] = {"impressions": "impression", "clicks": "click"}
"""The event type carried by each topic (the inverse of `billing.events.TOPIC_OF`)."""

SCHEMA_FILES: dict[str, str] = {"impression": "impression.avsc", "click": "click.avsc"}
"""The `.avsc` file of each event type, in this package."""


def schema_text(event_type: str) -> str:
    """The Avro schema (JSON text) of `impression` or `click`, as shipped with the package."""
    try:
        name = SCHEMA_FILES[event_type]
    except KeyError:
        raise ValueError(f"unknown event type {event_type!r}; expected one of {sorted(SCHEMA_FILES)}") from None
    return files(__name__).joinpath(name).read_text(encoding="utf-8")


def schema_v1_text(event_type: str) -> str:
    """The version 1 schema of `impression` or `click`: the shipped one without the optional fields that version 2
    added (`billing.events.OPTIONAL_FIELDS`), as producers that have not deployed version 2 still write."""
    schema = json.loads(schema_text(event_type))
    schema["fields"] = [field for field in schema["fields"] if field["name"] not in OPTIONAL_FIELDS]
    return json.dumps(schema, indent=2)


def without_logical_types(node: Any) -> Any:
    """An Avro schema (parsed JSON) without its `logicalType` annotations: the binary encoding is the same, and the
    values stay raw (fastavro would otherwise turn `timestamp-millis` into a datetime, to be turned back into epoch
    ms)."""
    if isinstance(node, dict):
        return {key: without_logical_types(value) for key, value in node.items() if key != "logicalType"}
    if isinstance(node, list):
        return [without_logical_types(item) for item in node]
    return node


def subject_of(event_type: str) -> str:
    """The registry subject under which `impression` or `click` schemas are registered."""
    if event_type not in TOPIC_OF:
        raise ValueError(f"unknown event type {event_type!r}; expected one of {sorted(TOPIC_OF)}")
    return SUBJECTS[TOPIC_OF[event_type]]


def event_type_of_subject(subject: str) -> EventType:
    """`impression` or `click`, the event type whose values a subject describes; ValueError for another subject."""
    for topic, name in SUBJECTS.items():
        if name == subject:
            return EVENT_TYPE_OF_TOPIC[topic]
    raise ValueError(f"unknown schema subject {subject!r}; expected one of {sorted(SUBJECTS.values())}")
