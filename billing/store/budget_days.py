"""Adapter: the campaigns' UTC days in Redis (`budget-day:DAY:CAMPAIGN`, written by the stream and reconciliation,
`billing.store.redis_totals`), read into `billing.budget_days` values for the web UI and the job's metrics."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from billing.budget_days import BudgetDay, CampaignDay, campaign_day, today
from billing.catalog import Catalog
from billing.store.redis_keys import RedisKeys
from billing.store.redis_totals import BUDGET_DAY_FIELDS


def queue_budget_day(pipe: Any, keys: RedisKeys, day: str, campaign_id: str) -> None:
    """Queue the read of one campaign's day on a pipeline (`budget_day_of` reads its answer)."""
    pipe.hmget(keys.budget_day(day, campaign_id), *BUDGET_DAY_FIELDS)


def budget_day_of(values: Sequence[str | bytes | None]) -> BudgetDay:
    """The answer of `queue_budget_day`."""
    return BudgetDay(*(int(v or 0) for v in values))


def read_budget_days(
    client: redis.Redis, keys: RedisKeys, pairs: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], BudgetDay]:
    """(day, campaign) -> its figures, in one round trip."""
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    pipe = client.pipeline(transaction=False)
    for day, campaign in wanted:
        queue_budget_day(pipe, keys, day, campaign)
    return {pair: budget_day_of(values) for pair, values in zip(wanted, pipe.execute(), strict=True)}


def capped_today(client: redis.Redis, keys: RedisKeys, catalog: Catalog, now_ms: int) -> list[CampaignDay]:
    """The campaigns capped today (UTC) as of `now_ms`, by campaign id: those with a budget now whose day's
    figures leave no room (`billing.budget_days`)."""
    day, _ = today(now_ms)
    budgeted = [c for c in catalog.campaign_ids if catalog.budget_at(c, now_ms) is not None]
    figures = read_budget_days(client, keys, ((day, c) for c in budgeted))
    days = [campaign_day(catalog, c, day, figures[(day, c)], now_ms) for c in budgeted]
    return [d for d in days if d.capped]
