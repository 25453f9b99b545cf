"""A campaign's UTC day as people see it (docs/billing-rules.md, "Budgets"): the budget in force, what was charged and
what was not charged for the budget, and whether the campaign is capped.

Pure: the day's figures (`BudgetDay`) are what the stream and reconciliation keep in Redis
(`billing.store.budget_days` reads them); the budgets are the catalog's history (`Catalog.budget_history`).

A campaign is **capped** on a day when it has a budget then and what the day charged leaves no room: the charged
total has reached the budget (after at least one click was charged or refused for it, so a budget of zero on a quiet
day is not news), or the room left is smaller than one click at the cheapest price the campaign's ads have then, so
no ad of it can be charged again that day. Raising the budget un-caps it; the alert on a campaign capped before noon
UTC reads this (`ops/alerts/adbill.rules.yml`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from billing.budgets import day_start, parse_day, utc_day
from billing.catalog import Catalog
from billing.periods import DAY_MS


@dataclass(frozen=True, slots=True)
class BudgetDay:
    """A campaign's clicks and micros on one UTC day: charged, and not charged for the budget (`over_budget`)."""

    charged_clicks: int = 0
    charged_micros: int = 0
    over_clicks: int = 0
    over_micros: int = 0

    @property
    def is_zero(self) -> bool:
        return not (self.charged_clicks or self.charged_micros or self.over_clicks or self.over_micros)


@dataclass(frozen=True, slots=True)
class BudgetSpan:
    """A daily budget in force from `start_ms` (the day's midnight for the one in force when the day began)."""

    start_ms: int
    daily_budget_micros: int | None
    """None: unlimited."""


@dataclass(frozen=True, slots=True)
class CampaignDay:
    """One campaign's UTC day: the budgets in force during it (up to now for today), its figures, and whether it is
    capped (at the day's end, or now)."""

    campaign_id: str
    day: str
    day_start_ms: int
    budgets: tuple[BudgetSpan, ...]
    figures: BudgetDay
    capped: bool

    @property
    def budget_micros(self) -> int | None:
        """The budget in force at the day's end (today: now); None for unlimited."""
        return self.budgets[-1].daily_budget_micros if self.budgets else None

    @property
    def changed_during_day(self) -> bool:
        return len(self.budgets) > 1

    @property
    def room_micros(self) -> int | None:
        """What the budget in force still allows that day (never below 0); None when unlimited."""
        budget = self.budget_micros
        return None if budget is None else max(0, budget - self.figures.charged_micros)


def is_capped(budget_micros: int | None, figures: BudgetDay, cheapest_price: int | None) -> bool:
    """Whether a day with `figures` is capped under `budget_micros` (None: unlimited, never capped), the cheapest
    price of one click of the campaign's ads being `cheapest_price` (None: no ad priced)."""
    if budget_micros is None:
        return False
    room = budget_micros - figures.charged_micros
    if room <= 0:
        return figures.charged_clicks > 0 or figures.over_clicks > 0
    return figures.charged_clicks > 0 and cheapest_price is not None and cheapest_price > room


def cheapest_price(catalog: Catalog, campaign_id: str, at_ms: int) -> int | None:
    """The lowest price of one click among the campaign's ads live at `at_ms`; None when none is."""
    prices = []
    for ad in catalog.ads_of_campaign(campaign_id):
        price = ad.price_at(at_ms)
        if isinstance(price, int) and not isinstance(price, bool):
            prices.append(price)
    return min(prices, default=None)


def budget_spans(catalog: Catalog, campaign_id: str, start_ms: int, end_ms: int) -> tuple[BudgetSpan, ...]:
    """The budgets in force from `start_ms` to `end_ms` (exclusive), oldest first: the one in force at `start_ms`,
    then each change within."""
    history = catalog.budget_history(campaign_id)
    starts = [b.effective_from for b in history]
    index = bisect_right(starts, start_ms) - 1
    spans = [BudgetSpan(start_ms, history[index].daily_budget_micros if index >= 0 else None)]
    for entry in history[index + 1 :]:
        if entry.effective_from >= end_ms:
            break
        if spans[-1].start_ms == entry.effective_from:
            spans[-1] = BudgetSpan(entry.effective_from, entry.daily_budget_micros)
        else:
            spans.append(BudgetSpan(entry.effective_from, entry.daily_budget_micros))
    return tuple(spans)


def campaign_day(catalog: Catalog, campaign_id: str, day: str, figures: BudgetDay, now_ms: int) -> CampaignDay:
    """The campaign's day `day` (`2026-11-25`) with its figures, as of `now_ms`: a day that has not ended is read up
    to now."""
    start = parse_day(day)
    end = min(start + DAY_MS, max(start + 1, now_ms + 1))
    spans = budget_spans(catalog, campaign_id, start, end)
    last = end - 1
    capped = is_capped(spans[-1].daily_budget_micros, figures, cheapest_price(catalog, campaign_id, last))
    return CampaignDay(campaign_id, day, start, spans, figures, capped)


def today(now_ms: int) -> tuple[str, int]:
    """The UTC day of `now_ms` and its midnight."""
    return utc_day(now_ms), day_start(now_ms)
