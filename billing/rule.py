"""The billing contract's rule, in plain Python: attribution, price, invalid traffic and budgets.

A click is billable when an impression of the same ad for the same user happened at most 10 s before it (both
bounds inclusive, to the millisecond). The click is billed once, attributed to the latest qualifying
impression (ties: the smallest impression id), at the ad's price in force at the click's time
(`billing.catalog.Catalog.price`); it is charged unless it is invalid (`billing.invalid`) or over its campaign's
daily budget (`billing.budgets`). A click's outcome is exactly one of: charged, or not charged for one reason
(`unknown_ad`, `ad_paused`, an invalid traffic rule, `over_budget`, in that order), or not billable. This is the
exact reference that reconciliation and the tests hold the streaming job to.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from billing.budgets import OVER_BUDGET, Candidate, charge_in_order
from billing.catalog import Catalog, Unbillable
from billing.events import Click, Impression
from billing.invalid import DEFAULT_RULES, IvtRules, judge_clicks

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


@dataclass(frozen=True, slots=True)
class NotCharged:
    """A click the attribution rule bills that is not charged, and why: `unknown_ad` or `ad_paused` (no price at its
    time: no owners or amount when the catalog does not know the ad), an invalid traffic rule
    (`billing.invalid.InvalidReason`), or `over_budget` (`billing.budgets`)."""

    click_id: str
    impression_id: str
    ad_id: str
    campaign_id: str | None
    advertiser_id: str | None
    user_id: str
    click_time: int
    impression_time: int
    amount_micros: int | None
    currency: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NOT_CHARGED_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(NotCharged))


@dataclass(frozen=True)
class Billing:
    """The rule's whole answer for a set of events: the charged clicks and the billable ones not charged, by id."""

    charged: list[BillableClick]
    not_charged: list[NotCharged]

    def reasons(self) -> dict[str, str]:
        """click id -> why it is not charged."""
        return {row.click_id: row.reason for row in self.not_charged}


def bill(
    impressions: Iterable[Impression],
    clicks: Iterable[Click],
    catalog: Catalog,
    *,
    is_bot: Callable[[str], bool] | None = None,
    rules: IvtRules = DEFAULT_RULES,
    spent: Mapping[tuple[str, str], int] | None = None,
) -> Billing:
    """Apply the contract to de-duplicated, validated events: which billable clicks are charged, and why the others
    are not.

    A click is billable when an impression of its ad and user is at most 10 s before it; it is priced by the
    catalog's history at its event time (`unknown_ad`, `ad_paused` when it has no price then), judged by the invalid
    traffic rules over every click given (`billing.invalid.judge_clicks`, with the crawler list's `is_bot`; None:
    no user agent matches), and charged in event-time order while it fits its campaign's daily budget
    (`billing.budgets.charge_in_order`, from the day totals `spent`, zero when None), else `over_budget`. An
    identical repeat of an event is ignored; two different events with the same id raise ValueError, because the
    intake must have decided which copy stands before the rule runs.
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
    matched: list[tuple[Click, int, str]] = []
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
        if match is not None:
            matched.append((click, *match))

    invalid = judge_clicks(
        seen_clicks.values(),
        is_bot=is_bot or _no_bot,
        exclusions=catalog.exclusions,
        rules=rules,
    )
    priced: list[BillableClick] = []
    not_charged: list[NotCharged] = []
    for click, impression_time, impression_id in matched:
        price = catalog.price(click.ad_id, click.event_time)
        if isinstance(price, Unbillable):
            ad = catalog.get(click.ad_id)
            not_charged.append(
                NotCharged(
                    click.click_id,
                    impression_id,
                    click.ad_id,
                    ad.campaign_id if ad else None,
                    ad.advertiser_id if ad else None,
                    click.user_id,
                    click.event_time,
                    impression_time,
                    None,
                    ad.currency if ad else None,
                    price.value,
                )
            )
            continue
        ad, amount = price
        priced.append(
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
    charged, refused = charge(priced, {c: r.value for c, r in invalid.items()}, catalog, spent)
    not_charged += refused
    charged.sort(key=lambda row: row.click_id)
    not_charged.sort(key=lambda row: row.click_id)
    return Billing(charged, not_charged)


def charge(
    priced: Iterable[BillableClick],
    invalid: Mapping[str, str],
    catalog: Catalog,
    spent: Mapping[tuple[str, str], int] | None = None,
) -> tuple[list[BillableClick], list[NotCharged]]:
    """The priced bills split into the charged ones and those not charged: the clicks `invalid` names (click id ->
    the rule's name) and, of the others, those over their campaign's daily budget in event-time order (from the day
    totals `spent`, zero when None)."""
    valid: list[BillableClick] = []
    not_charged: list[NotCharged] = []
    for row in priced:
        reason = invalid.get(row.click_id)
        if reason is not None:
            not_charged.append(not_charged_row(row, reason))
        else:
            valid.append(row)
    fits, _ = charge_in_order(
        (Candidate(r.click_id, r.campaign_id, r.click_time, r.amount_micros) for r in valid), catalog.budget_at, spent
    )
    charged = [row for row in valid if row.click_id in fits]
    not_charged += [not_charged_row(row, OVER_BUDGET) for row in valid if row.click_id not in fits]
    return charged, not_charged


def not_charged_row(row: BillableClick, reason: str) -> NotCharged:
    """A priced bill that is not charged, for `reason`."""
    return NotCharged(
        row.click_id,
        row.impression_id,
        row.ad_id,
        row.campaign_id,
        row.advertiser_id,
        row.user_id,
        row.click_time,
        row.impression_time,
        row.amount_micros,
        row.currency,
        reason,
    )


def _no_bot(user_agent: str) -> bool:
    return False


def _same_or_conflict(earlier: Impression | Click, later: Impression | Click) -> None:
    if earlier.content != later.content:
        raise ValueError(
            f"two different {later.type}s share the id {later.event_id!r}: {earlier} and {later}; "
            "resolve id conflicts in the intake before applying the rule"
        )
