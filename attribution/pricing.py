"""Matched clicks priced by the catalog's history, as Arrow tables: the one pricing step of the streaming job's sink,
of the closing run's final bills and of the audit. Pure pyarrow over `billing.catalog.Catalog.price`.

In: rows with at least `ad_id` and `click_time` (`attribution.join.MATCH_COLUMNS`). Out: the rows priced at the
entry in force at each click's time (`campaign_id`, `advertiser_id`, `amount_micros`, `currency` added), and the
rows with no price then, with the reason (`billing.catalog.Unbillable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from billing.catalog import Catalog, Unbillable

PRICE_COLUMNS = ("campaign_id", "advertiser_id", "amount_micros", "currency")
"""What pricing adds to a matched click."""

UNBILLED_COLUMNS = (
    "click_id",
    "impression_id",
    "ad_id",
    "advertiser_id",
    "user_id",
    "click_time",
    "impression_time",
    "reason",
)
"""A matched click without a price: the match, the ad's advertiser when the catalog knew the ad (else null), and
`reason` (`ad_paused` or `unknown_ad`)."""


@dataclass(frozen=True)
class Priced:
    """Matched clicks split by the catalog: `bills` (priced) and `unbilled` (no price at their time, `reason`)."""

    bills: pa.Table
    unbilled: pa.Table


def price_matches(matches: pa.Table, catalog: Catalog) -> Priced:
    """Price each matched click at its `click_time` (`Catalog.price`)."""
    ads = matches.column("ad_id").to_pylist()
    times = matches.column("click_time").to_pylist()
    campaign: list[str | None] = []
    advertiser: list[str | None] = []
    amount: list[int | None] = []
    currency: list[str | None] = []
    reason: list[str | None] = []
    for ad_id, at_ms in zip(ads, times, strict=True):
        priced = catalog.price(ad_id, at_ms)
        if isinstance(priced, Unbillable):
            campaign.append(None)
            advertiser.append(catalog.advertiser_of(ad_id))
            amount.append(None)
            currency.append(None)
            reason.append(priced.value)
        else:
            ad, micros = priced
            campaign.append(ad.campaign_id)
            advertiser.append(ad.advertiser_id)
            amount.append(micros)
            currency.append(ad.currency)
            reason.append(None)
    unpriced = pa.array([r is not None for r in reason], pa.bool_())
    with_prices = matches
    for name, values, kind in (
        ("campaign_id", campaign, pa.string()),
        ("advertiser_id", advertiser, pa.string()),
        ("amount_micros", amount, pa.int64()),
        ("currency", currency, pa.string()),
    ):
        with_prices = _set_column(with_prices, name, pa.array(values, kind))
    bills = with_prices.filter(pc.invert(unpriced))
    unbilled = _set_column(with_prices, "reason", pa.array(reason, pa.string())).filter(unpriced)
    return Priced(bills, unbilled)


def _set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    index = table.schema.get_field_index(name)
    if index >= 0:
        return table.set_column(index, name, values)
    return table.append_column(name, values)
