"""The ad catalog as the web UI shows and changes it: each ad's status and price now, the campaigns' daily budgets,
the IP exclusion list, and an admin's change made.

What a page and its API twin share (`web.catalog_pages`, `web.catalog_api`): the access checks (`catalog_or_404`,
`exclusions_or_404`), an ad's status at a time (`AdStatus`), a campaign's budget now (`BudgetStatus`), and
`make_change`, `make_budget_change` and `make_exclusion_change`, which read a request as the command line does
(`billing.catalog_changes`, so the web refuses what `adbill catalog` and `adbill ivt` refuse, with the same one-line
message) and make it in the catalog's database in one transaction (`billing.store.catalog_db.CatalogDatabase`), the
entry keeping who made it and through which door (`maker`). The web UI reads the catalog back by version like every
other part of the product; a change is seen by the streaming job and reconciliation within seconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from flask import Flask, abort, current_app, g, request

from billing.budgets import BudgetChange
from billing.catalog import Ad, Catalog, CatalogChange, CatalogError, MadeBy, PriceChange
from billing.catalog_changes import ACTIONS, AdRequest, budget_change, exclusion_change
from billing.invalid import ExclusionChange, IpExclusions
from billing.money import minor_digits, parse_amount
from billing.store.catalog_db import CatalogDatabase, LogEntries
from web import display
from web.access import Principal, may_change_catalog, may_see_finance
from web.guards import allowed_or_404, logged_in
from web.readers import is_id
from web.services import services

EXTENSION = "adbill_catalog"
"""Where `register` keeps the app's `CatalogDatabase` (`app.extensions`)."""

_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,3}))?)?Z?", re.ASCII)
_DIGITS = re.compile(r"[0-9]{1,16}", re.ASCII)


class Status(StrEnum):
    """Where an ad stands at a time."""

    LIVE = "live"
    PAUSED = "paused"
    NOT_YET_LIVE = "not_yet_live"
    """Its first entry takes effect later (or the ad does not exist yet at that time)."""

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


@dataclass(frozen=True, slots=True)
class AdStatus:
    """One ad as a person sees it at `at_ms`: its status, the price in force, the next change planned."""

    ad: Ad
    status: Status
    cpc_micros: int | None
    next_change: PriceChange | None

    @classmethod
    def of(cls, ad: Ad, at_ms: int) -> AdStatus:
        entry = ad.entry_at(at_ms)
        later = next((p for p in ad.prices if p.effective_from > at_ms), None)
        if entry is None:
            return cls(ad, Status.NOT_YET_LIVE, None, later)
        if entry.cpc_micros is None:
            return cls(ad, Status.PAUSED, None, later)
        return cls(ad, Status.LIVE, entry.cpc_micros, later)


def register(app: Flask, catalogs: CatalogDatabase) -> None:
    """Keep the catalog's store for the app's views (`create_app` calls this once)."""
    app.extensions[EXTENSION] = catalogs
    app.jinja_env.globals["price_changes"] = changes_by_version
    app.jinja_env.globals["made_of"] = made_of


def store() -> CatalogDatabase:
    found: CatalogDatabase = current_app.extensions[EXTENSION]
    return found


def catalog_or_404(change: bool = False) -> Principal:
    """Every ad of the catalog: finance and admin see it, only an admin changes it; anyone else gets 404."""
    return allowed_or_404(may_change_catalog if change else may_see_finance)


def change_or_404(path_id: str) -> Principal:
    """An admin's change of the ad or campaign a path names: 404 for anyone else (`catalog_or_404`) and for an id the
    web UI does not address (`web.readers.is_id`)."""
    principal = catalog_or_404(change=True)
    if not is_id(path_id):
        abort(404)
    return principal


def ads_of(catalog: Catalog, advertiser_id: str | None = None) -> list[Ad]:
    """The catalog's ads (of one advertiser when given), by advertiser, campaign and ad id."""
    if advertiser_id is None:
        return [catalog[ad_id] for ad_id in catalog.listed()]
    ads = [ad for campaign in catalog.campaigns_of(advertiser_id) for ad in catalog.ads_of_campaign(campaign)]
    return sorted(ads, key=lambda ad: (ad.campaign_id, ad.ad_id))


def catalog_now() -> tuple[Catalog, int]:
    """The catalog at its latest version and the time now (epoch ms), at which a page or document shows it."""
    svc = services()
    now = svc.clock()
    return svc.catalog.get(), now


