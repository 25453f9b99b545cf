"""`ops.bench.realtime`: the probe's own rule for the clicks it expects billed, and the traffic it sends."""

from __future__ import annotations

from billing.events import Click, Impression
from billing.rule import ATTRIBUTION_WINDOW_MS
from ops.bench.realtime import _percentile, billable, events, tries

T0 = 1_795_560_600_000


def test_a_click_is_expected_billed_within_the_window_of_an_impression_of_its_ad_and_user_bounds_included() -> None:
    shown: list[Impression | Click] = [Impression("i1", "a1", "u1", T0)]
    clicks: list[Impression | Click] = [
        Click("at-impression", "a1", "u1", T0),
        Click("at-window-end", "a1", "u1", T0 + ATTRIBUTION_WINDOW_MS),
        Click("after-window", "a1", "u1", T0 + ATTRIBUTION_WINDOW_MS + 1),
        Click("before-impression", "a1", "u1", T0 - 1),
        Click("other-user", "a1", "u2", T0 + 5),
        Click("other-ad", "a2", "u1", T0 + 5),
    ]
    assert billable(shown + clicks) == {"at-impression", "at-window-end"}


def test_the_backlog_has_clicks_in_and_out_of_the_window_so_that_a_count_can_fail() -> None:
    sent = list(events(3000, T0))
    clicks = {event.event_id for event in sent if isinstance(event, Click)}
    expected = billable(sent)
    assert len(clicks) == 1000
    assert 0 < len(expected) < len(clicks)


def test_the_last_try_differs_from_the_others_only_in_its_task_slots() -> None:
    *_, own_risk, enough_slots = tries("local[2]", 16)
    assert (own_risk.sink, own_risk.allowlist_check, own_risk.master) == ("foreach", False, "local[2]")
    assert (enough_slots.sink, enough_slots.allowlist_check, enough_slots.master) == ("foreach", False, "local[16]")


def test_percentiles_take_the_value_at_or_above_the_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [_percentile(values, q) for q in (0.5, 0.99, 1.0)] == [51.0, 100.0, 100.0]
