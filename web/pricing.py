"""The price behind a charge: what one click of an ad costs, as the catalog says.

Kept in this one function so that the pages ask one place: the catalog holds one current price per ad today; when it
holds each ad's price history, this answers with the price in force at the time asked for.
"""

from __future__ import annotations

from billing.catalog import Catalog


def price_per_click(catalog: Catalog, ad_id: str, at_ms: int | None = None) -> int | None:
    """The ad's price of one click in micros (the catalog's current price; `at_ms` is for the price history), or
    None when the catalog does not know the ad."""
    ad = catalog.get(ad_id)
    return None if ad is None else ad.cpc_micros
