"""What a person asks of the catalog, as a change: create an ad, set its price, pause it, resume it; set a
campaign's daily budget; exclude an IP range or include it again.

The one reading of such a request for the command line (`adbill catalog`, `adbill ivt`), the web UI's admin pages
and its API, and the replay of recorded `ad` lines, so each refuses the same things with the same one-line message
(`billing.catalog.CatalogError`). The catalog itself refuses what no change may do (`Catalog.with_change`,
`with_budget`, `with_exclusion`); here is what a request may get wrong before that: a price or budget that is not a
whole number of micros, an action it does not know, a resume with no price to go back to, a budget that is neither
an amount nor unlimited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from billing.budgets import BudgetChange
from billing.catalog import (
    Ad,
    AdChange,
    BudgetSetting,
    Catalog,
    CatalogError,
    ExclusionSetting,
    MadeBy,
    PriceChange,
    UnknownAdError,
    format_time,
)
from billing.invalid import ExclusionChange
from billing.money import format_micros

CHANGE_ACTIONS = ("set-price", "pause", "resume")
"""The changes a person can ask for of an ad the catalog holds."""

ACTIONS = ("create-ad", *CHANGE_ACTIONS)
"""The changes a person can ask for."""

_WHOLE = re.compile(r"[0-9]+", re.ASCII)


def change_action(action: object) -> str:
    """`action` when it is one of `CHANGE_ACTIONS`; CatalogError naming them otherwise."""
    if action not in CHANGE_ACTIONS:
        raise CatalogError(f"unknown catalog action {action!r}; one of {', '.join(CHANGE_ACTIONS)}")
    return str(action)


def parse_micros(text: object, what: str, example: str) -> int:
    """An amount in micros from the request (text or an integer); CatalogError unless a non-negative whole number
    that fits in 63 bits. `what` names it in the refusal ("a price"), `example` is one written in micros."""
    if isinstance(text, bool):
        raise CatalogError(f"{what} is a whole number of micros, got {text!r}")
    if isinstance(text, int):
        value = text
    elif isinstance(text, str) and _WHOLE.fullmatch(text.strip()):
        value = int(text.strip())
    elif isinstance(text, str) and text.strip().startswith("-"):
        raise CatalogError(f"{what} must not be negative, got {text.strip()}")
    else:
        raise CatalogError(f"{what} is a whole number of micros such as {example}, got {text!r}")
    if value < 0:
        raise CatalogError(f"{what} must not be negative, got {value}")
    if value > 2**63 - 1:
        raise CatalogError(f"{what} must fit in 63 bits, got {value}")
    return value


def parse_price(text: object) -> int:
    """A price in micros from the request (text or an integer); CatalogError unless a non-negative whole number."""
    return parse_micros(text, "a price", "250000 (0.25 of the currency)")


@dataclass(frozen=True, slots=True)
class AdRequest:
    """What a person asks of an ad, as typed (a command's options, a form, a JSON body): `action` (one of `ACTIONS`),
    the ad, its price as given (text or an integer, read by `parse_price`; None: none given), and the campaign,
    advertiser and currency it names (a new ad's owners; checked against an existing ad's own, which never change)."""

    action: str
    ad_id: str
    cpc_micros: object = None
    campaign_id: str | None = None
    advertiser_id: str | None = None
    currency: str | None = None

    def change(self, at_ms: int, catalog: Catalog | None) -> AdChange:
        """The change asked for from `at_ms` on, read against `catalog` (None: no catalog yet)."""
        action, ad_id, cpc_micros = self.action, self.ad_id, self.cpc_micros
        if action not in ACTIONS:
            raise CatalogError(f"unknown catalog action {action!r}; one of {', '.join(ACTIONS)}")
        ad = catalog.get(ad_id) if catalog is not None else None
        if action == "create-ad":
            if ad is not None:
                raise CatalogError(f"ad {ad_id} exists already (advertiser {ad.advertiser_id}); set its price instead")
            if cpc_micros is None:
                raise CatalogError(f"create-ad {ad_id}: give its price in micros")
            given = (("campaign", self.campaign_id), ("advertiser", self.advertiser_id), ("currency", self.currency))
            missing = [name for name, value in given if not value]
            if missing:
                raise CatalogError(f"create-ad {ad_id}: give its {', '.join(missing)}")
            return AdChange(ad_id, at_ms, parse_price(cpc_micros), self.campaign_id, self.advertiser_id, self.currency)
        if ad is None:
            raise UnknownAdError(f"unknown ad {ad_id}")
        owners = AdChange(ad_id, at_ms, None, self.campaign_id, self.advertiser_id, self.currency)  # the catalog checks
        if action == "set-price":
            if cpc_micros is None:
                raise CatalogError(f"set-price {ad_id}: give the new price in micros")
            return _with_price(owners, parse_price(cpc_micros))
        if action == "pause":
            entry = ad.entry_at(at_ms)
            if entry is not None and entry.paused:
                raise CatalogError(f"ad {ad_id} is already paused at {format_time(at_ms)}")
            return owners
        entry = ad.entry_at(at_ms)
        if entry is None or not entry.paused:
            raise CatalogError(f"ad {ad_id} is not paused at {format_time(at_ms)}: set its price instead")
        if cpc_micros is not None:
            return _with_price(owners, parse_price(cpc_micros))
        before = last_price(ad, at_ms)
        if before is None:
            raise CatalogError(f"ad {ad_id} never had a price before {format_time(at_ms)}: give one in micros")
        return _with_price(owners, before)


def ad_line_change(line: dict[str, object]) -> AdChange:
    """The change a recorded `ad` line makes (docs/billing-rules.md, "Recorded traffic"): it creates the ad or sets its
    price (`cpc_micros` null pauses it) from its own `effective_from`."""
    try:
        ad_id, at_ms = line["ad_id"], line["effective_from"]
    except KeyError as exc:
        raise CatalogError(f"an ad line needs {exc.args[0]!r}") from None
    if not isinstance(ad_id, str) or isinstance(at_ms, bool) or not isinstance(at_ms, int):
        raise CatalogError("an ad line's ad_id is a string and its effective_from epoch ms")
    price = line.get("cpc_micros")
    owners = {name: line.get(name) for name in ("campaign_id", "advertiser_id", "currency")}
    if any(value is not None and not isinstance(value, str) for value in owners.values()):
        raise CatalogError("an ad line's campaign_id, advertiser_id and currency are strings")
    return AdChange(
        ad_id,
        at_ms,
        None if price is None else parse_price(price),
        owners["campaign_id"],  # type: ignore[arg-type]
        owners["advertiser_id"],  # type: ignore[arg-type]
        owners["currency"],  # type: ignore[arg-type]
    )


def last_price(ad: Ad, at_ms: int) -> int | None:
    """The last price the ad had in force at or before `at_ms` (None: it never had one)."""
    for entry in reversed(ad.prices):
        if entry.effective_from <= at_ms and entry.cpc_micros is not None:
            return entry.cpc_micros
    return None


def price_status(ad: Ad, at_ms: int) -> str:
    """The ad's price at `at_ms` for a person: `0.250000 EUR`, `paused`, or `not yet live`."""
    entry = ad.entry_at(at_ms)
    if entry is None:
        return f"not yet live (from {format_time(ad.created_at)})"
    return "paused" if entry.cpc_micros is None else format_micros(entry.cpc_micros, ad.currency)


def describe_entry(entry: PriceChange, currency: str) -> str:
    """One history entry for a person: `from 2026-01-01T10:00:00.000Z: 0.250000 EUR (version 3)`."""
    price = "paused" if entry.cpc_micros is None else format_micros(entry.cpc_micros, currency)
    return f"from {format_time(entry.effective_from)}: {price} (version {entry.version})"


def _with_price(change: AdChange, cpc_micros: int) -> AdChange:
    return AdChange(
        change.ad_id, change.effective_from, cpc_micros, change.campaign_id, change.advertiser_id, change.currency
    )


# Budgets ----------------------------------------------------------------------------------------------------------


def parse_budget(text: object) -> int:
    """A daily budget in micros from the request (text or an integer); CatalogError unless a non-negative whole
    number."""
    return parse_micros(text, "a daily budget", "50000000 (50 of the currency)")


def budget_change(
    campaign_id: str,
    at_ms: int,
    catalog: Catalog | None,
    *,
    daily_micros: object = None,
    unlimited: bool = False,
    made_by: MadeBy | None = None,
) -> BudgetSetting:
    """The budget change asked for `campaign_id` from `at_ms` on, read against `catalog` (None: no catalog yet): a
    daily budget in micros, or unlimited, exactly one of them."""
    if not campaign_id:
        raise CatalogError("set-budget needs the campaign's id")
    if catalog is None or catalog.advertiser_of_campaign(campaign_id) is None:
        raise CatalogError(f"unknown campaign {campaign_id}: a budget is set on a campaign that has ads")
    if unlimited and daily_micros is not None:
        raise CatalogError(f"set-budget {campaign_id}: give a daily budget in micros or unlimited, not both")
    if not unlimited and daily_micros is None:
        raise CatalogError(f"set-budget {campaign_id}: give the daily budget in micros, or unlimited")
    return BudgetSetting(campaign_id, at_ms, None if unlimited else parse_budget(daily_micros), made_by)


def budget_text(micros: int | None, currency: str | None) -> str:
    """A daily budget for a person: `50.000000 EUR a day`, or `unlimited`."""
    return "unlimited" if micros is None else f"{format_micros(micros, currency or '')} a day"


def made_text(entry: BudgetChange | ExclusionChange) -> str:
    """Who made an entry, through which door and when: `by ada (page) at 2026-01-01T10:00:00.000Z`; empty for an
    entry that does not say."""
    if entry.made_by is None:
        return ""
    when = f" at {format_time(entry.made_at)}" if entry.made_at is not None else ""
    return f"by {entry.made_by} ({entry.door or 'unknown door'}){when}"


def describe_budget(entry: BudgetChange, currency: str | None) -> str:
    """One budget entry for a person: `from 2026-01-01T10:00:00.000Z: 50.000000 EUR a day (version 3, by ...)`."""
    made = made_text(entry)
    return (
        f"from {format_time(entry.effective_from)}: {budget_text(entry.daily_budget_micros, currency)} "
        f"(version {entry.version}{', ' + made if made else ''})"
    )


# The IP exclusion list --------------------------------------------------------------------------------------------

EXCLUSION_ACTIONS = ("exclude", "include")
"""Exclude a range from a time on, or include it again (no longer excluded)."""


def exclusion_change(action: str, cidr: str, at_ms: int, made_by: MadeBy | None = None) -> ExclusionSetting:
    """The change `action` (`exclude`, `include`) asks for the range `cidr` from `at_ms` on; the catalog refuses a
    range that is not one, or that is already in that state then (`Catalog.with_exclusion`)."""
    if action not in EXCLUSION_ACTIONS:
        raise CatalogError(f"unknown IP exclusion action {action!r}; one of {', '.join(EXCLUSION_ACTIONS)}")
    if not isinstance(cidr, str) or not cidr.strip():
        raise CatalogError(f"ivt {action} needs an IP range such as 203.0.113.0/24 or 2001:db8::/32")
    return ExclusionSetting(cidr.strip(), at_ms, action == "exclude", made_by)


def describe_exclusion(entry: ExclusionChange) -> str:
    """One entry of the exclusion list for a person: `203.0.113.0/24 excluded from 2026-...Z (version 4, by ...)`."""
    made = made_text(entry)
    state = "excluded" if entry.excluded else "no longer excluded"
    return (
        f"{entry.cidr} {state} from {format_time(entry.effective_from)} "
        f"(version {entry.version}{', ' + made if made else ''})"
    )
