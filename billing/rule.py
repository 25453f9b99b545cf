"""The attribution rule of the billing contract, in plain Python.

A click is billable when an impression of the same ad for the same user happened at most 10 s before it (both
bounds inclusive, to the millisecond). The click is billed once, attributed to the latest qualifying
impression (ties: the smallest impression id), at the ad's price in force at the click's time
(`billing.catalog.Catalog.price`). This is the exact reference that
reconciliation and the tests hold the streaming join to.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from billing.catalog import Catalog, Unbillable
from billing.events import Click, Impression

ATTRIBUTION_WINDOW_MS = 10_000
"""A click is billable up to this many milliseconds after its impression, inclusive."""


@dataclass(frozen=True, slots=True)
class BillableClick:
    """One billed click: the click, its attributed impression, who pays and how much (integer micros)."""

    click_id: str
    impression_id: str
    ad_id: str
    campaign_id: str
    advertiser_id: str
    user_id: str
    click_time: int
    impression_time: int
    amount_micros: int
    currency: str

    def to_dict(self) -> dict[str, Any]:
        """The row as a plain dict, in field order."""
        return asdict(self)


class _ImpressionTimes:
    """The impressions of one (ad, user), sorted by (event_time, impression_id), as two parallel lists."""

    __slots__ = ("times", "ids")

    def __init__(self, pairs: list[tuple[int, str]]) -> None:
        pairs.sort()
        self.times = [time for time, _ in pairs]
        self.ids = [impression_id for _, impression_id in pairs]

    def attributed(self, click_time: int) -> tuple[int, str] | None:
        """(time, id) of the latest impression in [click_time - window, click_time]; smallest id on a tie."""
        last = bisect_right(self.times, click_time) - 1
        if last < 0 or self.times[last] < click_time - ATTRIBUTION_WINDOW_MS:
            return None
        latest = self.times[last]
        # Ids are sorted within equal times, so the first impression at `latest` has the smallest id.
        return latest, self.ids[bisect_left(self.times, latest)]


BILLABLE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(BillableClick))
"""The columns of a bill, in order: what the rule produces, in plain Python and on DataFrames alike."""


def attribute(impressions: Iterable[Impression], clicks: Iterable[Click], catalog: Catalog) -> list[BillableClick]:
    """Apply the attribution rule to de-duplicated, validated events; one row per billable click, by click_id.

    A click is priced by the catalog's history at its event time; one with no price then (its ad unknown, not yet
    created, or paused: `billing.catalog.Unbillable`) is not billable, and is left out. An identical repeat of
    an event is ignored; two different events with the same id raise ValueError, because the intake must have
    decided which copy stands before the rule runs.
    """
    seen_impressions: dict[str, Impression] = {}
    by_ad_user: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for imp in impressions:
        earlier = seen_impressions.setdefault(imp.impression_id, imp)
        if earlier is not imp:
            _same_or_conflict(earlier, imp)
            continue
        by_ad_user[(imp.ad_id, imp.user_id)].append((imp.event_time, imp.impression_id))
    # Sorted lazily, on the first click of an (ad, user): most pairs of a real stream never see a click.
    index: dict[tuple[str, str], _ImpressionTimes] = {}

    seen_clicks: dict[str, Click] = {}
    billable: list[BillableClick] = []
    for click in clicks:
        earlier_click = seen_clicks.setdefault(click.click_id, click)
        if earlier_click is not click:
            _same_or_conflict(earlier_click, click)
            continue
        key = (click.ad_id, click.user_id)
        if key not in by_ad_user:
            continue
        times = index.get(key)
        if times is None:
            times = index[key] = _ImpressionTimes(by_ad_user[key])
        match = times.attributed(click.event_time)
        if match is None:
            continue
        priced = catalog.price(click.ad_id, click.event_time)
        if isinstance(priced, Unbillable):
            continue
        ad, amount = priced
        impression_time, impression_id = match
        billable.append(
            BillableClick(
                click_id=click.click_id,
                impression_id=impression_id,
                ad_id=ad.ad_id,
                campaign_id=ad.campaign_id,
                advertiser_id=ad.advertiser_id,
                user_id=click.user_id,
                click_time=click.event_time,
                impression_time=impression_time,
                amount_micros=amount,
                currency=ad.currency,
            )
        )
    billable.sort(key=lambda row: row.click_id)
    return billable


def _same_or_conflict(earlier: Impression | Click, later: Impression | Click) -> None:
    if earlier != later:
        raise ValueError(
            f"two different {later.type}s share the id {later.event_id!r}: {earlier} and {later}; "
            "resolve id conflicts in the intake before applying the rule"
        )
