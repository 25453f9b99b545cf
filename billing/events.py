"""The two event types of the contract, as plain values.

Times are epoch milliseconds, UTC. Nothing here knows about Kafka, Avro or Spark.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

EventType = Literal["impression", "click"]

TOPIC_OF: dict[str, str] = {"impression": "impressions", "click": "clicks"}
"""The Kafka topic each event type is published to."""


OPTIONAL_FIELDS: tuple[str, ...] = ("user_agent", "ip")
"""The fields of the events' version 2 that a record may lack (null defaults): what the invalid traffic rules read."""


class _EventValue:
    """What both event types do with their fields (each a frozen dataclass: its own id first, then the fields here)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]
    ad_id: str
    user_id: str
    event_time: int

    @property
    def content(self) -> tuple[str, str, int]:
        """What two copies of the id must agree on to be duplicates rather than a conflict (the required fields)."""
        return (self.ad_id, self.user_id, self.event_time)

    def to_record(self) -> dict[str, Any]:
        """The Avro record: the schema's fields and nothing else."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Impression(_EventValue):
    """An ad was shown to a user at `event_time` (epoch ms, UTC); from version 2 with the user agent and IP text."""

    impression_id: str
    ad_id: str
    user_id: str
    event_time: int
    user_agent: str | None = None
    ip: str | None = None

    @property
    def event_id(self) -> str:
        return self.impression_id

    @property
    def type(self) -> EventType:
        return "impression"


@dataclass(frozen=True, slots=True)
class Click(_EventValue):
    """A user clicked an ad at `event_time` (epoch ms, UTC); from version 2 with the user agent and IP text."""

    click_id: str
    ad_id: str
    user_id: str
    event_time: int
    user_agent: str | None = None
    ip: str | None = None

    @property
    def event_id(self) -> str:
        return self.click_id

    @property
    def type(self) -> EventType:
        return "click"


Event = Impression | Click


def event_from_record(event_type: EventType, record: dict[str, Any]) -> Event:
    """Build an event from a decoded record; raises KeyError/TypeError on a missing or wrong field."""
    if event_type not in TOPIC_OF:
        raise ValueError(f"unknown event type {event_type!r}")
    kind = Impression if event_type == "impression" else Click
    return kind(
        _str(record, f"{event_type}_id"),
        _str(record, "ad_id"),
        _str(record, "user_id"),
        _int(record, "event_time"),
        _optional_str(record, "user_agent"),
        _optional_str(record, "ip"),
    )


def _str(record: dict[str, Any], name: str) -> str:
    value = record[name]
    if not isinstance(value, str):
        raise TypeError(f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def _int(record: dict[str, Any], name: str) -> int:
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"field {name!r} must be an integer (epoch ms), got {type(value).__name__}")
    return value


def _optional_str(record: dict[str, Any], name: str) -> str | None:
    value = record.get(name)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"field {name!r} must be a string or null, got {type(value).__name__}")
    return value
