"""Campaigns' UTC days as the budget pages show them: the budgets in force (the catalog), what was charged and what
was not charged for the budget (Redis, `billing.store.budget_days`), judged by `billing.budget_days`. Reads only."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from billing.budget_days import CampaignDay, campaign_day
from billing.budgets import utc_day
from billing.store.budget_days import read_budget_days
from billing.store.redis_keys import RedisKeys
from web.readers import CatalogView


class BudgetDays:
    """Campaigns' budget days, for an advertiser's pages and the admin's campaigns capped today."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, catalog: CatalogView) -> None:
        self.client = client
        self.keys = keys
        self.catalog = catalog

    def campaign_days(
        self, campaign_ids: Sequence[str], days: Sequence[str], now_ms: int, budgeted_only: bool = True
    ) -> list[CampaignDay]:
        """The campaigns' UTC days among `days` (up to today; newest first, then by campaign): the budgets in force,
        what was charged and what was not charged for the budget. With `budgeted_only`, only the days a campaign had
        a budget or clicks over one; otherwise every day with a budget or figures. One round trip."""
        catalog = self.catalog.get()
        today = utc_day(now_ms)
        wanted = sorted((d for d in set(days) if d <= today), reverse=True)
        figures = read_budget_days(self.client, self.keys, [(d, c) for d in wanted for c in campaign_ids])
        out = []
        for day in wanted:
            for campaign_id in campaign_ids:
                found = campaign_day(catalog, campaign_id, day, figures[(day, campaign_id)], now_ms)
                budgeted = any(b.daily_budget_micros is not None for b in found.budgets)
                if budgeted or found.figures.over_clicks or (not budgeted_only and not found.figures.is_zero):
                    out.append(found)
        return out

    def today(self, now_ms: int) -> dict[str, CampaignDay]:
        """Every campaign of the catalog with a budget today or figures, today (UTC) as of `now_ms`, by campaign id:
        capped ones first, then by campaign id."""
        catalog = self.catalog.get()
        days = self.campaign_days(catalog.campaign_ids, [utc_day(now_ms)], now_ms, budgeted_only=False)
        return {d.campaign_id: d for d in sorted(days, key=lambda d: (not d.capped, d.campaign_id))}
