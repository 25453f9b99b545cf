"""Validation and de-duplication in arrival order."""

from __future__ import annotations

import pytest

from billing.catalog import Ad, Catalog
from billing.events import Click, Impression
from billing.intake import (
    MAX_FUTURE_MS,
    MIN_EVENT_TIME_MS,
    Admission,
    Intake,
    QuarantineReason,
    Verdict,
    billable_from_arrivals,
    check_event,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = 1_000

CATALOG = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")])


def test_min_event_time_is_2000_01_01_utc() -> None:
    assert MIN_EVENT_TIME_MS == 946_684_800_000
    assert MAX_FUTURE_MS == 60 * 60 * 1000


def test_duplicate_with_same_content_changes_nothing() -> None:
    intake = Intake()
    first = intake.admit(Click("c1", "ad-1", "u1", T0), T0)
    again = intake.admit(Click("c1", "ad-1", "u1", T0), T0 + 5 * S)
    assert first == Verdict(Admission.ACCEPTED) and first.accepted
    assert again == Verdict(Admission.DUPLICATE) and not again.accepted and not again.quarantined
    assert intake.clicks == [Click("c1", "ad-1", "u1", T0)]
    assert intake.counts["accepted"] == 1
    assert intake.counts["duplicate"] == 1
    assert intake.quarantined == 0


def test_conflict_keeps_the_first_copy_and_quarantines_the_later() -> None:
    intake = Intake()
    intake.admit(Impression("i1", "ad-1", "u1", T0), T0)
    verdict = intake.admit(Impression("i1", "ad-1", "u2", T0), T0 + S)
    assert verdict == Verdict(Admission.QUARANTINED, QuarantineReason.ID_CONFLICT)
    assert verdict.quarantined
    assert intake.impressions == [Impression("i1", "ad-1", "u1", T0)]
    assert intake.counts[QuarantineReason.ID_CONFLICT] == 1
    # The first copy still stands: a third copy identical to it is a plain duplicate.
    assert intake.admit(Impression("i1", "ad-1", "u1", T0), T0 + 2 * S).kind == Admission.DUPLICATE


@pytest.mark.parametrize(
    ("event_time", "received_at", "expected"),
    [
        # Exactly 2000-01-01T00:00:00Z is the first accepted instant.
        (MIN_EVENT_TIME_MS, T0, None),
        # One millisecond before 2000 is refused.
        (MIN_EVENT_TIME_MS - 1, T0, QuarantineReason.TIME_OUT_OF_RANGE),
        # Exactly one hour after reception is the last accepted instant.
        (T0 + 3_600_000, T0, None),
        # One millisecond further is refused.
        (T0 + 3_600_001, T0, QuarantineReason.TIME_OUT_OF_RANGE),
        # Old but after 2000 is fine: lateness is the pipeline's business, not validation's.
        (T0 - 30 * 86_400_000, T0, None),
    ],
)
def test_time_bounds(event_time: int, received_at: int, expected: QuarantineReason | None) -> None:
    event = Click("c1", "ad-1", "u1", event_time)
    assert check_event(event, received_at) == expected
    verdict = Intake().admit(event, received_at)
    assert verdict.reason == expected
    assert verdict.accepted == (expected is None)


@pytest.mark.parametrize(
    "event", [Impression("i1", "ad-nope", "u1", T0), Click("c1", "ad-nope", "u1", T0)], ids=["imp", "click"]
)
def test_an_ad_the_catalog_does_not_know_is_no_bad_input(event: Impression | Click) -> None:
    # The catalog may learn the ad later (a change the stream had not seen yet): the event is kept, and its click
    # is priced by the history (docs/billing-rules.md).
    intake = Intake()
    assert intake.admit(event, T0).accepted
    assert len(intake.impressions) + len(intake.clicks) == 1
    assert intake.counts["unknown_ad"] == 0


def test_the_time_is_checked_whatever_the_ad() -> None:
    assert check_event(Click("c1", "ad-nope", "u1", 0), T0) == QuarantineReason.TIME_OUT_OF_RANGE


def test_impression_id_equal_to_a_click_id_is_not_a_conflict() -> None:
    intake = Intake()
    assert intake.admit(Impression("x1", "ad-1", "u1", T0), T0).accepted
    assert intake.admit(Click("x1", "ad-1", "u1", T0 + S), T0 + S).accepted
    assert len(intake.impressions) == 1 and len(intake.clicks) == 1
    assert intake.counts[QuarantineReason.ID_CONFLICT] == 0


def test_a_quarantined_copy_does_not_claim_the_id() -> None:
    intake = Intake()
    assert intake.admit(Click("c1", "ad-1", "u1", T0 + 2 * 3_600_000), T0).quarantined
    assert intake.admit(Click("c1", "ad-1", "u1", T0), T0).accepted


def test_reject_counts_failures_found_while_decoding() -> None:
    intake = Intake()
    verdict = intake.reject(QuarantineReason.UNDECODABLE)
    assert verdict == Verdict.quarantine(QuarantineReason.UNDECODABLE)
    intake.reject(QuarantineReason.UNKNOWN_SCHEMA)
    assert intake.counts["undecodable"] == 1 and intake.counts["unknown_schema"] == 1
    assert intake.quarantined == 2


def test_verdict_carries_a_reason_exactly_when_quarantined() -> None:
    with pytest.raises(ValueError):
        Verdict(Admission.QUARANTINED)
    with pytest.raises(ValueError):
        Verdict(Admission.ACCEPTED, QuarantineReason.UNKNOWN_AD)


def test_billable_from_arrivals_bills_what_the_intake_accepted() -> None:
    arrivals = [
        (Impression("i1", "ad-1", "u1", T0), T0),
        (Click("c1", "ad-1", "u1", T0 + 4 * S), T0 + 4 * S),
        (Click("c1", "ad-1", "u1", T0 + 4 * S), T0 + 9 * S),  # duplicate: billed once
        (Click("c1", "ad-1", "u1", T0 + 5 * S), T0 + 9 * S),  # conflict: the first copy stands
        (Click("c2", "ad-nope", "u1", T0 + 5 * S), T0 + 9 * S),  # unknown ad: accepted, not billed
        (Click("c3", "ad-1", "u1", T0 + 11 * S), T0 + 11 * S),  # outside the window: accepted, not billed
    ]
    billed, intake = billable_from_arrivals(arrivals, CATALOG)
    assert [(row.click_id, row.impression_id, row.click_time) for row in billed] == [("c1", "i1", T0 + 4 * S)]
    assert intake.counts == {
        "accepted": 4,
        "duplicate": 1,
        "undecodable": 0,
        "unknown_schema": 0,
        "missing_field": 0,
        "time_out_of_range": 0,
        "unknown_ad": 0,
        "id_conflict": 1,
    }
