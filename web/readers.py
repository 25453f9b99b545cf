"""What every reader of the web UI shares: ids it may look up, the ad catalog as of its latest version, and the
periods and figures' hashes in Redis that each page reads (`PeriodReader`), with the fields read into `web.model`.

The readers, one a module, each read one thing and never write: an advertiser's figures
(`web.advertiser_figures`), corrections (`web.correction_lists`), budget days (`web.budget_days`), finance's figures
(`web.finance_figures`), the export folder (`web.exports`) and the streaming job's health (`web.job_health`). Each
page costs one or two Redis round trips (pipelines), whatever the number of periods and ads; nothing is computed
here that the streaming job or reconciliation did not already write.

Keys read (named by `billing.store.redis_keys.RedisKeys`, whose docstring has the whole layout and who writes each
key): the periods, open and closed; who has totals in a period; provisional totals and the signed sums of
corrections per advertiser, campaign and ad; each advertiser's list of corrections; late, clock-ahead and
quarantined events; the job's health records and heartbeat; the last reconciliation run and the last audit.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import redis

from billing.catalog import Catalog, Unbillable
from billing.periods import Periods
from billing.store.catalog_db import CatalogDatabase
from billing.store.redis_keys import RedisKeys
from web.model import NOT_CHARGED_REASONS, Billed, EventCounts, Figures, NotCharged, Period, PeriodBill, UnbilledCounts

SERIES_PERIODS = 72
"""Periods in the chart and the per-period tables: three days of hours."""

UNBILLED_REASONS = (Unbillable.AD_PAUSED.value, Unbillable.UNKNOWN_AD.value)
"""The fields of an unbilled hash, in the order `UnbilledCounts` takes them."""

NOT_CHARGED_FIELDS = tuple(name for r in NOT_CHARGED_REASONS for name in (r, f"{r}:micros"))
"""The fields of a not-charged hash (`REASON` clicks, `REASON:micros`), in the order `NotCharged` takes them."""

AD_TOTALS_FIELDS = ("clicks", "micros", "campaign", "advertiser")
"""The fields read of an ad's totals: its figures, then the campaign and advertiser the stream recorded."""

_log = logging.getLogger(__name__)

_PERIOD_KEY = re.compile(r"\d{8}T\d{4}Z", re.ASCII)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}", re.ASCII)


def is_period_key(text: str) -> bool:
    return bool(_PERIOD_KEY.fullmatch(text))


def is_id(text: str) -> bool:
    """Plausible advertiser, campaign, ad or correction id: anything else is not looked up at all."""
    return bool(_ID.fullmatch(text))


class CatalogView:
    """The ad catalog, for currencies and which ad or campaign belongs to whom: its store's catalog as of the
    latest version (`billing.store.catalog_db`), or an empty one while the database holds none."""

    def __init__(self, store: CatalogDatabase | None) -> None:
        self.store = store
        self._empty = Catalog([])

    @property
    def behind(self) -> str | None:
        """Why the catalog shown may be behind the database (it cannot be reached), None when it is the latest."""
        return None if self.store is None else self.store.behind

    def get(self) -> Catalog:
        if self.store is None:
            return self._empty
        try:
            return self.store.current()
        except ValueError as exc:  # no catalog yet, or no database ever reached
            _log.warning("no ad catalog to show: %s", exc)
            return self._empty

    def currency(self, advertiser_id: str) -> str:
        """The one currency the advertiser bills in (the catalog refuses a second); empty when the catalog does not
        know the advertiser."""
        return self.get().currency_of(advertiser_id) or ""


