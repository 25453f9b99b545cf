"""The web UI's adapter: reads Redis and the export folder into the plain values of `web.model`.

Reads only, never writes. Each page costs one or two Redis round trips (pipelines), whatever the number of periods
and ads; nothing is computed here that the streaming job or reconciliation did not already write.

Keys read (named by `billing.store.redis_keys.RedisKeys`, whose docstring has the whole layout and who writes each
key): the periods, open and closed; who has totals in a period; provisional totals and the signed sums of
corrections per advertiser, campaign and ad; each advertiser's list of corrections; late, clock-ahead and
quarantined events; the job's health records and heartbeat; the last reconciliation run and the last audit.

Exports: `EXPORTS/PERIOD/{billing.parquet,billing.csv,manifest.json}`; a folder counts once its manifest exists.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from billing.budget_days import CampaignDay, campaign_day
from billing.budgets import utc_day
from billing.catalog import Catalog, Unbillable
from billing.corrections import Correction
from billing.intake import QuarantineReason
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.budget_days import read_budget_days
from billing.store.catalog_db import CatalogDatabase
from billing.store.export_files import (
    CSV_FILE,
    MANIFEST_FILE,
    NOT_CHARGED_FILE,
    PARQUET_FILE,
    SUMS_FILE,
    Manifest,
    read_manifest,
)
from billing.store.not_charged_clicks import NotChargedClick, not_charged_clicks
from billing.store.part_status import read_status
from billing.store.redis_keys import RedisKeys
from web.model import (
    NOT_CHARGED_REASONS,
    AdDetail,
    AdLine,
    AdvertiserLine,
    Audit,
    Billed,
    CampaignDetail,
    CampaignLine,
    ClockAheadLine,
    CorrectionPage,
    Dashboard,
    EventCounts,
    Figures,
    Finance,
    FinancePeriod,
    FinanceRange,
    Health,
    NotCharged,
    Period,
    PeriodBill,
    QueryHealth,
    Reconciliation,
    UnbilledCounts,
    UnbilledLine,
    consumer_lag,
    not_charged_by_currency,
    totals_by_currency,
)

EXPORT_FILES = (PARQUET_FILE, CSV_FILE, NOT_CHARGED_FILE, MANIFEST_FILE, SUMS_FILE)
"""The files of an export folder (`billing.store.export_files.write_export`), the only names a download may ask for;
`not_charged.parquet` is there when the period's clicks not charged were exported with it."""

SERIES_PERIODS = 72
"""Periods in the chart and the per-period tables: three days of hours."""

QUERY_NAMES = ("billing",)
"""The streaming job's named queries (`attribution.job`), whose health records the admin sees."""

HEALTH_HISTORY = 60
"""Batches of each query whose durations the health page shows."""

LAG_LOOKBACK = 10
"""How many batches back the health page looks to tell a growing consumer lag."""

UNBILLED_REASONS = (Unbillable.AD_PAUSED.value, Unbillable.UNKNOWN_AD.value)
"""The fields of an unbilled hash, in the order `UnbilledCounts` takes them."""

NOT_CHARGED_FIELDS = tuple(name for r in NOT_CHARGED_REASONS for name in (r, f"{r}:micros"))
"""The fields of a not-charged hash (`REASON` clicks, `REASON:micros`), in the order `NotCharged` takes them."""

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


