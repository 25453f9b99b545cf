"""Adapter: what the downloads and statements read, from Redis (open periods, live figures) and the export folder
(closed periods, as finance was given them), into `web.statements` values and CSV text.

Every CSV keeps money as integer micros and adds a decimal column beside it (exact, in the currency's minor unit and
finer only where the micros need it: `billing.money.format_amount`); text cells a producer or user wrote never start a
formula (`web.statements.safe_cell`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.invalid import INVALID_REASONS
from billing.invoices import Invoice
from billing.money import format_amount
from billing.periods import format_utc
from billing.store.export_files import CSV_FILE, PARQUET_FILE
from web.exports import ExportFolder
from web.model import FinanceRange, NotCharged, NotChargedClicks, Period
from web.ranges import DateRange
from web.readers import CatalogView, PeriodReader, charges_of, figures_of
from web.statements import CLOSED, CLOSED_WITHOUT_EXPORT, PROVISIONAL, PeriodCharges, safe_cell


def statement_periods(
    reader: PeriodReader, exports: ExportFolder, advertiser_id: str, span: DateRange
) -> list[PeriodCharges]:
    """Each period of the span for the advertiser: a closed one from its export when the export is on file (its
    clicks, and the adjustments booked in it), otherwise, and for open ones, the corrected Redis figures; each with
    its clicks not charged (Redis: a closed period's are its export's)."""
    periods = reader.between(span.start_ms, span.end_ms)
    pipe = reader.pipeline()
    for p in periods:
        reader.queue_charges(pipe, p.key, "adv", advertiser_id)
    results = iter(pipe.execute())
    out = []
    for p in periods:
        billed, not_charged = charges_of(results)
        corrected = billed.corrected
        export = exports.file(p.key, PARQUET_FILE) if p.closed else None
        if export is not None:
            out.append(_from_export(p, export, advertiser_id, not_charged))
        elif not (corrected.is_zero and not_charged.is_zero):
            status = CLOSED_WITHOUT_EXPORT if p.closed else PROVISIONAL
            out.append(
                PeriodCharges(p.key, p.start_ms, status, corrected.clicks, corrected.micros, not_charged=not_charged)
            )
    return out


def _from_export(period: Period, path: Any, advertiser_id: str, not_charged: NotCharged) -> PeriodCharges:
    table = pq.read_table(
        path,
        columns=["record_type", "advertiser_id", "status", "net_micros", "reason"],
        filters=[("advertiser_id", "=", advertiser_id)],
    )
    clicks = table.filter(pc.equal(table["record_type"], "click"))
    adjustments = table.filter(pc.equal(table["record_type"], "adjustment"))
    billed = clicks.filter(pc.not_equal(clicks["status"], "retracted"))
    credits = adjustments.filter(pc.is_in(adjustments["reason"], value_set=pa.array(sorted(INVALID_REASONS))))
    return PeriodCharges(
        period.key,
        period.start_ms,
        CLOSED,
        billed.num_rows,
        int(pc.sum(clicks["net_micros"]).as_py() or 0),
        int(pc.sum(adjustments["net_micros"]).as_py() or 0),
        adjustments.num_rows,
        not_charged,
        int(pc.sum(credits["net_micros"]).as_py() or 0),
    )


CHARGES_COLUMNS = (
    "period",
    "period_start_utc",
    "status",
    "advertiser_id",
    "campaign_id",
    "ad_id",
    "clicks",
    "provisional_micros",
    "corrections_micros",
    "amount_micros",
    "amount",
    "currency",
)


def charges_csv(
    reader: PeriodReader,
    catalog: CatalogView,
    advertiser_id: str,
    span: DateRange,
    campaign_id: str | None = None,
    ad_id: str | None = None,
) -> str:
    """The advertiser's charges per period and ad in the span (of one campaign or ad when given): what the stream
    billed, what reconciliation corrected, and the corrected amount (micros and decimal); open periods are marked
    provisional."""
    wanted_campaign, wanted_ad = campaign_id, ad_id
    periods = reader.between(span.start_ms, span.end_ms)
    own_ads = {ad.ad_id: ad.campaign_id for ad in catalog.get() if ad.advertiser_id == advertiser_id}
    pipe = reader.pipeline()
    for p in periods:
        pipe.smembers(reader.keys.period_ads(p.key, advertiser_id))
    listed = pipe.execute()
    pipe = reader.pipeline()
    wanted = []
    for p, ads in zip(periods, listed, strict=True):
        for ad_id in sorted(set(ads) | set(own_ads)):
            wanted.append((p, ad_id))
            reader.queue_ad(pipe, p.key, ad_id)
    results = iter(pipe.execute())
    currency = catalog.currency(advertiser_id)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CHARGES_COLUMNS)
    for p, ad_id in wanted:
        totals, fixes = next(results), next(results)
        if totals[3] not in (None, advertiser_id):
            continue  # another advertiser's ad never shows here
        campaign = own_ads.get(ad_id) or totals[2] or ""
        if wanted_campaign not in (None, campaign) or wanted_ad not in (None, ad_id):
            continue
        provisional, corrections = figures_of(totals), figures_of(fixes)
        corrected = provisional + corrections
        if provisional.is_zero and corrections.is_zero:
            continue
        writer.writerow(
            [
                p.key,
                _utc(p.start_ms),
                "closed" if p.closed else "provisional",
                safe_cell(advertiser_id),
                safe_cell(campaign),
                safe_cell(ad_id),
                corrected.clicks,
                provisional.micros,
                corrections.micros,
                corrected.micros,
                format_amount(corrected.micros, currency),
                currency,
            ]
        )
    return out.getvalue()


NOT_CHARGED_COLUMNS = (
    "click_id", "click_time", "period", "ad_id", "campaign_id", "reason", "would_have_cost", "amount_micros",
    "currency", "status",
)  # fmt: skip
"""The not-charged list's CSV: what it would have cost in decimal (`billing.money.format_amount`, exact) and in
micros; `status` `final` (the closed period's export) or `provisional` (the stream's decision, the period still
open)."""


def not_charged_csv(page: NotChargedClicks) -> str:
    """The advertiser's not-charged clicks (`page.items`: every one asked for) as CSV, spreadsheet-safe."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(NOT_CHARGED_COLUMNS)
    for c in page.items:
        cost = None if c.amount_micros is None else format_amount(c.amount_micros, c.currency or "")
        writer.writerow(
            _cell(v)
            for v in (
                c.click_id, _iso(c.click_time), c.period, c.ad_id, c.campaign_id, c.reason, cost, c.amount_micros,
                c.currency, "final" if c.final else "provisional",
            )
        )  # fmt: skip
    return out.getvalue()


