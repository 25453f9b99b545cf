"""What an advertiser's pages show of its figures, read from Redis: the dashboard, a campaign, an ad, and the figures
of any of them over a range of periods (`web.model` values).

Reads only: the periods and the figures' hashes through `web.readers.PeriodReader`, which ad or campaign belongs to
whom through the catalog; one or two pipelines a page.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from web.model import (
    AdDetail,
    AdLine,
    Billed,
    CampaignDetail,
    CampaignLine,
    Dashboard,
    EventCounts,
    NotCharged,
    Period,
    PeriodBill,
    UnbilledCounts,
)
from web.readers import (
    SERIES_PERIODS,
    UNBILLED_REASONS,
    CatalogView,
    PeriodReader,
    bill_of,
    is_id,
    owned_charges_of,
    unbilled_of,
)


class AdvertiserFigures:
    """An advertiser's figures per period, and per campaign and ad, as its pages show them; never another
    advertiser's, whatever a set in Redis says."""

    def __init__(self, periods: PeriodReader, catalog: CatalogView) -> None:
        self.periods = periods
        self.catalog = catalog

    def dashboard(self, advertiser_id: str, period_key: str | None) -> Dashboard | None:
        """The advertiser's selected period (default: the latest) in detail, and its recent periods.

        None when `period_key` names no period. Two round trips: periods and who has totals, then every figure.
        """
        reader, keys = self.periods, self.periods.keys
        pipe = reader.pipeline()
        reader.queue_periods(pipe)
        if period_key is not None:
            pipe.smembers(keys.period_campaigns(period_key, advertiser_id))
            pipe.smembers(keys.period_ads(period_key, advertiser_id))
        first = pipe.execute()
        periods = reader.periods_from(first[:2])
        period = reader.selected(periods, period_key)
        if period is not None and period_key is None:
            pipe = reader.pipeline()
            pipe.smembers(keys.period_campaigns(period.key, advertiser_id))
            pipe.smembers(keys.period_ads(period.key, advertiser_id))
            first += pipe.execute()
        campaign_ids, ad_ids = (set(first[2]), set(first[3])) if period is not None else (set(), set())

        catalog = self.catalog.get()
        ad_campaign = {ad.ad_id: ad.campaign_id for ad in catalog if ad.advertiser_id == advertiser_id}
        campaign_ids |= set(ad_campaign.values())
        ad_ids |= set(ad_campaign)
        campaigns, ads = sorted(campaign_ids), sorted(ad_ids)
        series_periods = periods[-SERIES_PERIODS:]

        pipe = reader.pipeline()
        for p in series_periods:
            reader.queue_billed(pipe, p.key, "adv", advertiser_id)
            reader.queue_counts(pipe, p.key, "adv", advertiser_id)
        if period is not None:
            for campaign_id in campaigns:
                reader.queue_owned_charges(pipe, period.key, "cmp", campaign_id)
            for ad_id in ads:
                reader.queue_ad(pipe, period.key, ad_id)
                reader.queue_counts(pipe, period.key, "ad", ad_id)
        pipe.hgetall(keys.quarantined(advertiser_id))
        results = iter(pipe.execute())

        series = [bill_of(p, results) for p in series_periods]
        campaign_lines: list[CampaignLine] = []
        ad_lines: list[AdLine] = []
        if period is not None:
            for campaign_id in campaigns:
                # a campaign of another advertiser never shows here: its figures read zero, and zero lines are left out
                campaign_lines.append(CampaignLine(campaign_id, *owned_charges_of(results, advertiser_id)))
            for ad_id in ads:
                totals, bill = _ad_bill(period, results)
                if totals[3] not in (None, advertiser_id):
                    continue  # an ad of another advertiser must never show here, whatever a set says
                ad_lines.append(_ad_line(ad_id, ad_campaign.get(ad_id) or totals[2] or "", bill))
        quarantined = {reason: int(n) for reason, n in sorted(next(results).items())}

        # Unbilled clicks are counted per ad always, per advertiser only when the stream knew the ad's owner: an ad
        # the catalog learnt later (an admin's new ad) counts under its ad alone. The advertiser's figure is the sum
        # over its ads, so that the period's box and its ads table say the same.
        wanted = [b.period for b in series] + ([period] if period is not None and period not in series_periods else [])
        unbilled = self._unbilled_of_advertiser(wanted, advertiser_id)
        series = [replace(b, unbilled=unbilled.get(b.period.key, UnbilledCounts())) for b in series]
        selected = next((bill for bill in series if period is not None and bill.period == period), None)
        if selected is None and period is not None:  # an old period, outside the chart's window
            selected = reader.period_bill(period, "adv", advertiser_id)
            selected = replace(selected, unbilled=unbilled.get(period.key, UnbilledCounts()))
        return Dashboard(
            advertiser_id=advertiser_id,
            currency=self.catalog.currency(advertiser_id),
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
        reader, keys = self.periods, self.periods.keys
        periods = reader.periods()
        series_periods = periods[-SERIES_PERIODS:]
        period = reader.selected(periods, period_key)
        catalog = self.catalog.get()
        ad_ids = {ad.ad_id for ad in catalog if ad.campaign_id == campaign_id and ad.advertiser_id == advertiser_id}
        owned = bool(ad_ids)
        pipe = reader.pipeline()
        for p in periods:
            pipe.sismember(keys.period_campaigns(p.key, advertiser_id), campaign_id)
        if period is not None:
            pipe.smembers(keys.period_ads(period.key, advertiser_id))
        first = pipe.execute()
        owned = owned or any(first[: len(periods)])
        if not owned:
            return None
        if period is not None:
            ad_ids |= set(first[-1])
        ads = sorted(ad_ids)

        pipe = reader.pipeline()
        for p in series_periods:
            reader.queue_owned_charges(pipe, p.key, "cmp", campaign_id)
        if period is not None:
            for ad_id in ads:
                reader.queue_ad(pipe, period.key, ad_id)
                reader.queue_counts(pipe, period.key, "ad", ad_id)
        results = iter(pipe.execute())
        # The id may have named another advertiser's campaign in a period (the catalog changed since): zero there.
        series = []
        for p in series_periods:
            billed, not_charged = owned_charges_of(results, advertiser_id)
            series.append(PeriodBill(p, billed, not_charged=not_charged))
        lines = []
        if period is not None:
            ad_campaign = {ad.ad_id: ad.campaign_id for ad in catalog}
            for ad_id in ads:
                totals, bill = _ad_bill(period, results)
                if (ad_campaign.get(ad_id) or totals[2]) != campaign_id or totals[3] not in (None, advertiser_id):
                    continue
                line = _ad_line(ad_id, campaign_id, bill)
                if not _quiet(line):
                    lines.append(line)
        currency = self.catalog.currency(advertiser_id)
        return CampaignDetail(advertiser_id, campaign_id, currency, period, series, lines)

    def ad(self, advertiser_id: str, ad_id: str) -> AdDetail | None:
        """An ad of the advertiser, per period, with its late and clock-ahead events; None if it is not the
        advertiser's."""
        if not is_id(ad_id):
            return None
        reader = self.periods
        periods = reader.periods()[-SERIES_PERIODS:]
        known = self.catalog.get().get(ad_id)
        pipe = reader.pipeline()
        for p in periods:
            reader.queue_ad(pipe, p.key, ad_id)
            reader.queue_counts(pipe, p.key, "ad", ad_id)
        results = pipe.execute()
        recorded = results[0::6]  # each period's totals: the campaign and advertiser the stream recorded
        owners = {totals[3] for totals in recorded if totals[3] is not None}
        if known is not None:
            owners.add(known.advertiser_id)
        if owners != {advertiser_id}:
            return None
        campaign_id = known.campaign_id if known else next((t[2] for t in recorded if t[2]), "")
        read = iter(results)
        series = [bill_of(p, read) for p in periods]
        return AdDetail(advertiser_id, campaign_id, ad_id, self.catalog.currency(advertiser_id), series)

    def range_bills(self, level: str, ident: str, advertiser_id: str, start_ms: int, end_ms: int) -> list[PeriodBill]:
        """The figures of an advertiser (`adv`), or its campaign (`cmp`) or ad (`ad`), in every period that starts
        in [start_ms, end_ms), oldest first; periods where the id named another advertiser's thing count zero."""
        reader = self.periods
        periods = reader.between(start_ms, end_ms)
        pipe = reader.pipeline()
        for p in periods:
            reader.queue_owned_charges(pipe, p.key, level, ident)
        results = iter(pipe.execute())
        owner = None if level == "adv" else advertiser_id
        bills = []
        for p in periods:
            billed, not_charged = owned_charges_of(results, owner)
            bills.append(PeriodBill(p, billed, not_charged=not_charged))
        return bills

    def _unbilled_of_advertiser(self, periods: Sequence[Period], advertiser_id: str) -> dict[str, UnbilledCounts]:
        """The advertiser's unbilled clicks per period, summed over its ads (the catalog's owner of each ad, or the
        owner the stream recorded): two round trips."""
        if not periods:
            return {}
        reader, keys = self.periods, self.periods.keys
        pipe = reader.pipeline()
        for p in periods:
            pipe.smembers(keys.unbilled_ads(p.key))
        listed = pipe.execute()
        catalog = self.catalog.get()
        pipe = reader.pipeline()
        asked: list[tuple[str, str]] = []
        for p, ads in zip(periods, listed, strict=True):
            for ad_id in sorted(ads):
                owner = catalog.advertiser_of(ad_id)
                if owner in (None, advertiser_id):
                    asked.append((p.key, ad_id))
                    pipe.hmget(keys.unbilled(p.key, "ad", ad_id), *UNBILLED_REASONS)
                    pipe.hget(keys.totals(p.key, "ad", ad_id), "advertiser")
        results = iter(pipe.execute() if asked else [])
        out: dict[str, UnbilledCounts] = {}
        for key, ad_id in asked:
            counts, recorded = unbilled_of(next(results)), next(results)
            if (catalog.advertiser_of(ad_id) or recorded) != advertiser_id:
                continue  # an ad nobody can tell the owner of: the health page lists it
            before = out.get(key, UnbilledCounts())
            out[key] = UnbilledCounts(before.ad_paused + counts.ad_paused, before.unknown_ad + counts.unknown_ad)
        return out


def _ad_bill(period: Period, results: Iterator[Any]) -> tuple[Sequence[str | None], PeriodBill]:
    """An ad's six results (`queue_ad`, then `queue_counts`): its totals as recorded (figures, campaign,
    advertiser), and its figures and counts."""
    six = [next(results) for _ in range(6)]
    return six[0], bill_of(period, iter(six))


def _ad_line(ad_id: str, campaign_id: str, bill: PeriodBill) -> AdLine:
    return AdLine(ad_id, campaign_id, bill.billed, bill.late, bill.clock_ahead, bill.unbilled, bill.not_charged)


def _quiet(line: AdLine) -> bool:
    """An ad line with nothing to show: no bill, no late, clock-ahead, unbilled or not-charged click."""
    return (
        line.billed.is_zero
        and line.late.is_zero
        and line.clock_ahead.is_zero
        and line.unbilled.is_zero
        and line.not_charged.is_zero
    )
