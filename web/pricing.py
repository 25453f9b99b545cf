"""The price behind a charge: what one click of an ad costs at a moment, as the catalog's price history says.

The one place the pages ask (`billing.catalog.Ad.price_at`), so that the ad and campaign pages and the API agree.
"""

from __future__ import annotations

from billing.catalog import Catalog


def price_per_click(catalog: Catalog, ad_id: str, at_ms: int) -> int | None:
    """The ad's price of one click in micros in force at `at_ms` (the pages ask for now), or None when the ad is
    paused then, not created yet, or unknown to the catalog."""
    ad = catalog.get(ad_id)
    if ad is None:
        return None
    price = ad.price_at(at_ms)
    return price if isinstance(price, int) and not isinstance(price, bool) else None
