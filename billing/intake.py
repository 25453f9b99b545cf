"""Validation and de-duplication of decoded events, in arrival order: what the pipeline does before the rule.

Decoding (Confluent framing, schema ids, required fields) happens in the adapters; they report those failures
with `Intake.reject`. An event id claims its slot only once an event with it is accepted: a quarantined event
does not make a later, valid copy a conflict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from billing.catalog import Catalog
from billing.events import Click, Event, EventType, Impression
from billing.rule import BillableClick, bill

MIN_EVENT_TIME_MS = 946_684_800_000
"""2000-01-01T00:00:00Z: an earlier event_time is refused."""

MAX_FUTURE_MS = 3_600_000
"""An event_time more than this far after the moment the event was received is refused."""

QUARANTINE_VALUE_LIMIT = 16_384
"""The largest record, in bytes, whose raw bytes the quarantine table and topic keep. A larger one is kept as its size
(`value_size`) and SHA-256 (`value_sha256`, hex) with a null `value`; the record itself stays in Kafka at its topic,
partition and offset for the topic's retention. An event of the shipped schemas is a few hundred bytes: anything
near this size is junk, and a batch of junk records of up to a megabyte each (the broker's limit) would otherwise
be carried whole to the driver and sent on."""


class QuarantineReason(StrEnum):
    """Why an event went to quarantine instead of the rule."""

    UNDECODABLE = "undecodable"
    """The bytes are not Confluent-framed Avro."""
    UNKNOWN_SCHEMA = "unknown_schema"
    """The schema id in the frame is not known to the registry."""
    MISSING_FIELD = "missing_field"
    """The Avro body decoded, but a required field is missing, null or of the wrong type."""
    TIME_OUT_OF_RANGE = "time_out_of_range"
    """event_time is before 2000-01-01 or more than one hour after the event was received."""
    UNKNOWN_AD = "unknown_ad"
    """Earlier versions quarantined events on ads the catalog did not know. Such events are valid now (the catalog may
    learn the ad later, docs/billing-rules.md): kept, and counted as `billing.catalog.Unbillable` when a click has no
    price. The reason stays so that quarantine rows written before read back."""
    ID_CONFLICT = "id_conflict"
    """An event of this type and id, with other content, was accepted earlier; the first copy stands."""


class Admission(StrEnum):
    """What happened to an arriving event."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    QUARANTINED = "quarantined"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of admitting one event; `reason` is set exactly when the event was quarantined."""

    kind: Admission
    reason: QuarantineReason | None = None

    def __post_init__(self) -> None:
        if (self.kind == Admission.QUARANTINED) != (self.reason is not None):
            raise ValueError("a verdict carries a reason exactly when it quarantines")

    @property
    def accepted(self) -> bool:
        return self.kind == Admission.ACCEPTED

    @property
    def quarantined(self) -> bool:
        return self.kind == Admission.QUARANTINED

    @classmethod
    def quarantine(cls, reason: QuarantineReason) -> Verdict:
        return cls(Admission.QUARANTINED, reason)


ACCEPTED = Verdict(Admission.ACCEPTED)
DUPLICATE = Verdict(Admission.DUPLICATE)


def check_event(event: Event, received_at_ms: int) -> QuarantineReason | None:
    """Why a decoded event must be quarantined (its time out of range), or None if valid. An ad the catalog does
    not know is no reason: the click is kept, and priced by the catalog's history (`billing.catalog`)."""
    if not MIN_EVENT_TIME_MS <= event.event_time <= received_at_ms + MAX_FUTURE_MS:
        return QuarantineReason.TIME_OUT_OF_RANGE
    return None


class Intake:
    """Stateful admission of decoded events in arrival order.

    Order of the checks for one event: an identical copy of an accepted event is a DUPLICATE (whatever its
    receive time); otherwise `check_event` may quarantine it; otherwise an accepted event with the same type
    and id makes it an ID_CONFLICT; otherwise it is ACCEPTED.
    """

    def __init__(self) -> None:
        self.impressions: list[Impression] = []
        self.clicks: list[Click] = []
        self.counts: dict[str, int] = {kind.value: 0 for kind in (Admission.ACCEPTED, Admission.DUPLICATE)}
        self.counts.update({reason.value: 0 for reason in QuarantineReason})
        self._accepted: dict[tuple[EventType, str], Event] = {}

    def admit(self, event: Event, received_at_ms: int) -> Verdict:
        """Admit one decoded event received at `received_at_ms` (epoch ms, UTC)."""
        key = (event.type, event.event_id)
        earlier = self._accepted.get(key)
        if earlier is not None and earlier.content == event.content:
            return self._count(DUPLICATE)
        reason = check_event(event, received_at_ms)
        if reason is not None:
            return self.reject(reason)
        if earlier is not None:
            return self.reject(QuarantineReason.ID_CONFLICT)
        self._accepted[key] = event
        if isinstance(event, Impression):
            self.impressions.append(event)
        else:
            self.clicks.append(event)
        return self._count(ACCEPTED)

    def reject(self, reason: QuarantineReason) -> Verdict:
        """Count an event quarantined for `reason`, such as one that failed to decode before `admit`."""
        return self._count(Verdict.quarantine(reason))

    @property
    def quarantined(self) -> int:
        """How many events went to quarantine, all reasons together."""
        return sum(self.counts[reason.value] for reason in QuarantineReason)

    def _count(self, verdict: Verdict) -> Verdict:
        self.counts[(verdict.reason or verdict.kind).value] += 1
        return verdict


def billable_from_arrivals(
    arrivals: Iterable[tuple[Event, int]], catalog: Catalog
) -> tuple[list[BillableClick], Intake]:
    """Admit (event, received_at_ms) pairs in order, then apply the rule to what was accepted."""
    intake = Intake()
    for event, received_at_ms in arrivals:
        intake.admit(event, received_at_ms)
    return bill(intake.impressions, intake.clicks, catalog).charged, intake