class BillingReader:
    """Everything the pages show, read from Redis (under one key prefix) and the export folder."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        exports_dir: Path,
        catalog: CatalogView,
        period_length: Periods | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.exports_dir = exports_dir
        self.layout = DataLayout(exports_dir.parent)
        """The data folder: `exports_dir` is its `exports` (`web.app.exports_dir`)."""
        self.catalog = catalog
        self.keys = RedisKeys(prefix)
        self.period_length = period_length or Periods()

    # Periods and advertisers ---------------------------------------------------------------------------------
    def periods(self) -> list[Period]:
        """Every period with totals or closed by reconciliation, oldest first."""
        pipe = self.client.pipeline(transaction=False)
        self._queue_periods(pipe)
        return self._periods_of(pipe.execute())

    def periods_of(self, advertiser_id: str) -> list[Period]:
        """The periods an advertiser may see listed: those with its own totals, and the closed ones."""
        periods = self.periods()
        pipe = self.client.pipeline(transaction=False)
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

    def currency(self, advertiser_id: str) -> str:
        """The one currency the advertiser bills in (the catalog refuses a second); empty when the catalog does not
        know the advertiser."""
        return self.catalog.get().currency_of(advertiser_id) or ""

    # An advertiser's pages -------------------------------------------------------------------------------------
    def dashboard(self, advertiser_id: str, period_key: str | None) -> Dashboard | None:
        """The advertiser's selected period (default: the latest) in detail, and its recent periods.

        None when `period_key` names no period. Two round trips: periods and who has totals, then every figure.
        """
        pipe = self.client.pipeline(transaction=False)
        self._queue_periods(pipe)
        if period_key is not None:
            pipe.smembers(self.keys.period_campaigns(period_key, advertiser_id))
            pipe.smembers(self.keys.period_ads(period_key, advertiser_id))
        first = pipe.execute()
        periods = self._periods_of(first[:2])
        period = self._selected(periods, period_key)
        if period is not None and period_key is None:
            pipe = self.client.pipeline(transaction=False)
            pipe.smembers(self.keys.period_campaigns(period.key, advertiser_id))
            pipe.smembers(self.keys.period_ads(period.key, advertiser_id))
            first += pipe.execute()
        campaign_ids, ad_ids = (set(first[2]), set(first[3])) if period is not None else (set(), set())

        catalog = self.catalog.get()
        ad_campaign = {ad.ad_id: ad.campaign_id for ad in catalog if ad.advertiser_id == advertiser_id}
        campaign_ids |= set(ad_campaign.values())
        ad_ids |= set(ad_campaign)
        campaigns, ads = sorted(campaign_ids), sorted(ad_ids)
        series_periods = periods[-SERIES_PERIODS:]

        pipe = self.client.pipeline(transaction=False)
        for p in series_periods:
            self._queue_billed(pipe, p.key, "adv", advertiser_id)
            self._queue_counts(pipe, p.key, "adv", advertiser_id)
        if period is not None:
            for campaign_id in campaigns:
                self._queue_billed(pipe, period.key, "cmp", campaign_id)
                pipe.hget(self.keys.totals(period.key, "cmp", campaign_id), "advertiser")
                self._queue_not_charged(pipe, period.key, "cmp", campaign_id)
            for ad_id in ads:
                pipe.hmget(self.keys.totals(period.key, "ad", ad_id), "clicks", "micros", "campaign", "advertiser")
                pipe.hmget(self.keys.corrections(period.key, "ad", ad_id), "clicks", "micros")
                self._queue_counts(pipe, period.key, "ad", ad_id)
        pipe.hgetall(self.keys.quarantined(advertiser_id))
        results = iter(pipe.execute())

        series = [
            PeriodBill(
                p,
                Billed(_figures(next(results)), _figures(next(results))),
                _counts(next(results)),
                _counts(next(results)),
                _unbilled(next(results)),
                _not_charged(next(results)),
            )
            for p in series_periods
        ]
        campaign_lines: list[CampaignLine] = []
        ad_lines: list[AdLine] = []
        if period is not None:
            for campaign_id in campaigns:
                billed, owner = Billed(_figures(next(results)), _figures(next(results))), next(results)
                not_charged = _not_charged(next(results))
                if owner in (None, advertiser_id):  # a campaign of another advertiser never shows here
                    campaign_lines.append(CampaignLine(campaign_id, billed, not_charged))
            for ad_id in ads:
                totals, corrections, late, ahead = next(results), next(results), next(results), next(results)
                unbilled, not_charged = next(results), next(results)
                if totals[3] not in (None, advertiser_id):
                    continue  # an ad of another advertiser must never show here, whatever a set says
                line = AdLine(
                    ad_id,
                    ad_campaign.get(ad_id) or totals[2] or "",
                    Billed(_figures(totals), _figures(corrections)),
                    _counts(late),
                    _counts(ahead),
                    _unbilled(unbilled),
                    _not_charged(not_charged),
                )
                ad_lines.append(line)
        quarantined = {reason: int(n) for reason, n in sorted(next(results).items())}

        # Unbilled clicks are counted per ad always, per advertiser only when the stream knew the ad's owner: an ad
        # the catalog learnt later (an admin's new ad) counts under its ad alone. The advertiser's figure is the sum
        # over its ads, so that the period's box and its ads table say the same.
        wanted = [b.period for b in series] + ([period] if period is not None and period not in series_periods else [])
        unbilled_of = self._unbilled_of_advertiser(wanted, advertiser_id)
        series = [replace(b, unbilled=unbilled_of.get(b.period.key, UnbilledCounts())) for b in series]
        selected = next((bill for bill in series if period is not None and bill.period == period), None)
        if selected is None and period is not None:  # an old period, outside the chart's window
            selected = self._period_bill(period, "adv", advertiser_id)
            selected = replace(selected, unbilled=unbilled_of.get(period.key, UnbilledCounts()))
        return Dashboard(
            advertiser_id=advertiser_id,
            currency=self.currency(advertiser_id),
            period=period,
            periods=periods,
            billed=selected.billed if selected else Billed(),
            late=selected.late if selected else EventCounts(),
            clock_ahead=selected.clock_ahead if selected else EventCounts(),
            campaigns=[c for c in campaign_lines if not (c.billed.is_zero and c.not_charged.is_zero)],
            ads=[a for a in ad_lines if not _quiet(a)],
            series=series,
            quarantined=quarantined,
            unbilled=selected.unbilled if selected else UnbilledCounts(),
            not_charged=selected.not_charged if selected else NotCharged(),
        )

    def campaign(self, advertiser_id: str, campaign_id: str, period_key: str | None) -> CampaignDetail | None:
        """A campaign of the advertiser, per period, with its ads in the selected period; None if not its own."""
        if not is_id(campaign_id):
            return None
        periods = self.periods()
        series_periods = periods[-SERIES_PERIODS:]
        period = self._selected(periods, period_key)
        catalog = self.catalog.get()
        ad_ids = {ad.ad_id for ad in catalog if ad.campaign_id == campaign_id and ad.advertiser_id == advertiser_id}
        owned = bool(ad_ids)
        pipe = self.client.pipeline(transaction=False)
        for p in periods:
            pipe.sismember(self.keys.period_campaigns(p.key, advertiser_id), campaign_id)
        if period is not None:
            pipe.smembers(self.keys.period_ads(period.key, advertiser_id))
        first = pipe.execute()
        owned = owned or any(first[: len(periods)])
        if not owned:
            return None
        if period is not None:
            ad_ids |= set(first[-1])
        ads = sorted(ad_ids)

        pipe = self.client.pipeline(transaction=False)
        for p in series_periods:
            self._queue_billed(pipe, p.key, "cmp", campaign_id)
            pipe.hget(self.keys.totals(p.key, "cmp", campaign_id), "advertiser")
            self._queue_not_charged(pipe, p.key, "cmp", campaign_id)
        if period is not None:
            for ad_id in ads:
                pipe.hmget(self.keys.totals(period.key, "ad", ad_id), "clicks", "micros", "campaign", "advertiser")
                pipe.hmget(self.keys.corrections(period.key, "ad", ad_id), "clicks", "micros")
                self._queue_counts(pipe, period.key, "ad", ad_id)
        results = iter(pipe.execute())
        series = []
        for p in series_periods:
            billed, owner = Billed(_figures(next(results)), _figures(next(results))), next(results)
            not_charged = _not_charged(next(results))
            # The id may have named another advertiser's campaign in that period (the catalog changed since).
            mine = owner in (None, advertiser_id)
            series.append(
                PeriodBill(p, billed if mine else Billed(), not_charged=not_charged if mine else NotCharged())
            )
        lines = []
        if period is not None:
            ad_campaign = {ad.ad_id: ad.campaign_id for ad in catalog}
            for ad_id in ads:
                totals, corrections, late, ahead = next(results), next(results), next(results), next(results)
                unbilled, not_charged = next(results), next(results)
                if (ad_campaign.get(ad_id) or totals[2]) != campaign_id or totals[3] not in (None, advertiser_id):
                    continue
                billed = Billed(_figures(totals), _figures(corrections))
                line = AdLine(
                    ad_id,
                    campaign_id,
                    billed,
                    _counts(late),
                    _counts(ahead),
                    _unbilled(unbilled),
                    _not_charged(not_charged),
                )
                if not _quiet(line):
                    lines.append(line)
        return CampaignDetail(advertiser_id, campaign_id, self.currency(advertiser_id), period, series, lines)

    def ad(self, advertiser_id: str, ad_id: str) -> AdDetail | None:
        """An ad of the advertiser, per period, with its late and clock-ahead events; None if it is not the
        advertiser's."""
        if not is_id(ad_id):
            return None
        periods = self.periods()[-SERIES_PERIODS:]
        known = self.catalog.get().get(ad_id)
        pipe = self.client.pipeline(transaction=False)
        for p in periods:
            pipe.hmget(self.keys.totals(p.key, "ad", ad_id), "clicks", "micros", "campaign", "advertiser")
            pipe.hmget(self.keys.corrections(p.key, "ad", ad_id), "clicks", "micros")
            self._queue_counts(pipe, p.key, "ad", ad_id)
        results = pipe.execute()
        owners = {totals[3] for totals in results[0::6] if totals[3] is not None}
        if known is not None:
            owners.add(known.advertiser_id)
        if owners != {advertiser_id}:
            return None
        campaign_id = known.campaign_id if known else next((t[2] for t in results[0::6] if t[2]), "")
        series = [
            PeriodBill(
                p,
                Billed(_figures(totals), _figures(corrections)),
                _counts(late),
                _counts(ahead),
                _unbilled(unbilled),
                _not_charged(not_charged),
            )
            for p, (totals, corrections, late, ahead, unbilled, not_charged) in zip(
                periods, _sixes(results), strict=True
            )
        ]
        return AdDetail(advertiser_id, campaign_id, ad_id, self.currency(advertiser_id), series)

    def range_bills(self, level: str, ident: str, advertiser_id: str, start_ms: int, end_ms: int) -> list[PeriodBill]:
        """The figures of an advertiser (`adv`), or its campaign (`cmp`) or ad (`ad`), in every period that starts
        in [start_ms, end_ms), oldest first; periods where the id named another advertiser's thing count zero."""
        periods = [p for p in self.periods() if start_ms <= p.start_ms < end_ms]
        pipe = self.client.pipeline(transaction=False)
        for p in periods:
            self._queue_billed(pipe, p.key, level, ident)
            pipe.hget(self.keys.totals(p.key, level, ident), "advertiser")
            self._queue_not_charged(pipe, p.key, level, ident)
        results = iter(pipe.execute())
        bills = []
        for p in periods:
            billed, owner = Billed(_figures(next(results)), _figures(next(results))), next(results)
            not_charged = _not_charged(next(results))
            mine = level == "adv" or owner in (None, advertiser_id)
            bills.append(PeriodBill(p, billed if mine else Billed(), not_charged=not_charged if mine else NotCharged()))
        return bills

    def corrections(self, advertiser_id: str, offset: int, limit: int) -> CorrectionPage:
        """One page of the advertiser's corrections, newest first."""
        key = self.keys.correction_list(advertiser_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(key)
        pipe.lrange(key, offset, offset + limit - 1)
        total, raw = pipe.execute()
        items = [c for c in (_correction(text) for text in raw) if c and c.advertiser_id == advertiser_id]
        return CorrectionPage(advertiser_id, self.currency(advertiser_id), int(total), offset, limit, items)

    def not_charged_clicks(self, advertiser_id: str, start_ms: int, end_ms: int) -> list[NotChargedClick]:
        """The advertiser's billable clicks not charged in the periods starting in [start_ms, end_ms), newest first:
        a closed period's from its export, an open one's as the stream decided (`billing.store.not_charged_clicks`)."""
        return not_charged_clicks(self.layout, self.period_length, advertiser_id, start_ms, end_ms)

    def period_corrections(
        self, advertiser_id: str, period_key: str, limit: int, scan: int = 5000, chunk: int = 1000
    ) -> CorrectionPage:
        """The advertiser's newest corrections (at most `limit`) that correct the period or are booked in it, from
        the newest `scan` of its list; `total` counts those found there."""
        key = self.keys.correction_list(advertiser_id)
        items: list[Correction] = []
        found = 0
        for start in range(0, scan, chunk):
            raw = self.client.lrange(key, start, start + chunk - 1)
            for text in raw:  # type: ignore[union-attr]
                c = _correction(str(text))
                if c and c.advertiser_id == advertiser_id and period_key in (c.corrects_period, c.booked_period):
                    found += 1
                    if len(items) < limit:
                        items.append(c)
            if len(raw) < chunk:  # type: ignore[arg-type]
                break
        return CorrectionPage(advertiser_id, self.currency(advertiser_id), found, 0, limit, items)

    def correction(self, advertiser_id: str, correction_id: str, chunk: int = 1000) -> Correction | None:
        """The advertiser's correction of this id, or None (reading the list in chunks, newest first)."""
        if not is_id(correction_id):
            return None
        key = self.keys.correction_list(advertiser_id)
        start = 0
        while True:
            raw = self.client.lrange(key, start, start + chunk - 1)
            for text in raw:  # type: ignore[union-attr]
                found = _correction(str(text))
                if found and found.correction_id == correction_id and found.advertiser_id == advertiser_id:
                    return found
            if len(raw) < chunk:  # type: ignore[arg-type]
                return None
            start += chunk

    # Budgets ---------------------------------------------------------------------------------------------------
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

    def budgets_today(self, now_ms: int) -> list[CampaignDay]:
        """Every campaign of the catalog with a budget today or figures, today (UTC) as of `now_ms`: capped ones
        first, then by campaign id."""
        catalog = self.catalog.get()
        days = self.campaign_days(catalog.campaign_ids, [utc_day(now_ms)], now_ms, budgeted_only=False)
        return sorted(days, key=lambda d: (not d.capped, d.campaign_id))

    # Finance ---------------------------------------------------------------------------------------------------
    def finance(self, period_key: str | None) -> Finance | None:
        """Every advertiser's figures in the selected period (default: the latest), the periods and exports."""
        periods = self.periods()
        period = self._selected(periods, period_key)
        lines: list[AdvertiserLine] = []
        if period is not None:
            members = self.client.smembers(self.keys.period_advertisers(period.key))
            advertisers = sorted({str(m) for m in members} | set(self.catalog.get().advertiser_ids))  # type: ignore[union-attr]
            pipe = self.client.pipeline(transaction=False)
            for advertiser_id in advertisers:
                self._queue_billed(pipe, period.key, "adv", advertiser_id)
                self._queue_not_charged(pipe, period.key, "adv", advertiser_id)
            results = iter(pipe.execute())
            for advertiser_id in advertisers:
                billed = Billed(_figures(next(results)), _figures(next(results)))
                not_charged = _not_charged(next(results))
                if not (billed.is_zero and not_charged.is_zero):
                    lines.append(AdvertiserLine(advertiser_id, self.currency(advertiser_id), billed, not_charged))
        return Finance(period, periods, lines, self.exports(), self.last_audit())

    def finance_range(self, start_ms: int, end_ms: int) -> FinanceRange:
        """Every advertiser's figures over the periods that start in [start_ms, end_ms): the corrected bill (a
        closed period's is its export's) and the clicks not charged; two round trips."""
        periods = [p for p in self.periods() if start_ms <= p.start_ms < end_ms]
        pipe = self.client.pipeline(transaction=False)
        for p in periods:
            pipe.smembers(self.keys.period_advertisers(p.key))
        members = pipe.execute() if periods else []
        pipe = self.client.pipeline(transaction=False)
        asked: list[str] = []
        for p, who in zip(periods, members, strict=True):
            for advertiser_id in sorted(who):
                asked.append(advertiser_id)
                self._queue_billed(pipe, p.key, "adv", advertiser_id)
                self._queue_not_charged(pipe, p.key, "adv", advertiser_id)
        results = iter(pipe.execute() if asked else [])
        sums: dict[str, tuple[Billed, NotCharged]] = {}
        for advertiser_id in asked:
            billed = Billed(_figures(next(results)), _figures(next(results)))
            not_charged = _not_charged(next(results))
            was = sums.get(advertiser_id, (Billed(), NotCharged()))
            sums[advertiser_id] = (was[0] + billed, was[1] + not_charged)
        lines = [
            AdvertiserLine(a, self.currency(a), billed, nc)
            for a, (billed, nc) in sorted(sums.items())
            if not (billed.is_zero and nc.is_zero)
        ]
        return FinanceRange(lines, len(periods), sum(1 for p in periods if not p.closed))

    def finance_periods(self, count: int = SERIES_PERIODS) -> list[FinancePeriod]:
        """The latest `count` periods, newest first, each with every advertiser's figures added up per currency
        and the reason the last reconciliation gave for holding it."""
        periods = self.periods()[-count:]
        pipe = self.client.pipeline(transaction=False)
        for p in periods:
            pipe.smembers(self.keys.period_advertisers(p.key))
        pipe.hget(self.keys.last_reconciliation(), "held")
        *members, held_text = pipe.execute()
        held = {str(k): str(v) for k, v in _json_field(held_text, {}).items()}
        pipe = self.client.pipeline(transaction=False)
        for p, who in zip(periods, members, strict=True):
            for advertiser_id in sorted(who):
                self._queue_billed(pipe, p.key, "adv", advertiser_id)
                self._queue_not_charged(pipe, p.key, "adv", advertiser_id)
        results = iter(pipe.execute())
        currency_of = {a: self.currency(a) for a in set().union(*members)}
        out = []
        for p, who in zip(periods, members, strict=True):
            lines = [
                AdvertiserLine(
                    a,
                    currency_of[a],
                    Billed(_figures(next(results)), _figures(next(results))),
                    _not_charged(next(results)),
                )
                for a in sorted(who)
            ]
            out.append(FinancePeriod(p, totals_by_currency(lines), held.get(p.key), not_charged_by_currency(lines)))
        return list(reversed(out))

    def last_audit(self) -> Audit | None:
        """The last `adbill audit`, or None before the first."""
        audited = self.client.hgetall(self.keys.last_audit())
        return _audit(audited) if audited else None  # type: ignore[arg-type]

    def exports(self) -> list[Manifest]:
        """Every finished export (its manifest written), newest period first."""
        if not self.exports_dir.is_dir():
            return []
        found = []
        for folder in sorted(self.exports_dir.iterdir(), reverse=True):
            manifest = folder / MANIFEST_FILE
            if not (is_period_key(folder.name) and manifest.is_file()):
                continue
            try:
                found.append(read_manifest(folder))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not a manifest we can read: not offered for download
        return found

    def export_file(self, period_key: str, name: str) -> Path | None:
        """The file of a finished export, or None; only the known names of a period-named folder."""
        if not is_period_key(period_key) or name not in EXPORT_FILES:
            return None
        folder = self.exports_dir / period_key
        path = folder / name
        return path if (folder / MANIFEST_FILE).is_file() and path.is_file() else None

    # Admin -----------------------------------------------------------------------------------------------------
    def heartbeat_ms(self) -> int | None:
        """When the streaming job last reported a batch or an idle trigger (epoch ms), None if never; raises the
        Redis client's error when Redis does not answer."""
        return _int_field(self.client.get(self.keys.heartbeat(QUERY_NAMES[0])))  # type: ignore[arg-type]

    def part_waiting(self, part: str) -> dict[str, str]:
        """What a part (`stream`, `reconcile`) says it waits for: its status record (`state`, `message`,
        `since_ms`), {} when it waits for nothing (`billing.store.part_status`)."""
        return read_status(self.client, self.keys.prefix, part)

    def health(self) -> Health:
        """The job's latest progress per query, recent batch durations, late, clock-ahead and quarantined counts,
        and the last reconciliation."""
        advertisers = self.known_advertisers()
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(self.keys.late_periods(), -SERIES_PERIODS, -1, withscores=True)
        pipe.zrange(self.keys.clock_ahead_periods(), -SERIES_PERIODS, -1, withscores=True)
        pipe.zrange(self.keys.unbilled_periods(), -SERIES_PERIODS, -1, withscores=True)
        late_periods, ahead_periods, unbilled_periods = pipe.execute()
        periods = [Period(key, int(start), False) for key, start in late_periods]
        reasons = [r.value for r in QuarantineReason]
        pipe = self.client.pipeline(transaction=False)
        for name in QUERY_NAMES:
            pipe.hgetall(self.keys.health_query(name))
            pipe.lrange(self.keys.health_history(name), 0, HEALTH_HISTORY - 1)
        for reason in reasons:
            pipe.hgetall(self.keys.quarantine(reason))
        for p in periods:
            for advertiser_id in advertisers:
                pipe.hmget(self.keys.late(p.key, "adv", advertiser_id), "impressions", "clicks")
        for key, _ in ahead_periods:
            pipe.smembers(self.keys.clock_ahead_ads(key))
        for key, _ in unbilled_periods:
            pipe.smembers(self.keys.unbilled_ads(key))
        pipe.hgetall(self.keys.last_reconciliation())
        results = iter(pipe.execute())

        queries = []
        for name in QUERY_NAMES:
            record, history = next(results), next(results)
            if record:
                queries.append(_query_health(name, record, history))
        quarantined = {}
        for reason in reasons:
            topics = next(results)
            if topics:
                quarantined[reason] = {topic: int(n) for topic, n in sorted(topics.items())}
        late = []
        for p in periods:
            total = EventCounts()
            for _ in advertisers:
                total += _counts(next(results))
            late.append(PeriodBill(p, Billed(), total))
        ahead_ads = [(Period(key, int(start), False), sorted(next(results))) for key, start in ahead_periods]
        unbilled_ads = [(Period(key, int(start), False), sorted(next(results))) for key, start in unbilled_periods]
        last = next(results)
        return Health(
            queries,
            quarantined,
            late,
            self._clock_ahead_lines(ahead_ads),
            _reconciliation(last) if last else None,
            self._unbilled_lines(unbilled_ads),
        )

    def _unbilled_of_advertiser(self, periods: Sequence[Period], advertiser_id: str) -> dict[str, UnbilledCounts]:
        """The advertiser's unbilled clicks per period, summed over its ads (the catalog's owner of each ad, or the
        owner the stream recorded): two round trips."""
        if not periods:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for p in periods:
            pipe.smembers(self.keys.unbilled_ads(p.key))
        listed = pipe.execute()
        catalog = self.catalog.get()
        pipe = self.client.pipeline(transaction=False)
        asked: list[tuple[str, str]] = []
        for p, ads in zip(periods, listed, strict=True):
            for ad_id in sorted(ads):
                owner = catalog.advertiser_of(ad_id)
                if owner in (None, advertiser_id):
                    asked.append((p.key, ad_id))
                    pipe.hmget(self.keys.unbilled(p.key, "ad", ad_id), *UNBILLED_REASONS)
                    pipe.hget(self.keys.totals(p.key, "ad", ad_id), "advertiser")
        results = iter(pipe.execute() if asked else [])
        out: dict[str, UnbilledCounts] = {}
        for key, ad_id in asked:
            counts, recorded = _unbilled(next(results)), next(results)
            if (catalog.advertiser_of(ad_id) or recorded) != advertiser_id:
                continue  # an ad nobody can tell the owner of: the health page lists it
            before = out.get(key, UnbilledCounts())
            out[key] = UnbilledCounts(before.ad_paused + counts.ad_paused, before.unknown_ad + counts.unknown_ad)
        return out

    def _unbilled_lines(self, ads_by_period: list[tuple[Period, list[str]]]) -> list[UnbilledLine]:
        """Each ad's unbilled clicks in each of the periods, with the ad's advertiser (from the catalog; empty for an
        ad the catalog does not know)."""
        pipe = self.client.pipeline(transaction=False)
        for period, ads in ads_by_period:
            for ad_id in ads:
                pipe.hmget(self.keys.unbilled(period.key, "ad", ad_id), *UNBILLED_REASONS)
        results = iter(pipe.execute())
        catalog = self.catalog.get()
        lines = []
        for period, ads in ads_by_period:
            for ad_id in ads:
                lines.append(UnbilledLine(period, catalog.advertiser_of(ad_id) or "", ad_id, _unbilled(next(results))))
        return lines

    def _clock_ahead_lines(self, ads_by_period: list[tuple[Period, list[str]]]) -> list[ClockAheadLine]:
        """Each ad's clock-ahead events in each of the periods, with the ad's advertiser (from the catalog)."""
        pipe = self.client.pipeline(transaction=False)
        for period, ads in ads_by_period:
            for ad_id in ads:
                pipe.hmget(self.keys.clock_ahead(period.key, "ad", ad_id), "impressions", "clicks")
        results = iter(pipe.execute())
        catalog = self.catalog.get()
        lines = []
        for period, ads in ads_by_period:
            for ad_id in ads:
                known = catalog.get(ad_id)
                lines.append(
                    ClockAheadLine(period, known.advertiser_id if known else "", ad_id, _counts(next(results)))
                )
        return lines

    def _selected(self, periods: list[Period], key: str | None) -> Period | None:
        """The period asked for (default: the latest); a well-formed period that holds no data is an empty open
        period, shown with zero spend (the key was checked by `web.guards.period_arg`)."""
        if key is None:
            return periods[-1] if periods else None
        return _find(periods, key) or Period(key, self.period_length.parse_key(key), False)

    # Pieces ----------------------------------------------------------------------------------------------------
    def _queue_periods(self, pipe: Any) -> None:
        pipe.zrange(self.keys.periods(), 0, -1, withscores=True)
        pipe.zrange(self.keys.closed_periods(), 0, -1, withscores=True)

    def _periods_of(self, results: Sequence[Any]) -> list[Period]:
        billed, closed = results[0], results[1]
        closed_keys = {key for key, _ in closed}
        starts = {key: int(score) for key, score in (*billed, *closed)}
        return [Period(key, start, key in closed_keys) for key, start in sorted(starts.items(), key=lambda kv: kv[1])]

    def _queue_billed(self, pipe: Any, period: str, level: str, ident: str) -> None:
        pipe.hmget(self.keys.totals(period, level, ident), "clicks", "micros")
        pipe.hmget(self.keys.corrections(period, level, ident), "clicks", "micros")

    def _queue_counts(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The late, then the clock-ahead events, then the unbilled clicks, then the clicks not charged of an
        advertiser (`adv`) or ad (`ad`) in a period."""
        pipe.hmget(self.keys.late(period, level, ident), "impressions", "clicks")
        pipe.hmget(self.keys.clock_ahead(period, level, ident), "impressions", "clicks")
        pipe.hmget(self.keys.unbilled(period, level, ident), *UNBILLED_REASONS)
        self._queue_not_charged(pipe, period, level, ident)

    def _queue_not_charged(self, pipe: Any, period: str, level: str, ident: str) -> None:
        """The priced clicks not charged of an advertiser, campaign or ad in a period, per reason (`_not_charged`)."""
        pipe.hmget(self.keys.not_charged(period, level, ident), *NOT_CHARGED_FIELDS)

    def _period_bill(self, period: Period, level: str, ident: str) -> PeriodBill:
        pipe = self.client.pipeline(transaction=False)
        self._queue_billed(pipe, period.key, level, ident)
        self._queue_counts(pipe, period.key, level, ident)
        totals, corrections, late, ahead, unbilled, not_charged = pipe.execute()
        return PeriodBill(
            period,
            Billed(_figures(totals), _figures(corrections)),
            _counts(late),
            _counts(ahead),
            _unbilled(unbilled),
            _not_charged(not_charged),
        )


def _find(periods: list[Period], key: str | None) -> Period | None:
    return next((p for p in periods if p.key == key), None)


def _figures(values: Sequence[str | None]) -> Figures:
    return Figures(int(values[0] or 0), int(values[1] or 0))


def _counts(values: Sequence[str | None]) -> EventCounts:
    return EventCounts(int(values[0] or 0), int(values[1] or 0))


def _unbilled(values: Sequence[str | None]) -> UnbilledCounts:
    """The `UNBILLED_REASONS` fields of an unbilled hash, in that order."""
    return UnbilledCounts(int(values[0] or 0), int(values[1] or 0))


def _not_charged(values: Sequence[str | None]) -> NotCharged:
    """The `NOT_CHARGED_FIELDS` of a not-charged hash, in that order."""
    numbers = [int(v or 0) for v in values]
    return NotCharged(*(Figures(numbers[2 * i], numbers[2 * i + 1]) for i in range(len(NOT_CHARGED_REASONS))))


def _quiet(line: AdLine) -> bool:
    """An ad line with nothing to show: no bill, no late, clock-ahead, unbilled or not-charged click."""
    return (
        line.billed.is_zero
        and line.late.is_zero
        and line.clock_ahead.is_zero
        and line.unbilled.is_zero
        and line.not_charged.is_zero
    )


def _sixes(results: Sequence[Any]) -> list[tuple[Any, Any, Any, Any, Any, Any]]:
    """Pipeline results read six at a time: totals, corrections, late, clock-ahead, unbilled, not charged."""
    return [tuple(results[i : i + 6]) for i in range(0, len(results), 6)]  # type: ignore[misc]


def _correction(text: str) -> Correction | None:
    try:
        return Correction.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None  # a line we cannot read is not shown rather than failing the page


def _json_field(value: str | None, default: Any) -> Any:
    if value is None or value == "None":
        return default
    try:
        return json.loads(value)
    except ValueError:
        return default


def _int_field(value: str | None) -> int | None:
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


def _float_field(value: str | None) -> float:
    try:
        return float(value or 0.0)
    except ValueError:
        return 0.0


def _query_health(name: str, record: dict[str, str], history: list[str]) -> QueryHealth:
    recent = []
    lag_before = None
    for n, line in enumerate(history):
        try:
            older = json.loads(line)
            recent.append(int(older.get("batch_duration_ms") or 0))
            if n < LAG_LOOKBACK:
                sources = older.get("sources")
                lag_before = consumer_lag(_json_field(sources, []) if isinstance(sources, str) else sources or [])
        except (ValueError, AttributeError, TypeError):
            continue
    watermarks = _json_field(record.get("stream_watermarks_ms"), {})
    return QueryHealth(
        name=name,
        batch_id=_int_field(record.get("batch_id")),
        timestamp=record.get("timestamp", ""),
        input_rows=_int_field(record.get("input_rows")) or 0,
        input_rows_per_second=_float_field(record.get("input_rows_per_second")),
        processed_rows_per_second=_float_field(record.get("processed_rows_per_second")),
        batch_duration_ms=_int_field(record.get("batch_duration_ms")) or 0,
        durations_ms={str(k): int(v) for k, v in _json_field(record.get("durations_ms"), {}).items()},
        watermark_ms=_int_field(record.get("watermark_ms")),
        stream_watermarks_ms={str(k): None if v is None else int(v) for k, v in watermarks.items()},
        state_rows=_int_field(record.get("state_rows")) or 0,
        state_memory_bytes=_int_field(record.get("state_memory_bytes")) or 0,
        rows_dropped_by_watermark=_int_field(record.get("rows_dropped_by_watermark")) or 0,
        lag=consumer_lag(_json_field(record.get("sources"), [])),
        recent_durations_ms=list(reversed(recent)),
        lag_before=lag_before,
    )


def _reconciliation(data: dict[str, str]) -> Reconciliation:
    return Reconciliation(
        run_id=data.get("run_id", ""),
        started_at_ms=_int_field(data.get("started_at_ms")) or 0,
        finished_at_ms=_int_field(data.get("finished_at_ms")) or 0,
        duration_ms=_int_field(data.get("duration_ms")) or 0,
        periods=[str(p) for p in _json_field(data.get("periods"), [])],
        closed=[str(p) for p in _json_field(data.get("closed"), [])],
        additions=_int_field(data.get("additions")) or 0,
        retractions=_int_field(data.get("retractions")) or 0,
        net_micros_by_currency={
            str(c): int(m)
            for c, m in _json_field(data.get("net_micros_by_currency"), {}).items()
            if isinstance(m, int | str) and str(m).lstrip("-").isdigit()
        },
        held={str(p): str(r) for p, r in _json_field(data.get("held"), {}).items()},
    )


def _audit(data: dict[str, str]) -> Audit:
    return Audit(
        ran_at_ms=_int_field(data.get("ran_at_ms")) or 0,
        periods=_int_field(data.get("periods")) or 0,
        differences=[str(p) for p in _json_field(data.get("differences"), [])],
        awaiting_close=[str(p) for p in _json_field(data.get("awaiting_close"), [])],
    )
