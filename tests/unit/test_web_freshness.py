"""Freshness and the pipeline's status (pure): when the data was last billed, and what a person is told about it."""

from __future__ import annotations

from billing.corrections import CorrectionReason
from web.freshness import (
    AMBER,
    OK,
    RED,
    UNKNOWN,
    freshness,
    kafka_status,
    reconciliation_status,
    worst,
)
from web.reasons import REASONS, reason_explanation, reason_label

NOW = 1_767_225_600_000  # 2026-01-01T00:00Z


def test_freshness_turns_amber_then_red_past_its_limits() -> None:
    cases = [
        (NOW - 5_000, OK),  # a batch 5 s ago
        (NOW - 60_000, OK),  # exactly the limit: still fresh
        (NOW - 60_001, AMBER),
        (NOW - 300_000, AMBER),  # 5 times the limit: the last amber instant
        (NOW - 300_001, RED),
        (None, UNKNOWN),  # the job never reported
    ]
    for last, level in cases:
        assert freshness(last, NOW, amber_after_s=60).level == level, last


def test_freshness_says_when_the_data_was_last_billed_in_the_pages_time_format() -> None:
    fresh = freshness(NOW - 90_000, NOW, amber_after_s=60)
    assert fresh.text == "Delayed: data last billed at 2025-12-31 23:58:30 UTC (90 s ago)."
    assert freshness(NOW - 3_600_000, NOW, 60).text.startswith("Stale: the billing job last billed at")
    assert fresh.as_json() == {"level": AMBER, "last_batch_ms": NOW - 90_000, "age_ms": 90_000, "text": fresh.text}


def test_kafka_lag_is_amber_only_when_large_and_growing() -> None:
    assert kafka_status({"clicks": 50_000}, {"clicks": 20_000}).level == AMBER
    assert kafka_status({"clicks": 50_000}, {"clicks": 60_000}).level == OK, "large but shrinking: catching up"
    assert kafka_status({"clicks": 200}, {"clicks": 100}).level == OK, "small"
    assert kafka_status({"clicks": None}, None).level == UNKNOWN
    assert kafka_status({}, None).level == UNKNOWN


def test_reconciliation_is_red_on_an_audit_difference_and_amber_when_held_or_late() -> None:
    assert reconciliation_status(NOW - 60_000, {}, [], NOW).level == OK
    assert reconciliation_status(NOW - 60_000, {"20260101T0000Z": "held: job down"}, [], NOW).level == AMBER
    assert reconciliation_status(NOW - 3_600_000, {}, [], NOW).level == AMBER
    assert reconciliation_status(NOW - 60_000, {}, ["20260101T0000Z"], NOW).level == RED
    assert reconciliation_status(None, {}, [], NOW).level == UNKNOWN


def test_an_open_period_that_differs_is_awaiting_close_and_a_closed_one_is_red_and_named() -> None:
    waiting = reconciliation_status(NOW - 60_000, {}, [], NOW, ["20260101T1000Z"])
    assert waiting.level == OK and "awaiting close" in waiting.text and "2026-01-01 10:00 UTC" in waiting.text
    failing = reconciliation_status(NOW - 60_000, {}, ["20260101T0900Z"], NOW, ["20260101T1000Z"])
    assert failing.level == RED and "2026-01-01 09:00 UTC" in failing.text.split("awaiting")[0]


def test_the_overall_status_is_the_worst() -> None:
    assert worst([OK, OK]) == OK
    assert worst([OK, UNKNOWN]) == UNKNOWN
    assert worst([OK, AMBER, UNKNOWN]) == AMBER
    assert worst([AMBER, RED, OK]) == RED


def test_every_correction_reason_is_explained() -> None:
    assert set(REASONS) == {r.value for r in CorrectionReason}
    assert reason_label("billed_after_close") == "Billed after close"
    assert "closed" in reason_explanation("billed_after_close")
    assert reason_label("some_new_reason") == "some new reason"


def test_the_price_per_click_is_the_history_entry_in_force_at_the_time_asked() -> None:
    from billing.catalog import Ad, Catalog, PriceChange
    from web.pricing import price_per_click

    history = (PriceChange(0, 250_000), PriceChange(NOW, 400_000, 1), PriceChange(NOW + 3_600_000, None, 2))
    catalog = Catalog([Ad("a1", "c1", "adv-1", 250_000, "EUR", history)])
    assert price_per_click(catalog, "a1", NOW - 1) == 250_000
    assert price_per_click(catalog, "a1", NOW) == 400_000  # the new price from its effective time on
    assert price_per_click(catalog, "a1", NOW + 3_600_000) is None  # paused
    assert price_per_click(catalog, "nope", NOW) is None
