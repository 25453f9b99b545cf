"""A closed month on files, as reconciliation leaves it: December 2025's exports (click rows billed, added and
retracted, and adjustments for November), the corrections made before each period closed, and billing profiles; for
the invoice tests. Amounts are chosen so that a net has digits below the minor unit and a JPY net ends in a half."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from billing.catalog import Catalog
from billing.corrections import Correction, CorrectionKind, correction_id
from billing.layout import DataLayout
from billing.periods import Periods
from billing.profiles import profile_change
from billing.store.corrections_arrow import corrections_to_arrow
from billing.store.export_files import export_table, write_export
from billing.store.profiles_db import ProfileDatabase

MONTH = "2025-12"
PERIODS = ("20251231T2200Z", "20251231T2300Z")
EUR_PRICE = 123_456  # 0.123456 EUR a click: the net has micros below the cent
JPY_PRICE = 40_500_000  # 40.5 JPY a click: three of them, 121.5 JPY, round to 122
PROFILE_FROM = 1_764_547_200_000  # 2025-12-01T00:00Z


@dataclass(frozen=True)
class ClosedMonth:
    own_net: int
    other_net: int


def write_closed_month(layout: DataLayout, catalog: Catalog, own: str, other: str, database_url: str) -> ClosedMonth:
    """December's two last hours closed for `own` (EUR) and `other` (JPY), with their corrections, and their
    profiles in the database at `database_url`."""
    periods = Periods()
    own_ad = next(a for a in catalog if a.advertiser_id == own)
    other_ad = next(a for a in catalog if a.advertiser_id == other)
    fixes: dict[str, list[Correction]] = {p: [] for p in PERIODS}
    rows: dict[str, list[dict[str, Any]]] = {p: [] for p in PERIODS}

    def click(period: str, n: int, ad: Any, price: int, status: str, reason: str | None = None) -> None:
        start = periods.parse_key(period)
        click_id = f"c-{period}-{ad.ad_id}-{n}"
        cid = None
        if reason is not None:
            kind = CorrectionKind.ADDITION if status == "added" else CorrectionKind.RETRACTION
            cid = correction_id(kind, click_id, period, 0)
            fixes[period].append(
                Correction(
                    cid,
                    kind,
                    click_id,
                    f"i-{click_id}",
                    ad.ad_id,
                    ad.campaign_id,
                    ad.advertiser_id,
                    price if kind == CorrectionKind.ADDITION else -price,
                    ad.currency,
                    reason,
                    period,
                    period,
                    start,
                )
            )
        rows[period].append(
            {
                "record_type": "click",
                "click_id": click_id,
                "impression_id": f"i-{click_id}",
                "ad_id": ad.ad_id,
                "campaign_id": ad.campaign_id,
                "advertiser_id": ad.advertiser_id,
                "user_id": "u1",
                "click_time": start + n,
                "impression_time": start + n - 1,
                "amount_micros": price,
                "net_micros": 0 if status == "retracted" else price,
                "currency": ad.currency,
                "status": status,
                "reason": reason,
                "correction_id": cid,
                "corrects_period": period,
                "booked_period": period,
            }
        )

    def adjustment(period: str, corrected: str, n: int, ad: Any, price: int, kind: str, reason: str) -> None:
        click_id = f"c-{corrected}-{ad.ad_id}-{n}"
        signed = price if kind == "addition" else -price
        rows[period].append(
            {
                "record_type": "adjustment",
                "click_id": click_id,
                "impression_id": None,
                "ad_id": ad.ad_id,
                "campaign_id": ad.campaign_id,
                "advertiser_id": ad.advertiser_id,
                "user_id": None,
                "click_time": None,
                "impression_time": None,
                "amount_micros": price,
                "net_micros": signed,
                "currency": ad.currency,
                "status": "added" if kind == "addition" else "retracted",
                "reason": reason,
                "correction_id": correction_id(kind, click_id, corrected, 0),
                "corrects_period": corrected,
                "booked_period": period,
            }
        )

    # 22:00: eight EUR clicks billed live, one late click added, one duplicate retracted; an invalid activity
    # credit and a late click for November's hours closed earlier.
    for n in range(8):
        click(PERIODS[0], n, own_ad, EUR_PRICE, "billed")
    click(PERIODS[0], 8, own_ad, EUR_PRICE, "added", "late_click")
    click(PERIODS[0], 9, own_ad, EUR_PRICE, "retracted", "duplicate")
    adjustment(PERIODS[0], "20251130T1000Z", 1, own_ad, EUR_PRICE, "retraction", "known_bot")
    adjustment(PERIODS[0], "20251130T1100Z", 2, own_ad, EUR_PRICE, "addition", "late_click")
    # 23:00: three JPY clicks of the other advertiser, and one more EUR click.
    for n in range(3):
        click(PERIODS[1], n, other_ad, JPY_PRICE, "billed")
    click(PERIODS[1], 3, own_ad, EUR_PRICE, "billed")
    for period in PERIODS:
        start = periods.parse_key(period)
        write_export(layout.root, period, export_table(rows[period]), start, start + 3_600_000, start + 7_200_000)
        folder = layout.corrections_of(period)
        folder.mkdir(parents=True, exist_ok=True)
        if fixes[period]:
            import pyarrow.parquet as pq

            pq.write_table(corrections_to_arrow(fixes[period]), folder / "run-test.parquet")
    profiles = ProfileDatabase(database_url)
    profiles.change(
        lambda now: profile_change(own, "Acme SA", "1 Rue de Rivoli\n75001 Paris", "FR12345678901", "20", now),
        lambda: PROFILE_FROM,
    )
    profiles.change(
        lambda now: profile_change(other, "Kabushiki Kaisha", "Tokyo", "T1234", "10", now), lambda: PROFILE_FROM
    )
    own_net = sum(r["net_micros"] for p in PERIODS for r in rows[p] if r["advertiser_id"] == own)
    other_net = sum(r["net_micros"] for p in PERIODS for r in rows[p] if r["advertiser_id"] == other)
    return ClosedMonth(own_net, other_net)
