"""Daily budgets (docs/billing-rules.md), case by case at explicit timestamps: the plain rule (`billing.rule.bill`)
and the DuckDB oracle (`tests.oracle.outcomes`) must both give each click its outcome."""

from __future__ import annotations

from typing import Any

import pytest

from billing.budgets import (
    BudgetChange,
    BudgetLedger,
    Candidate,
    StandingBill,
    charge_in_order,
    over_budget_standing,
    utc_day,
)
from billing.catalog import Ad, Catalog
from billing.events import Click
from tests.dense_traffic import outcomes_each_billable

MIDNIGHT = 1_767_225_600_000  # 2026-01-01T00:00:00Z
H = 3_600_000
S = 1_000
ADS = [
    Ad("cheap", "cmp-1", "adv-1", 1_000_000, "EUR"),  # 1.00 EUR
    Ad("dear", "cmp-1", "adv-1", 3_000_000, "EUR"),  # 3.00 EUR
    Ad("other", "cmp-2", "adv-1", 3_000_000, "EUR"),  # another campaign, no budget
]


def catalog(*budget: BudgetChange, paused_from: int | None = None) -> Catalog:
    ads = list(ADS)
    if paused_from is not None:
        cat = Catalog(ads).with_change(_pause("cheap", paused_from), 0, backfill=True)
        ads = list(cat)
    return Catalog(ads, budgets={"cmp-1": budget} if budget else None)


def _pause(ad_id: str, at: int) -> Any:
    from billing.catalog import AdChange

    return AdChange(ad_id, at, None)


def k(click_id: str, at: int, ad: str = "cheap", user: str | None = None, ua: str | None = None) -> Click:
    # Each click by a user of its own: no click is a duplicate of another unless a case says so.
    return Click(click_id, ad, user or f"u-{click_id}", at, ua)


T = MIDNIGHT + 10 * H
BUDGET_5 = BudgetChange(0, 5_000_000)

CASES = [
    # Two clicks that fill the budget exactly (3 + 1 + 1 = 5): all charged, the total may equal the budget.
    pytest.param(
        [k("a", T, "dear"), k("b", T + S), k("c", T + 2 * S)],
        catalog(BUDGET_5),
        {"a": "charged", "b": "charged", "c": "charged"},
        id="fits-exactly",
    ),
    # One micro over: 3 + 1 + 1 with a budget of 4.999999 leaves the third out.
    pytest.param(
        [k("a", T, "dear"), k("b", T + S), k("c", T + 2 * S)],
        catalog(BudgetChange(0, 4_999_999)),
        {"a": "charged", "b": "charged", "c": "over_budget"},
        id="one-micro-over",
    ),
    # A later, cheaper click that still fits is charged after a dearer one that did not.
    pytest.param(
        [k("a", T, "dear"), k("b", T + S, "dear"), k("c", T + 2 * S)],
        catalog(BudgetChange(0, 4_000_000)),
        {"a": "charged", "b": "over_budget", "c": "charged"},
        id="later-cheaper-fits",
    ),
    # Event-time order, not arrival order: the earlier click is charged first, whatever the list's order.
    pytest.param(
        [k("late", T + 5 * S, "dear"), k("early", T, "dear")],
        catalog(BudgetChange(0, 3_000_000)),
        {"early": "charged", "late": "over_budget"},
        id="event-time-order",
    ),
    # Raised at 14:00 (from 1 to 4), lowered at 16:00 (to 2): 10:00 charges 1 and fills the day; 13:00 is over;
    # 14:00 fits under 4 (1 + 3); 16:00 is over 2 (nothing is taken back: 4 stays charged); a cheap one at 17:00
    # still does not fit (4 + 1 > 2).
    pytest.param(
        [
            k("c10", MIDNIGHT + 10 * H),
            k("c13", MIDNIGHT + 13 * H),
            k("c14", MIDNIGHT + 14 * H, "dear"),
            k("c16", MIDNIGHT + 16 * H),
            k("c17", MIDNIGHT + 17 * H),
        ],
        catalog(
            BudgetChange(0, 1_000_000),
            BudgetChange(MIDNIGHT + 14 * H, 4_000_000, 1),
            BudgetChange(MIDNIGHT + 16 * H, 2_000_000, 2),
        ),
        {"c10": "charged", "c13": "over_budget", "c14": "charged", "c16": "over_budget", "c17": "over_budget"},
        id="raised-14-lowered-16",
    ),
    # A day spans the periods' boundaries (one total for 10:59:59 and 11:00:00) and ends at midnight UTC, where
    # the next day starts from zero.
    pytest.param(
        [
            k("a", MIDNIGHT + 11 * H - 1, "dear"),
            k("b", MIDNIGHT + 11 * H, "dear"),
            k("c", MIDNIGHT + 24 * H - 1, "dear"),
            k("d", MIDNIGHT + 24 * H, "dear"),
        ],
        catalog(BudgetChange(0, 3_000_000)),
        {"a": "charged", "b": "over_budget", "c": "over_budget", "d": "charged"},
        id="period-boundary-and-midnight",
    ),
    # Clicks at the same millisecond are taken by click id.
    pytest.param(
        [k("z", T, "dear"), k("m", T, "dear"), k("a", T, "dear")],
        catalog(BudgetChange(0, 6_000_000)),
        {"a": "charged", "m": "charged", "z": "over_budget"},
        id="same-ms-by-click-id",
    ),
    # A click on a paused ad takes no budget: the dear one after it still fits.
    pytest.param(
        [k("p", T), k("d", T + S, "dear")],
        catalog(BudgetChange(0, 3_000_000), paused_from=T - H),
        {"p": "ad_paused", "d": "charged"},
        id="paused-takes-no-budget",
    ),
    # An invalid click takes no budget either: the bot's click is not charged, and the next one fits.
    pytest.param(
        [
            k("bot", T, "dear", ua="Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"),
            k("d", T + S, "dear"),
        ],
        catalog(BudgetChange(0, 3_000_000)),
        {"bot": "known_bot", "d": "charged"},
        id="invalid-takes-no-budget",
    ),
    # Another campaign has its own day (no budget: unlimited).
    pytest.param(
        [k("a", T, "dear"), k("b", T + S, "other"), k("c", T + 2 * S, "other")],
        catalog(BudgetChange(0, 3_000_000)),
        {"a": "charged", "b": "charged", "c": "charged"},
        id="other-campaign",
    ),
    # A budget of zero charges nothing; unlimited again from 12:00 charges everything.
    pytest.param(
        [k("a", MIDNIGHT + 11 * H), k("b", MIDNIGHT + 12 * H)],
        catalog(BudgetChange(0, 0), BudgetChange(MIDNIGHT + 12 * H, None, 1)),
        {"a": "over_budget", "b": "charged"},
        id="zero-then-unlimited",
    ),
]


