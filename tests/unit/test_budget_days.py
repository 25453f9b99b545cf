"""A campaign's UTC day as people see it (`billing.budget_days`): the budgets in force during the day, and when the
campaign is capped."""

from __future__ import annotations

import pytest

from billing.budget_days import BudgetDay, BudgetSpan, budget_spans, campaign_day, cheapest_price, is_capped
from billing.catalog import Ad, AdChange, Catalog

DAY = 1_767_225_600_000  # 2026-01-01T00:00Z
H = 3_600_000


@pytest.mark.parametrize(
    ("budget", "figures", "cheapest", "capped"),
    [
        (None, BudgetDay(500, 10**12), 1, False),  # unlimited: never capped
        (1_000_000, BudgetDay(4, 1_000_000), 250_000, True),  # charged exactly the budget
        (1_000_000, BudgetDay(3, 900_000, 2, 500_000), 250_000, True),  # 0.10 left, the cheapest click costs 0.25
        (1_000_000, BudgetDay(3, 750_000), 250_000, False),  # 0.25 left: one more click fits exactly
        (1_000_000, BudgetDay(3, 750_001), 250_000, True),  # one micro short of one more click
        (1_000_000, BudgetDay(3, 900_000), None, False),  # no ad priced now: room left, not reached
        (0, BudgetDay(), 250_000, False),  # a budget of zero on a quiet day is not news
        (0, BudgetDay(0, 0, 3, 750_000), 250_000, True),  # ... once clicks were refused for it, it is capped
        (1_000_000, BudgetDay(0, 0), 2_000_000, False),  # nothing charged yet: the day has not reached anything
        (500_000, BudgetDay(3, 900_000), 250_000, True),  # lowered below what was charged (never taken back)
    ],
)
def test_capped(budget: int | None, figures: BudgetDay, cheapest: int | None, capped: bool) -> None:
    assert is_capped(budget, figures, cheapest) is capped


def catalog() -> Catalog:
    return (
        Catalog([Ad("ad-1", "cmp-1", "adv-1", 300_000, "EUR"), Ad("ad-2", "cmp-1", "adv-1", 200_000, "EUR")])
        .with_budget("cmp-1", DAY - 5 * H, 1_000_000, 0, backfill=True)  # the day before
        .with_budget("cmp-1", DAY + 14 * H, 2_000_000, 0, backfill=True)  # raised at 14:00
        .with_budget("cmp-1", DAY + 16 * H, 500_000, 0, backfill=True)  # lowered at 16:00
        .with_budget("cmp-1", DAY + 24 * H, None, 0, backfill=True)  # unlimited from the next midnight
    )


def test_the_budgets_in_force_during_a_day() -> None:
    assert budget_spans(catalog(), "cmp-1", DAY, DAY + 24 * H) == (
        BudgetSpan(DAY, 1_000_000),
        BudgetSpan(DAY + 14 * H, 2_000_000),
        BudgetSpan(DAY + 16 * H, 500_000),
    )
    assert budget_spans(catalog(), "cmp-1", DAY + 24 * H, DAY + 48 * H) == (BudgetSpan(DAY + 24 * H, None),)
    assert budget_spans(catalog(), "cmp-1", DAY - 48 * H, DAY - 24 * H) == (BudgetSpan(DAY - 48 * H, None),)
    assert budget_spans(catalog(), "cmp-9", DAY, DAY + 24 * H) == (BudgetSpan(DAY, None),)


def test_a_day_read_up_to_now_and_at_its_end() -> None:
    figures = BudgetDay(4, 900_000, 3, 900_000)
    at_ten = campaign_day(catalog(), "cmp-1", "2026-01-01", figures, DAY + 10 * H)
    assert at_ten.budgets == (BudgetSpan(DAY, 1_000_000),) and at_ten.budget_micros == 1_000_000
    assert at_ten.capped  # 0.10 left; the cheapest ad costs 0.20
    assert at_ten.room_micros == 100_000 and not at_ten.changed_during_day
    at_fifteen = campaign_day(catalog(), "cmp-1", "2026-01-01", figures, DAY + 15 * H)
    assert at_fifteen.budget_micros == 2_000_000 and not at_fifteen.capped  # raised: room again
    ended = campaign_day(catalog(), "cmp-1", "2026-01-01", figures, DAY + 30 * H)
    assert ended.budget_micros == 500_000 and ended.changed_during_day and ended.capped
    assert ended.room_micros == 0
    assert cheapest_price(catalog(), "cmp-1", DAY) == 200_000
    paused = catalog().with_change(AdChange("ad-2", DAY, None), 0, backfill=True)
    assert cheapest_price(paused, "cmp-1", DAY) == 300_000 and cheapest_price(paused, "cmp-9", DAY) is None