def known_ad(ad_id: str) -> Ad | None:
    """The catalog's ad `ad_id`; None for an id the web UI does not address (`web.readers.is_id`) or an ad the catalog
    does not hold."""
    return services().catalog.get().get(ad_id) if is_id(ad_id) else None


def known_campaign(catalog: Catalog, campaign_id: str) -> bool:
    """Whether `campaign_id` is an id the web UI addresses and a campaign of `catalog`."""
    return is_id(campaign_id) and catalog.advertiser_of_campaign(campaign_id) is not None


ADS_PAGE = 500
"""Ads a page of the whole catalog lists (the admin's and finance's `/catalog`, `GET /api/v1/catalog/ads`)."""


def ads_page(catalog: Catalog, offset: int, limit: int) -> list[Ad]:
    """One page of every ad of the catalog, in `ads_of`'s order: a million ads are listed a page at a time."""
    return [catalog[ad_id] for ad_id in catalog.listed()[offset : offset + limit]]


class FieldError(CatalogError):
    """What a person typed in one field of a form, refused before it reaches the catalog: the page shows the message
    beside that field (`field`, the form field's name), in the terms the person typed it in."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Typed:
    """What a page's change forms show: what was typed in them (`form`; nothing on a page first opened) and, for a
    change refused, why (`error`, shown beside the field `error_field` when it is about one), with the status the
    page answers with (400; 200 when nothing was refused)."""

    form: Mapping[str, str] = field(default_factory=dict)
    error: str = ""
    error_field: str | None = None
    status: int = 200

    @classmethod
    def refused(cls, form: Mapping[str, str], refusal: Exception) -> Typed:
        """The form sent again, with the refusal's one-line message beside its field (a `FieldError`'s), 400."""
        return cls(form, str(refusal), refusal.field if isinstance(refusal, FieldError) else None, 400)


UNTYPED = Typed()
"""A page first opened: nothing typed, nothing refused."""


PRICE_DECIMALS = 6
"""A price, being per click, may be finer than the currency's minor unit (0.0035 EUR a click): down to the micro.
Budgets and every total are in the minor unit (`billing.money.minor_digits`)."""


def amount_rule(currency: str, minor_unit: bool) -> str:
    """How an amount is typed in `currency`, in words: `with at most 2 decimals (the minor unit of EUR)`."""
    if not minor_unit:
        return f"with at most {PRICE_DECIMALS} decimals (the micro)"
    digits = minor_digits(currency)
    if digits == 0:
        return f"in whole {currency} (it has no minor unit)"
    return f"with at most {digits} decimal{'s' if digits > 1 else ''} (the minor unit of {currency})"


def form_micros(
    form: dict[str, str], units_field: str, micros_field: str, what: str, currency: str = "", minor_unit: bool = False
) -> str | None:
    """The amount a form asks for, in micros as text (`AdRequest.change` and `budget_change` read it as the command
    reads its micros): typed in currency units in `units_field` (`0.50`, converted exactly: the digits are moved, no
    float), or in micros in `micros_field` (scripts, older forms); None when neither is given. Typed in units, it is
    checked here, before the catalog, with a message in the currency as typed (FieldError): a number, not negative,
    with at most six decimals (a price: the micro), or, with `minor_unit` (a budget), at most the currency's minor
    unit (none for JPY, two for EUR, three for KWD)."""
    units = form.get(units_field, "").strip()
    if not units:
        return form.get(micros_field, "").strip() or None
    in_currency = currency or "the advertiser's currency"
    rule = amount_rule(currency, minor_unit and bool(currency))
    digits = minor_digits(currency) if minor_unit and currency else PRICE_DECIMALS
    example = "0.25" if digits == PRICE_DECIMALS else ("50." + "0" * digits).rstrip(".")
    typed = f"{units} {currency}".strip()
    try:
        micros = parse_amount(units)
    except ValueError:
        micros = None
    if micros is None or micros % 10 ** (PRICE_DECIMALS - digits):
        message = f"{what} is an amount in {in_currency} such as {example}, {rule}: you typed {typed}"
        raise FieldError(units_field, message)
    if micros < 0:
        raise FieldError(units_field, f"{what} must not be negative: you typed {typed}")
    return str(micros)


def check_minor_unit(micros: int | None, currency: str, what: str = "a daily budget") -> None:
    """CatalogError when a budget in micros (the API's, a script's) is finer than its currency's minor unit: a budget,
    like every total, is a whole number of minor units (1000.5 JPY is no budget; a price may be finer)."""
    if micros is None or not currency:
        return
    step = 10 ** (PRICE_DECIMALS - minor_digits(currency))
    if micros % step:
        raise CatalogError(
            f"{what} in {currency} is {amount_rule(currency, True)}: in micros a multiple of {step:,}, got {micros}"
        )


def check_not_past(at_ms: int | None, now_ms: int, field: str = "effective_from") -> None:
    """FieldError when a form's effective time is in the past (the web makes no back-fill), in the pages' own time
    format; the catalog checks again under its lock, for a change that waited for it."""
    if at_ms is not None and at_ms < now_ms:
        raise FieldError(
            field,
            f"the effective time {display.utc(at_ms)} is in the past (now is {display.utc(now_ms)}): leave it empty "
            "for now, or give a later time",
        )


def effective_from_text(text: str | None) -> int | None:
    """A form's effective time: empty for now (None: read under the catalog's lock, `make_change`), epoch ms, or an
    ISO-8601 time in UTC (`2026-01-01T10:00`, as a `datetime-local` field sends it, seconds and a trailing `Z`
    optional); CatalogError otherwise."""
    value = (text or "").strip()
    if not value:
        return None
    if _DIGITS.fullmatch(value):
        return int(value)
    match = _ISO.fullmatch(value)
    if match:
        year, month, day, hour, minute, second, fraction = match.groups()
        try:
            moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0), tzinfo=UTC)
            return int(moment.timestamp()) * 1000 + int((fraction or "0").ljust(3, "0"))
        except ValueError:
            pass  # a day or hour that does not exist: refused below
    raise FieldError(
        "effective_from",
        f"the effective time is a UTC time such as 2026-01-01 10:00, or empty for now: you typed {value}",
    )


def effective_from_json(value: object) -> int | None:
    """An API request's `effective_from`: absent or null for now (None), else whole epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CatalogError(f"the effective time is a non-negative number of epoch milliseconds, got {value!r}")
    return value


