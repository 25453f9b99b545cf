"""What the simulator sends, one record at a time in send order (`Arrival`): an event or raw bad input, what it is
to the pipeline (`ArrivalKind`), how it was delayed (`Timing`) and what invalid traffic it was made for (`Made`).
Shared by the simulator (`producers.simulator`), its ground truth (`producers.ground_truth`) and the publisher."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from billing.events import Event
from billing.intake import QuarantineReason
from producers.wire import RawRecord


class Made(StrEnum):
    """What the simulator made an event for, beyond ordinary traffic (`Arrival.made`)."""

    CRAWLER = "crawler"
    """From a known crawler (its user agent is an example of the crawler list): rule `known_bot`."""
    EXCLUDED_IP = "excluded_ip"
    """From an address in a range of `EXCLUDED_RANGES`: rule `excluded_ip` when the range is in force then."""
    FLOOD = "flood"
    """Of a flood's user: rule `click_flood`."""
    DOUBLE_CLICK = "double_click"
    """The second click of a double click, a few hundred ms after the first: rule `duplicate_click`."""
    LATE_EARLIER = "late_earlier"
    """A click that arrives late with an event time up to 10 s before a click of the same user and ad already sent."""
    MADE_DUPLICATE = "made_duplicate"
    """The click sent in order that a `LATE_EARLIER` click makes a `duplicate_click`."""


class ArrivalKind(StrEnum):
    """What an arrival is to the pipeline."""

    EVENT = "event"
    """A valid event, first copy."""
    DUPLICATE = "duplicate"
    """An exact re-send of an earlier valid event."""
    BAD = "bad"
    """Bad input: `expected_reason` says why the pipeline must quarantine it."""


class Timing(StrEnum):
    """How an arrival relates to its event time."""

    IN_ORDER = "in_order"
    OUT_OF_ORDER = "out_of_order"
    LATE = "late"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One record to send, in send order: an event, or raw bytes for bad input that no event can express."""

    position: int
    """0-based place in the send order."""
    arrival_ms: int
    """Simulated receive time on the event-time line (>= event_time for valid events)."""
    item: Event | RawRecord
    kind: ArrivalKind
    timing: Timing = Timing.IN_ORDER
    """For events and their duplicates: how the original was delayed."""
    expected_reason: QuarantineReason | None = None
    made: Made | None = None
    """For events and their duplicates: what invalid traffic the simulator made the event for; None: ordinary."""

    @property
    def event(self) -> Event | None:
        """The event, or None for a raw record."""
        return None if isinstance(self.item, RawRecord) else self.item

    @property
    def raw(self) -> RawRecord | None:
        """The raw record, or None for an event."""
        return self.item if isinstance(self.item, RawRecord) else None