@pytest.mark.parametrize(("clicks", "cat", "expected"), CASES)
def test_budget_cases(clicks: list[Click], cat: Catalog, expected: dict[str, str]) -> None:
    plain, independent = outcomes_each_billable(clicks, cat)
    assert plain == expected
    assert independent == expected


def test_the_stream_decides_from_the_totals_so_far() -> None:
    # The sink's ledger continues a day from what earlier batches charged.
    ledger = BudgetLedger({("cmp-1", utc_day(T)): 4_000_000})
    budget = lambda campaign, at: 5_000_000  # noqa: E731
    assert ledger.decide(Candidate("x", "cmp-1", T, 1_000_000), budget)
    assert not ledger.decide(Candidate("y", "cmp-1", T, 1), budget)
    assert ledger.spent[("cmp-1", utc_day(T))] == 5_000_000
    charged, after = charge_in_order(
        [Candidate("b", "cmp-1", T + 1, 2), Candidate("a", "cmp-1", T, 3)], lambda c, t: 4, {("cmp-1", utc_day(T)): 0}
    )
    assert charged == {"a"} and after.spent == {("cmp-1", utc_day(T)): 3}


# What a reconciliation run takes back on a day it raises: the bills that stand, in the budget's order; 3.00 a day
# from midnight (2026-01-01), 1.00 a day from 12:00.
NOON = 1_767_268_800_000  # 2026-01-01T12:00Z
STANDING_BUDGETS = {"cmp": [BudgetChange(0, 3_000_000), BudgetChange(NOON, 1_000_000)]}


def standing(click_id: str, at: int, micros: int = 1_000_000, movable: bool = True) -> StandingBill:
    return StandingBill(click_id, "cmp", at, micros, movable)


@pytest.mark.parametrize(
    ("bills", "over"),
    [
        # Three 1.00 bills fill 3.00: nothing over.
        ([standing("a", NOON - 3), standing("b", NOON - 2), standing("c", NOON - 1)], set()),
        # A fourth, last in event time, is over; on a tie of time the larger click id is the later.
        ([standing(c, NOON - 10) for c in ("d", "a", "c", "b")], {"d"}),
        # A bill that cannot move (a closed export, a period being closed) counts first in its place, whatever.
        ([standing("late", NOON - 50, movable=False), *(standing(c, NOON - 10) for c in "abc")], {"c"}),
        # ... and counts even when it does not fit itself: every movable bill after it is over.
        ([standing("x", NOON - 60, 4_000_000, movable=False), standing("a", NOON - 10)], {"a"}),
        # A later, cheaper bill that still fits stays.
        ([standing("a", NOON - 30, 2_000_000), standing("b", NOON - 20, 2_000_000), standing("c", NOON - 10)], {"b"}),
        # The budget in force at each bill's time: 1.00 from noon, so a bill after noon finds the day full.
        ([standing("a", NOON - 10), standing("b", NOON + 10)], {"b"}),
    ],
)
def test_the_bills_a_raised_day_no_longer_lets_stand(bills: list[StandingBill], over: set[str]) -> None:
    catalog = Catalog([Ad("ad", "cmp", "adv", 1_000_000, "EUR")], budgets=STANDING_BUDGETS)
    assert over_budget_standing(bills, catalog.budget_at) == over
