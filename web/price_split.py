"""An ad's clicks and spend split by the price they were charged at (after a price change, how many clicks were at
the old price and how many at the new), for the ad's page and its API document.

Counted from the books in the data folder's files (`billing.store.click_story.ClickStories.by_price`), by the click's
period within the date range: a closed period as its export and the adjustments booked for it later, an open one as
the ledger and its corrections. The spend of a price is its clicks times the price, to the micro.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import current_app

from billing.store.click_story import ClickStories
from web.ranges import DateRange

EXTENSION = "adbill_click_stories"
"""Where the app keeps its `ClickStories` (`web.click_pages.register`)."""


@dataclass(frozen=True, slots=True)
class PriceLine:
    """The clicks charged at one price, and what they cost."""

    price_micros: int
    clicks: int

    @property
    def micros(self) -> int:
        return self.price_micros * self.clicks


def clicks_by_price(ad_id: str, span: DateRange | None) -> list[PriceLine]:
    """The ad's charged clicks of the range's periods by price, dearest first (none without a range)."""
    if span is None:
        return []
    stories: ClickStories = current_app.extensions[EXTENSION]
    periods = stories.periods
    first, last = periods.key_of(span.start_ms), periods.key_of(span.end_ms - 1)
    return [PriceLine(price, clicks) for price, clicks in stories.by_price(ad_id, first, last)]


def by_price_document(lines: list[PriceLine]) -> list[dict[str, Any]]:
    """As the API writes them: micros as strings."""
    return [{"price_micros": str(x.price_micros), "clicks": x.clicks, "micros": str(x.micros)} for x in lines]