def month_export_csv(exports: ExportFolder, span: DateRange) -> str | None:
    """Every closed period's export in the span as one CSV (the exports' rows and columns in period order, plus
    `net_amount`, the decimal of `net_micros`); None when no export of the span is on file."""
    tables = []
    for manifest in sorted(exports.finished(), key=lambda m: m.period_start_ms):  # the files on disk are the truth
        if not span.start_ms <= manifest.period_start_ms < span.end_ms:
            continue
        path = exports.file(manifest.period, PARQUET_FILE)
        if path is not None and exports.file(manifest.period, CSV_FILE) is not None:
            tables.append(pq.read_table(path))
    if not tables:
        return None
    table = pa.concat_tables(tables)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    names = table.column_names
    writer.writerow([*names, "click_time_utc", "impression_time_utc", "net_amount"])
    for row in table.to_pylist():
        writer.writerow(
            [
                *(_cell(row[n]) for n in names),
                _iso(row.get("click_time")),
                _iso(row.get("impression_time")),
                format_amount(int(row["net_micros"]), str(row.get("currency") or "")),
            ]
        )
    return out.getvalue()


MONTH_ADVERTISERS_COLUMNS = (
    "month",
    "advertiser_id",
    "currency",
    "status",
    "clicks",
    "micros",
    "amount",
    "invalid_clicks_not_charged",
    "invalid_micros_not_charged",
    "over_budget_clicks_not_charged",
    "over_budget_micros_not_charged",
    "invoice",
    "invoice_total_micros",
    "invoice_total",
)


def month_advertisers_csv(
    month: str, figures: FinanceRange, invoices: Iterable[Invoice], month_over: bool = True
) -> str:
    """The month per advertiser: its corrected clicks and micros (a closed period's as its export says), an exact
    decimal beside, what was not charged, and its invoice (number and total) once issued; `provisional` while a
    period of the month is open or the month is not over."""
    issued = {i.advertiser_id: i for i in invoices}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(MONTH_ADVERTISERS_COLUMNS)
    status = "closed" if figures.closed and month_over else "provisional"
    for line in figures.advertisers:
        corrected, invoice = line.billed.corrected, issued.get(line.advertiser_id)
        writer.writerow(
            [
                month,
                safe_cell(line.advertiser_id),
                line.currency,
                status,
                corrected.clicks,
                corrected.micros,
                format_amount(corrected.micros, line.currency or ""),
                line.not_charged.invalid.clicks,
                line.not_charged.invalid.micros,
                line.not_charged.over_budget.clicks,
                line.not_charged.over_budget.micros,
                invoice.label if invoice else "",
                invoice.totals.total_micros if invoice else "",
                format_amount(invoice.totals.total_micros, invoice.currency) if invoice else "",
            ]
        )
    return out.getvalue()


def _iso(ms: Any) -> str:
    """Epoch ms as ISO-8601 UTC (`2026-01-01T00:00:05.000Z`), empty for none."""
    return "" if ms is None else format_utc(int(ms))


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return safe_cell(value) if isinstance(value, str) else value


def _utc(ms: int) -> str:
    from web.display import utc

    return utc(ms)