def check_ids(ad_id: str, **ids: str | None) -> None:
    """Ids the web UI can show and address (`web.readers.is_id`); CatalogError naming the first that is not. The ad's
    id is needed (as `adbill catalog` says); a missing campaign or advertiser is the command's refusal to make."""
    if not ad_id:
        raise CatalogError("catalog create-ad needs the ad's id")
    for name, value in {"ad_id": ad_id, **ids}.items():
        if value is not None and not is_id(value):
            raise CatalogError(
                f"{name.replace('_', ' ')} {value!r}: an id is up to 128 letters, digits and . _ : @ -, starting "
                "with a letter or digit"
            )


@dataclass(frozen=True, slots=True)
class Made:
    """A change made: the catalog after it, the ad, and the entry it added."""

    catalog: Catalog
    ad: Ad
    entry: PriceChange


def make_change(asked: AdRequest, at_ms: int | None) -> Made:
    """Read the request (`AdRequest.change`) against the catalog as the database holds it, make it
    (`Catalog.with_change`) and write it, all under the catalog's lock (`CatalogDatabase.change`), so a request
    is judged against the catalog it changes, and "now" (the effective time when `at_ms` is None) is read under the
    lock too, so a change that waited for the lock never takes effect in the past; CatalogError, with the command
    line's one-line message, when it is refused."""
    if asked.action not in ACTIONS:
        raise CatalogError(f"unknown catalog action {asked.action!r}; one of {', '.join(ACTIONS)}")
    changed = _change_from(at_ms, asked.change, made_by())
    ad = changed[asked.ad_id]
    entry = next(p for p in ad.prices if p.version == changed.version)
    return Made(changed, ad, entry)


def _change_from(
    at_ms: int | None, request_: Callable[[int, Catalog | None], CatalogChange], made_by: MadeBy | None = None
) -> Catalog:
    """Make the change `request_` reads from its effective time and the catalog as the database holds it, under the
    catalog's lock (`CatalogDatabase.change`), so a request is judged against the catalog it changes; the effective
    time is `at_ms`, or when None "now" read under the lock too, so a change that waited for the lock never takes
    effect in the past. The catalog after it."""

    def asked(current: Catalog | None, now_ms: int) -> CatalogChange:
        return request_(now_ms if at_ms is None else at_ms, current)

    return store().change(asked, clock=services().clock, made_by=made_by)


def exclusions_or_404() -> Principal:
    """The IP exclusion list: the operator's, an admin's only (to see and to change); anyone else gets 404."""
    return allowed_or_404(may_change_catalog)