class PeriodReader:
    """The periods in Redis (under one key prefix), who has totals in each, and the figures' hashes of an
    advertiser (`adv`), campaign (`cmp`) or ad (`ad`) in a period, queued on a pipeline for the readers that show
    them."""

    def __init__(self, client: redis.Redis, prefix: str, catalog: CatalogView, length: Periods | None = None) -> None:
        self.client = client
        self.keys = RedisKeys(prefix)
        self.catalog = catalog
        self.length = length or Periods()

    def pipeline(self) -> Any:
        return self.client.pipeline(transaction=False)

    def periods(self) -> list[Period]:
        """Every period with totals or closed by reconciliation, oldest first."""
        pipe = self.pipeline()
        self.queue_periods(pipe)
        return self.periods_from(pipe.execute())

    def between(self, start_ms: int, end_ms: int) -> list[Period]:
        """The periods that start in [start_ms, end_ms), oldest first."""
        return [p for p in self.periods() if start_ms <= p.start_ms < end_ms]

    def periods_of(self, advertiser_id: str) -> list[Period]:
        """The periods an advertiser may see listed: those with its own totals, and the closed ones."""
        periods = self.periods()
        pipe = self.pipeline()
        for p in periods:
            pipe.sismember(self.keys.period_advertisers(p.key), advertiser_id)
        own = pipe.execute() if periods else []
        return [p for p, mine in zip(periods, own, strict=True) if p.closed or mine]

    def known_advertisers(self) -> list[str]:
        """Advertisers with totals in any period, or in the catalog."""
        periods = self.periods()
        keys = [self.keys.period_advertisers(p.key) for p in periods]
        found: set[str] = set(self.client.sunion(keys)) if keys else set()  # type: ignore[arg-type]
        return sorted(found | set(self.catalog.get().advertiser_ids))

    def advertisers_in(self, periods: Sequence[Period]) -> list[set[str]]:
        """Who has totals in each of the periods: one round trip."""
        pipe = self.pipeline()
        for p in periods:
            pipe.smembers(self.keys.period_advertisers(p.key))
        return [set(found) for found in pipe.execute()] if periods else []

    def selected(self, periods: list[Period], key: str | None) -> Period | None:
        """The period asked for (default: the latest); a well-formed period that holds no data is an empty open
        period, shown with zero spend (the key was checked by `web.guards.period_arg`)."""
        if key is None:
            return periods[-1] if periods else None
        return next((p for p in periods if p.key == key), None) or Period(key, self.length.parse_key(key), False)

    # Queued on a pipeline, read back in the same order --------------------------------------------------------
    def queue_periods(self, pipe: Any) -> None:
        """The periods with totals, then the closed ones (`periods_from` reads the two results)."""
        pipe.zrange(self.keys.periods(), 0, -1, withscores=True)
        pipe.zrange(self.keys.closed_periods(), 0, -1, withscores=True)

    def periods_from(self, results: Sequence[Any]) -> list[Period]:
        billed, closed = results[0], results[1]
        closed_keys = {key for key, _ in closed}
        starts = {key: int(score) for key, score in (*billed, *closed)}
        return [Period(key, start, key in closed_keys) for key, start in sorted(starts.items(), key=lambda kv: kv[1])]

    def queue_billed(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The totals, then the corrections' sums (`billed_of` reads the two results)."""
        pipe.hmget(self.keys.totals(period, level, ident), "clicks", "micros")
        pipe.hmget(self.keys.corrections(period, level, ident), "clicks", "micros")

    def queue_charges(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The totals and corrections' sums, then the clicks not charged (`charges_of` reads the three results)."""
        self.queue_billed(pipe, period, level, ident)
        self.queue_not_charged(pipe, period, level, ident)

    def queue_owned_charges(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The totals and corrections' sums, the advertiser the stream recorded, then the clicks not charged
        (`owned_charges_of` reads the four results)."""
        self.queue_billed(pipe, period, level, ident)
        pipe.hget(self.keys.totals(period, level, ident), "advertiser")
        self.queue_not_charged(pipe, period, level, ident)

    def queue_ad(self, pipe: Any, period: str, ad_id: str) -> None:
        """An ad's totals (`AD_TOTALS_FIELDS`) and corrections' sums (`queue_counts` follows where counts are
        shown)."""
        pipe.hmget(self.keys.totals(period, "ad", ad_id), *AD_TOTALS_FIELDS)
        pipe.hmget(self.keys.corrections(period, "ad", ad_id), "clicks", "micros")

    def queue_counts(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The late, then the clock-ahead events, then the unbilled clicks, then the clicks not charged of an
        advertiser (`adv`) or ad (`ad`) in a period."""
        pipe.hmget(self.keys.late(period, level, ident), "impressions", "clicks")
        pipe.hmget(self.keys.clock_ahead(period, level, ident), "impressions", "clicks")
        pipe.hmget(self.keys.unbilled(period, level, ident), *UNBILLED_REASONS)
        self.queue_not_charged(pipe, period, level, ident)

    def queue_not_charged(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The priced clicks not charged of an advertiser, campaign or ad in a period, per reason (`not_charged_of`)."""
        pipe.hmget(self.keys.not_charged(period, level, ident), *NOT_CHARGED_FIELDS)

    def period_bill(self, period: Period, level: str, ident: str) -> PeriodBill:
        """One period's figures and counts of an advertiser or ad: one round trip."""
        pipe = self.pipeline()
        self.queue_billed(pipe, period.key, level, ident)
        self.queue_counts(pipe, period.key, level, ident)
        return bill_of(period, iter(pipe.execute()))


def bill_of(period: Period, results: Any) -> PeriodBill:
    """A period's figures and counts from six results (`queue_billed`, then `queue_counts`, or `queue_ad`'s two then
    `queue_counts`)."""
    return PeriodBill(
        period,
        Billed(figures_of(next(results)), figures_of(next(results))),
        counts_of(next(results)),
        counts_of(next(results)),
        unbilled_of(next(results)),
        not_charged_of(next(results)),
    )


def billed_of(results: Any) -> Billed:
    """The figures from `queue_billed`'s two results."""
    return Billed(figures_of(next(results)), figures_of(next(results)))


def charges_of(results: Any) -> tuple[Billed, NotCharged]:
    """`queue_charges`' three results: the figures and the clicks not charged."""
    return billed_of(results), not_charged_of(next(results))


def owned_charges_of(results: Any, advertiser_id: str | None) -> tuple[Billed, NotCharged]:
    """`queue_owned_charges`' four results: the figures and clicks not charged, both zero where the stream recorded
    an advertiser other than `advertiser_id` (the id named another's campaign or ad in that period; None: whoever)."""
    billed, owner, not_charged = billed_of(results), next(results), not_charged_of(next(results))
    mine = advertiser_id is None or owner in (None, advertiser_id)
    return (billed, not_charged) if mine else (Billed(), NotCharged())


def figures_of(values: Sequence[str | None]) -> Figures:
    return Figures(int(values[0] or 0), int(values[1] or 0))


def counts_of(values: Sequence[str | None]) -> EventCounts:
    return EventCounts(int(values[0] or 0), int(values[1] or 0))


def unbilled_of(values: Sequence[str | None]) -> UnbilledCounts:
    """The `UNBILLED_REASONS` fields of an unbilled hash, in that order."""
    return UnbilledCounts(int(values[0] or 0), int(values[1] or 0))


def not_charged_of(values: Sequence[str | None]) -> NotCharged:
    """The `NOT_CHARGED_FIELDS` of a not-charged hash, in that order."""
    numbers = [int(v or 0) for v in values]
    return NotCharged(*(Figures(numbers[2 * i], numbers[2 * i + 1]) for i in range(len(NOT_CHARGED_REASONS))))


def json_field(value: str | None, default: Any) -> Any:
    if value is None or value == "None":
        return default
    try:
        return json.loads(value)
    except ValueError:
        return default


def int_field(value: str | None) -> int | None:
    if value is None or value in ("", "None", "null"):
        return None
    try:
        return int(value)  # exact: money passes 2^53
    except ValueError:
        pass
    try:
        return int(float(value))
    except ValueError:
        return None
