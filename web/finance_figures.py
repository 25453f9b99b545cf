"""What finance sees, read from Redis and the export folder: every advertiser's figures in a period, over a range of
periods and per currency in the recent periods, with the finished exports and the last audit. Reads only."""

from __future__ import annotations

from web.exports import ExportFolder
from web.model import (
    AdvertiserLine,
    Audit,
    Billed,
    Finance,
    FinancePeriod,
    FinanceRange,
    NotCharged,
    not_charged_by_currency,
    totals_by_currency,
)
from web.readers import SERIES_PERIODS, CatalogView, PeriodReader, charges_of, int_field, json_field


class FinanceFigures:
    """Every advertiser's figures as finance's pages, documents and month files show them."""

    def __init__(self, periods: PeriodReader, catalog: CatalogView, exports: ExportFolder) -> None:
        self.periods = periods
        self.catalog = catalog
        self.exports = exports

    def period(self, period_key: str | None) -> Finance | None:
        """Every advertiser's figures in the selected period (default: the latest), the periods and exports."""
        reader = self.periods
        periods = reader.periods()
        period = reader.selected(periods, period_key)
        lines: list[AdvertiserLine] = []
        if period is not None:
            members = reader.client.smembers(reader.keys.period_advertisers(period.key))
            advertisers = sorted({str(m) for m in members} | set(self.catalog.get().advertiser_ids))  # type: ignore[union-attr]
            pipe = reader.pipeline()
            for advertiser_id in advertisers:
                reader.queue_charges(pipe, period.key, "adv", advertiser_id)
            results = iter(pipe.execute())
            for advertiser_id in advertisers:
                billed, not_charged = charges_of(results)
                if not (billed.is_zero and not_charged.is_zero):
                    currency = self.catalog.currency(advertiser_id)
                    lines.append(AdvertiserLine(advertiser_id, currency, billed, not_charged))
        return Finance(period, periods, lines, self.exports.finished(), self.last_audit())

    def between(self, start_ms: int, end_ms: int) -> FinanceRange:
        """Every advertiser's figures over the periods that start in [start_ms, end_ms): the corrected bill (a
        closed period's is its export's) and the clicks not charged; two round trips."""
        reader = self.periods
        periods = reader.between(start_ms, end_ms)
        members = reader.advertisers_in(periods)
        pipe = reader.pipeline()
        asked: list[str] = []
        for p, who in zip(periods, members, strict=True):
            for advertiser_id in sorted(who):
                asked.append(advertiser_id)
                reader.queue_charges(pipe, p.key, "adv", advertiser_id)
        results = iter(pipe.execute() if asked else [])
        sums: dict[str, tuple[Billed, NotCharged]] = {}
        for advertiser_id in asked:
            billed, not_charged = charges_of(results)
            was = sums.get(advertiser_id, (Billed(), NotCharged()))
            sums[advertiser_id] = (was[0] + billed, was[1] + not_charged)
        lines = [
            AdvertiserLine(a, self.catalog.currency(a), billed, nc)
            for a, (billed, nc) in sorted(sums.items())
            if not (billed.is_zero and nc.is_zero)
        ]
        return FinanceRange(lines, len(periods), sum(1 for p in periods if not p.closed))

    def recent(self, count: int = SERIES_PERIODS) -> list[FinancePeriod]:
        """The latest `count` periods, newest first, each with every advertiser's figures added up per currency
        and the reason the last reconciliation gave for holding it."""
        reader = self.periods
        periods = reader.periods()[-count:]
        pipe = reader.pipeline()
        for p in periods:
            pipe.smembers(reader.keys.period_advertisers(p.key))
        pipe.hget(reader.keys.last_reconciliation(), "held")
        *members, held_text = pipe.execute()
        held = {str(k): str(v) for k, v in json_field(held_text, {}).items()}
        pipe = reader.pipeline()
        for p, who in zip(periods, members, strict=True):
            for advertiser_id in sorted(who):
                reader.queue_charges(pipe, p.key, "adv", advertiser_id)
        results = iter(pipe.execute())
        currency_of = {a: self.catalog.currency(a) for a in set().union(*members)}
        out = []
        for p, who in zip(periods, members, strict=True):
            lines = [AdvertiserLine(a, currency_of[a], *charges_of(results)) for a in sorted(who)]
            out.append(FinancePeriod(p, totals_by_currency(lines), held.get(p.key), not_charged_by_currency(lines)))
        return list(reversed(out))

    def last_audit(self) -> Audit | None:
        """The last `adbill audit`, or None before the first."""
        audited = self.periods.client.hgetall(self.periods.keys.last_audit())
        return _audit(audited) if audited else None  # type: ignore[arg-type]


def _audit(data: dict[str, str]) -> Audit:
    return Audit(
        ran_at_ms=int_field(data.get("ran_at_ms")) or 0,
        periods=int_field(data.get("periods")) or 0,
        differences=[str(p) for p in json_field(data.get("differences"), [])],
        awaiting_close=[str(p) for p in json_field(data.get("awaiting_close"), [])],
    )