def maker() -> MadeBy:
    """Who makes this request's change and through which door: the account, and `page`, `api` (a browser's session
    on the API) or `api token TOKEN_ID`."""
    principal = logged_in()
    token_id = g.get("token_id")
    if token_id:
        door = f"api token {token_id}"
    elif request.path.startswith("/api/"):
        door = "api"
    else:
        door = "page"
    return MadeBy(principal.username, door)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A campaign's daily budget as a person sees it at `at_ms`: the entry in force (None: unlimited, never set or
    not yet), the next change planned, the history."""

    campaign_id: str
    advertiser_id: str
    currency: str
    entry: BudgetChange | None
    next_change: BudgetChange | None
    history: tuple[BudgetChange, ...]

    @property
    def daily_budget_micros(self) -> int | None:
        return self.entry.daily_budget_micros if self.entry else None

    @classmethod
    def of(cls, catalog: Catalog, campaign_id: str, at_ms: int) -> BudgetStatus:
        advertiser_id = catalog.advertiser_of_campaign(campaign_id) or ""
        history = catalog.budget_history(campaign_id)
        later = next((b for b in history if b.effective_from > at_ms), None)
        return cls(
            campaign_id,
            advertiser_id,
            catalog.currency_of(advertiser_id) or "",
            catalog.budget_entry_at(campaign_id, at_ms),
            later,
            history,
        )


def make_budget_change(campaign_id: str, at_ms: int | None, *, daily_micros: object, unlimited: bool) -> BudgetMade:
    """Read a budget request (`budget_change`) against the catalog as the file holds it and make it, under the
    catalog's lock, "now" read under it too, as `make_change` does; CatalogError with `adbill catalog set-budget`'s
    message when it is refused."""
    made_by = maker()

    def request_(effective_from: int, current: Catalog | None) -> CatalogChange:
        setting = budget_change(
            campaign_id, effective_from, current, daily_micros=daily_micros, unlimited=unlimited, made_by=made_by
        )
        if current is not None:
            advertiser = current.advertiser_of_campaign(campaign_id) or ""
            check_minor_unit(setting.daily_budget_micros, current.currency_of(advertiser) or "")
        return setting

    changed = _change_from(at_ms, request_)
    entry = next(b for b in changed.budget_history(campaign_id) if b.version == changed.version)
    return BudgetMade(changed, campaign_id, entry)


@dataclass(frozen=True, slots=True)
class BudgetMade:
    """A budget change made: the catalog after it, the campaign, and the entry it added."""

    catalog: Catalog
    campaign_id: str
    entry: BudgetChange


def make_exclusion_change(action: str, cidr: str, at_ms: int | None) -> tuple[Catalog, ExclusionChange]:
    """Exclude (`exclude`) or include again (`include`) an IP range from `at_ms` (None: now, read under the lock),
    as `adbill ivt` does; the catalog after it and the entry it added; CatalogError with the command's message."""
    made_by = maker()

    def request_(effective_from: int, current: Catalog | None) -> CatalogChange:
        return exclusion_change(action, cidr, effective_from, made_by)

    changed = _change_from(at_ms, request_)
    return changed, next(c for c in changed.exclusions.changes if c.version == changed.version)


def exclusions_in_force(exclusions: IpExclusions, at_ms: int) -> list[tuple[str, ExclusionChange]]:
    """Each range excluded at `at_ms`, with the entry that put it in force (its last taking effect by then)."""
    return [
        (cidr, [e for e in exclusions.history(cidr) if e.effective_from <= at_ms][-1])
        for cidr in exclusions.ranges_at(at_ms)
    ]


def made_by() -> MadeBy:
    """Who makes this request's change and through which door, for the catalog's change log (`maker`)."""
    return maker()


@dataclass(frozen=True, slots=True)
class MadeAs:
    """Who made a history entry, through which door and when, as the catalog's change log says it."""

    who: str | None
    door: str | None
    made_at: int | None


def made_of(entry: BudgetChange | ExclusionChange) -> MadeAs:
    """Who made a budget or IP exclusion entry, through which door and when: the change log's line of the version
    the entry made, as `/catalog/changes` and the click story show it; what the entry itself recorded only where the
    log has no line for its version (a change made before the log existed)."""
    change = changes_by_version().get(entry.version)
    if change is not None and change.recorded:
        return MadeAs(change.who, change.door, change.made_at)
    return MadeAs(entry.made_by, entry.door, entry.made_at)


def changes_by_version() -> LogEntries:
    """This request's reader of the change log (`billing.store.catalog_db.LogEntries`)."""
    if "catalog_changes" not in g:
        g.catalog_changes = LogEntries(store())
    found: LogEntries = g.catalog_changes
    return found
