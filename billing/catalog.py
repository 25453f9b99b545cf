"""The ad catalog: which advertiser and campaign an ad belongs to, and its price history.

An ad's price is a history of entries (`PriceChange`): from `effective_from` (epoch ms, UTC) on, one click costs
`cpc_micros` (integer micros, millionths of the currency unit, never a float), or the ad is paused (`None`). A click
is priced at the entry with the greatest `effective_from` at or before its event time (`Catalog.price`); before an
ad's first entry the ad did not exist. Every change carries the catalog `version` it was made in (the catalog's
version counts changes), so a reader can see the catalog as it stood at an earlier version (`Catalog.as_of`): the
streaming job prices a replayed micro-batch with the version it priced it with the first time.

A change (`AdChange`) creates an ad or sets, pauses or resumes its price from an `effective_from` that is not in the
past (`Catalog.with_change`); an ad's advertiser, campaign and currency never change. Only a back-fill of recorded
history (`backfill=True`, which the operator asks for) may take effect in the past.

An advertiser bills in one currency (docs/billing-rules.md, Events): every ad of an advertiser carries that currency, so
each advertiser's and campaign's figures are in one currency. A catalog that breaks it is refused when it is built or
read, naming the advertisers, and an ad in another currency than its advertiser's other ads is refused as a change.
An ad's currency is a code of ISO 4217's list that has a minor unit (EUR, JPY, KWD: `billing.money.currency_problem`):
an unknown or withdrawn code, or one without a minor unit (gold XAU, the SDR XDR), is refused, so every amount the
product prices has the minor unit its invoices round to and its pages write.

The file, shared by the job, reconciliation and the web UI, is `billing.store.catalog_file`.
"""

from __future__ import annotations

import json
import random
from bisect import bisect_right, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from billing.budgets import BudgetChange, BudgetError
from billing.invalid import ExclusionChange, ExclusionError, IpExclusions, parse_cidr
from billing.money import currency_problem

FORMAT = 3
"""The catalog file's format: 3 adds campaigns' daily budgets and the IP exclusion list to the price histories of 2;
a file without `format` is a list of constant prices (1). Formats 1 to 3 are read."""

END_OF_TIME = 2**63 - 1
"""The end of a span of time that has none (`Catalog.repriced_since`), in epoch ms."""


class Unbillable(StrEnum):
    """Why a click that the rule matched has no price at its time."""

    AD_PAUSED = "ad_paused"
    """The ad was paused at the click's time."""
    UNKNOWN_AD = "unknown_ad"
    """The catalog does not know the ad, or the ad's first entry is after the click."""


class CatalogError(ValueError):
    """A change the catalog refuses; the message is one line, for a person."""


class UnknownAdError(CatalogError):
    """A change of an ad the catalog does not hold: the ad is what is missing (the API answers 404)."""


@dataclass(frozen=True, slots=True)
class PriceChange:
    """From `effective_from` on, a click costs `cpc_micros`, or the ad is paused (`cpc_micros` None)."""

    effective_from: int
    cpc_micros: int | None
    version: int = 0

    def __post_init__(self) -> None:
        _check_time(self.effective_from, "effective_from")
        if self.cpc_micros is not None:
            _check_price(self.cpc_micros)
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise CatalogError(f"a change's version is a non-negative integer, got {self.version!r}")

    @property
    def paused(self) -> bool:
        return self.cpc_micros is None

    @classmethod
    def stored(cls, effective_from: int, cpc_micros: int | None, version: int) -> PriceChange:
        """An entry as a store holds it, checked when it was written: built without checking it again (`Ad.stored`)."""
        entry = object.__new__(cls)
        object.__setattr__(entry, "effective_from", effective_from)
        object.__setattr__(entry, "cpc_micros", cpc_micros)
        object.__setattr__(entry, "version", version)
        return entry


@dataclass(frozen=True, slots=True)
class Ad:
    """One ad of the catalog and its price history (oldest first).

    Built as `Ad(ad_id, campaign_id, advertiser_id, cpc_micros, currency)`, the ad costs `cpc_micros` from the
    beginning of time (`effective_from` 0): a catalog of constant prices. `cpc_micros` is the ad's first price."""

    ad_id: str
    campaign_id: str
    advertiser_id: str
    cpc_micros: int | None
    currency: str
    prices: tuple[PriceChange, ...] = field(default=())
    _starts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    """The entries' `effective_from`, for the lookup: made once, not per priced click."""

    def __post_init__(self) -> None:
        for name in ("ad_id", "campaign_id", "advertiser_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or not value.isprintable() or value != value.strip():
                raise CatalogError(f"ad {self.ad_id!r}: {name} must be a non-empty printable id, got {value!r}")
        if self.cpc_micros is not None:
            try:
                _check_price(self.cpc_micros)
            except CatalogError as exc:
                raise CatalogError(f"ad {self.ad_id}: {exc}") from None
        if not (isinstance(self.currency, str) and len(self.currency) == 3 and self.currency.isalpha()) or (
            not self.currency.isupper()
        ):
            raise CatalogError(f"ad {self.ad_id}: currency must be an ISO 4217 code such as EUR")
        problem = currency_problem(self.currency)
        if problem is not None:
            raise CatalogError(f"ad {self.ad_id}: {problem}")
        prices = self.prices or (PriceChange(0, self.cpc_micros, 0),)
        ordered = tuple(sorted(prices, key=_entry_order))
        object.__setattr__(self, "prices", ordered)
        object.__setattr__(self, "cpc_micros", ordered[0].cpc_micros)
        object.__setattr__(self, "_starts", tuple(p.effective_from for p in ordered))

    @classmethod
    def stored(
        cls, ad_id: str, campaign_id: str, advertiser_id: str, currency: str, prices: tuple[PriceChange, ...]
    ) -> Ad:
        """An ad as a store holds it (the catalog's database: checked by `Catalog.apply` before it was written and by
        the tables' constraints when it committed), built without checking it again: the checks were most of the
        time a process takes to read a million ads. The same ad as `Ad(...)` builds from the same values."""
        ordered = tuple(sorted(prices, key=_entry_order)) if len(prices) > 1 else prices
        ad = object.__new__(cls)
        for name, value in (
            ("ad_id", ad_id),
            ("campaign_id", campaign_id),
            ("advertiser_id", advertiser_id),
            ("cpc_micros", ordered[0].cpc_micros),
            ("currency", currency),
            ("prices", ordered),
            ("_starts", tuple(p.effective_from for p in ordered)),
        ):
            object.__setattr__(ad, name, value)
        return ad

    def price_at(self, at_ms: int) -> int | Unbillable:
        """The price of a click at `at_ms`, or why it has none."""
        index = bisect_right(self._starts, at_ms) - 1
        if index < 0:
            return Unbillable.UNKNOWN_AD
        entry = self.prices[index]
        return Unbillable.AD_PAUSED if entry.cpc_micros is None else entry.cpc_micros

    @property
    def created_at(self) -> int:
        """When the ad's first entry takes effect."""
        return self.prices[0].effective_from

    def entry_at(self, at_ms: int) -> PriceChange | None:
        """The history entry in force at `at_ms`; None before the first."""
        index = bisect_right(self._starts, at_ms) - 1
        return self.prices[index] if index >= 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ad_id": self.ad_id,
            "campaign_id": self.campaign_id,
            "advertiser_id": self.advertiser_id,
            "currency": self.currency,
            "prices": [
                {"effective_from": p.effective_from, "cpc_micros": p.cpc_micros, "version": p.version}
                for p in self.prices
            ],
        }


@dataclass(frozen=True, slots=True)
class AdChange:
    """A change to the catalog: create `ad_id` (owners and currency given) or set its price from `effective_from`
    on; `cpc_micros` None pauses it. For an existing ad the owners and currency, when given, must be its own."""

    ad_id: str
    effective_from: int
    cpc_micros: int | None
    campaign_id: str | None = None
    advertiser_id: str | None = None
    currency: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class MadeBy:
    """Who asks for a change of the catalog and through which door (docs/billing-rules.md, "Who sees what"): an account
    of the web UI or the operating system's user of a command; `command`, `page`, `api token TOKEN_ID` or `replay`. The
    entry the change adds keeps both, and when it was made (read under the catalog's lock)."""

    who: str
    door: str


def _stamp(made_by: MadeBy | None, now_ms: int) -> tuple[str | None, str | None, int | None]:
    """Who made a change's entry, through which door and when; all None for an entry no one is named for."""
    return (made_by.who, made_by.door, now_ms) if made_by else (None, None, None)


@dataclass(frozen=True, slots=True)
class BudgetSetting:
    """A change of a campaign's daily budget: from `effective_from` on, `daily_budget_micros` a UTC day (None:
    unlimited) (`Catalog.with_budget`)."""

    campaign_id: str
    effective_from: int
    daily_budget_micros: int | None
    made_by: MadeBy | None = None


@dataclass(frozen=True, slots=True)
class ExclusionSetting:
    """A change of the IP exclusion list: from `effective_from` on, the range `cidr` is excluded (`excluded`), or no
    longer (`Catalog.with_exclusion`)."""

    cidr: str
    effective_from: int
    excluded: bool
    made_by: MadeBy | None = None


CatalogChange = AdChange | BudgetSetting | ExclusionSetting
"""Any change of the catalog: an ad's price history, a campaign's budget history, the IP exclusion list."""


class Catalog:
    """Ads by id with their price histories. Immutable; a change makes a new catalog (`with_change`); as JSON with
    `to_json`/`from_json` (the file: `billing.store.catalog_file`).

    An ad id names one ad, and a campaign id one advertiser's campaign: the live totals are kept per campaign id
    (`billing.store.redis_totals`), so two advertisers sharing one would see each other's figures added to their own. A
    catalog where they do is refused.
    """

    def __init__(
        self,
        ads: Iterable[Ad],
        version: int | None = None,
        budgets: Mapping[str, Iterable[BudgetChange]] | None = None,
        exclusions: IpExclusions | None = None,
    ) -> None:
        self._ads: dict[str, Ad] | _Layered = {}
        owners: dict[str, str] = {}
        currencies: dict[str, dict[str, list[str]]] = {}
        for ad in ads:
            if ad.ad_id in self._ads:
                raise CatalogError(f"ad {ad.ad_id} appears twice in the catalog")
            owner = owners.setdefault(ad.campaign_id, ad.advertiser_id)
            if owner != ad.advertiser_id:
                raise CatalogError(
                    f"campaign {ad.campaign_id} belongs to advertiser {owner} and to {ad.advertiser_id} (ad "
                    f"{ad.ad_id}); a campaign id must name one advertiser's campaign, so rename one of them"
                )
            currencies.setdefault(ad.advertiser_id, {}).setdefault(ad.currency, []).append(ad.ad_id)
            self._ads[ad.ad_id] = ad
        mixed = {advertiser: ads for advertiser, ads in sorted(currencies.items()) if len(ads) > 1}
        if mixed:
            raise CatalogError(
                "an advertiser bills in one currency, but "
                + ", ".join(
                    f"{advertiser} ({'; '.join(f'{c}: {_listed(ids)}' for c, ids in sorted(ads.items()))})"
                    for advertiser, ads in mixed.items()
                )
                + ": give the ads of each other currency an advertiser and a campaign of their own"
            )
        self._owners = owners
        self._currencies = {advertiser: next(iter(ads)) for advertiser, ads in currencies.items()}
        self._campaign_ads: dict[str, tuple[str, ...]] | None = None
        self._advertiser_campaigns: dict[str, tuple[str, ...]] | None = None
        self._listed: list[str] | None = None
        self.budgets: dict[str, tuple[BudgetChange, ...]] = {}
        for campaign_id, entries in (budgets or {}).items():
            if campaign_id not in owners:
                raise CatalogError(f"campaign {campaign_id} has a budget but no ad in the catalog")
            ordered = tuple(sorted(entries, key=lambda b: (b.effective_from, b.version)))
            if ordered:
                self.budgets[campaign_id] = ordered
        self._budget_starts = {c: [b.effective_from for b in entries] for c, entries in self.budgets.items()}
        self.exclusions = exclusions if exclusions is not None else IpExclusions()
        newest = max(
            (
                *(p.version for ad in self._ads.values() for p in ad.prices),
                *(b.version for entries in self.budgets.values() for b in entries),
                self.exclusions.version,
            ),
            default=0,
        )
        self.version = newest if version is None else max(version, newest)

    def __len__(self) -> int:
        return len(self._ads)

    def __bool__(self) -> bool:
        """A catalog is a catalog, even with no ads: never taken for none (`current or Catalog([])`)."""
        return True

    def __iter__(self) -> Iterator[Ad]:
        return iter(self._ads.values())

    def __contains__(self, ad_id: object) -> bool:
        return ad_id in self._ads

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Catalog) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def get(self, ad_id: str) -> Ad | None:
        return self._ads.get(ad_id)

    def __getitem__(self, ad_id: str) -> Ad:
        return self._ads[ad_id]

    @property
    def ad_ids(self) -> list[str]:
        return list(self._ads)

    @property
    def advertiser_ids(self) -> list[str]:
        return sorted({ad.advertiser_id for ad in self._ads.values()})

    @property
    def campaign_ids(self) -> list[str]:
        return sorted(self._owners)

    def advertiser_of_campaign(self, campaign_id: str) -> str | None:
        return self._owners.get(campaign_id)

    def budget_at(self, campaign_id: str, at_ms: int) -> int | None:
        """The daily budget of `campaign_id` in force at `at_ms` (micros), None when unlimited (no budget then)."""
        starts = self._budget_starts.get(campaign_id)
        if not starts:
            return None
        index = bisect_right(starts, at_ms) - 1
        return None if index < 0 else self.budgets[campaign_id][index].daily_budget_micros

    def budget_entry_at(self, campaign_id: str, at_ms: int) -> BudgetChange | None:
        """The budget history entry of `campaign_id` in force at `at_ms`; None before the first (unlimited)."""
        starts = self._budget_starts.get(campaign_id)
        if not starts:
            return None
        index = bisect_right(starts, at_ms) - 1
        return None if index < 0 else self.budgets[campaign_id][index]

    def budget_history(self, campaign_id: str) -> tuple[BudgetChange, ...]:
        """The campaign's budget entries, oldest first (none: unlimited since the beginning)."""
        return self.budgets.get(campaign_id, ())

    def ads_of_campaign(self, campaign_id: str) -> list[Ad]:
        """The campaign's ads, in the catalog's order (an index made on the first call, and kept by the catalogs
        grown from this one: a budget's check never walks a million ads)."""
        if self._campaign_ads is None:
            index: dict[str, list[str]] = {}
            for ad in self._ads.values():
                index.setdefault(ad.campaign_id, []).append(ad.ad_id)
            self._campaign_ads = {campaign: tuple(ids) for campaign, ids in index.items()}
        return [self._ads[ad_id] for ad_id in self._campaign_ads.get(campaign_id, ())]

    def listed(self) -> list[str]:
        """Every ad id by advertiser, campaign and ad id: the order pages list ads in (made on the first call, kept
        by the catalogs grown from this one, a new ad put in its place)."""
        if self._listed is None:
            self._listed = sorted(self._ads, key=self._list_key)
        return self._listed

    def _list_key(self, ad_id: str) -> tuple[str, str, str]:
        ad = self._ads[ad_id]
        return (ad.advertiser_id, ad.campaign_id, ad_id)

    @property
    def advertisers_by_ad(self) -> Mapping[str, str]:
        """Each ad's advertiser, as a mapping read through the catalog (nothing copied)."""
        return _AdvertiserOf(self)

    def campaigns_of(self, advertiser_id: str) -> list[str]:
        """The advertiser's campaigns (those with ads in the catalog), sorted (an index made on the first call, and
        kept by the catalogs grown from this one: an advertiser's page never walks every campaign)."""
        if self._advertiser_campaigns is None:
            index: dict[str, list[str]] = {}
            for campaign, owner in self._owners.items():
                index.setdefault(owner, []).append(campaign)
            self._advertiser_campaigns = {owner: tuple(sorted(ids)) for owner, ids in index.items()}
        return list(self._advertiser_campaigns.get(advertiser_id, ()))

    @property
    def has_budgets(self) -> bool:
        """Whether any campaign ever had a daily budget (not unlimited)."""
        return any(b.daily_budget_micros is not None for entries in self.budgets.values() for b in entries)

    def advertiser_of(self, ad_id: str) -> str | None:
        ad = self._ads.get(ad_id)
        return ad.advertiser_id if ad is not None else None

    def currency_of(self, advertiser_id: str) -> str | None:
        """The one currency the advertiser bills in; None for an advertiser the catalog does not know."""
        return self._currencies.get(advertiser_id)

    def price(self, ad_id: str, at_ms: int) -> tuple[Ad, int] | Unbillable:
        """The ad and the price of a click on `ad_id` at `at_ms` (the entry with the greatest `effective_from` at or
        before it), or why the click has none: THE pricing rule, for the stream, reconciliation and the ground
        truth alike."""
        ad = self._ads.get(ad_id)
        if ad is None:
            return Unbillable.UNKNOWN_AD
        amount = ad.price_at(at_ms)
        return amount if isinstance(amount, Unbillable) else (ad, amount)

    def as_of(self, version: int) -> Catalog:
        """The catalog as it stood at `version`: the changes made up to it, and the ads they made."""
        if version >= self.version:
            return self
        ads = []
        for ad in self._ads.values():
            kept = tuple(p for p in ad.prices if p.version <= version)
            if kept:
                ads.append(replace(ad, cpc_micros=kept[0].cpc_micros, prices=kept))
        campaigns = {ad.campaign_id for ad in ads}
        budgets = {
            campaign: tuple(b for b in entries if b.version <= version)
            for campaign, entries in self.budgets.items()
            if campaign in campaigns
        }
        return Catalog(ads, version, budgets, self.exclusions.as_of(version))

    def repriced_since(self, version: int) -> list[tuple[int, int]]:
        """The spans of time `[from, to)` (oldest first, merged; `to` is `END_OF_TIME` for "from then on") in which
        the catalog now prices a click of some ad otherwise than it did at `version` (another price, paused,
        unknown): what the changes made after `version` moved. Only a back-fill moves the past. A catalog older
        than `version` was replaced rather than changed, and its history cannot tell what moved: every time."""
        if version > self.version:
            return [(0, END_OF_TIME)]
        spans: list[tuple[int, int]] = []
        for ad in self._ads.values() if version < self.version else ():
            if all(p.version <= version for p in ad.prices):
                continue
            kept = tuple(p for p in ad.prices if p.version <= version)
            then = replace(ad, prices=kept) if kept else None
            starts = sorted({p.effective_from for p in ad.prices})  # every entry of `then` is one of `ad`'s
            for i, start in enumerate(starts):
                before = then.price_at(start) if then is not None else Unbillable.UNKNOWN_AD
                if before != ad.price_at(start):
                    spans.append((start, starts[i + 1] if i + 1 < len(starts) else END_OF_TIME))
        # A budget or an exclusion changed from a time on changes which clicks are charged from then on.
        spans += [
            (b.effective_from, END_OF_TIME) for entries in self.budgets.values() for b in entries if b.version > version
        ]
        spans += [(c.effective_from, END_OF_TIME) for c in self.exclusions.changes if c.version > version]
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def with_change(self, change: AdChange, now_ms: int, backfill: bool = False) -> Catalog:
        """The catalog with `change` made at `now_ms` as version `version + 1`; CatalogError when it is refused:
        an effective time in the past (unless `backfill`), a negative or non-integer price, an ad's advertiser,
        campaign or currency changed, an unknown ad without its owners and currency, a campaign of another
        advertiser, or a new ad in another currency than its advertiser's (back-fill or not)."""
        _check_time(change.effective_from, "the effective time")
        if change.cpc_micros is not None:
            _check_price(change.cpc_micros)
        if not backfill and change.effective_from < now_ms:
            raise CatalogError(
                f"ad {change.ad_id}: the effective time {format_time(change.effective_from)} is in the past (now is "
                f"{format_time(now_ms)}): the past is never re-priced"
            )
        entry = PriceChange(change.effective_from, change.cpc_micros, self.version + 1)
        ad = self._ads.get(change.ad_id)
        if ad is None:
            missing = [n for n in ("campaign_id", "advertiser_id", "currency") if not getattr(change, n)]
            if missing:
                raise UnknownAdError(f"unknown ad {change.ad_id}: to create it, give its {', '.join(missing)}")
            owner = self._owners.get(change.campaign_id or "")
            if owner is not None and owner != change.advertiser_id:
                raise CatalogError(
                    f"campaign {change.campaign_id} belongs to advertiser {owner}, not {change.advertiser_id}"
                )
            bills_in = self._currencies.get(change.advertiser_id or "")
            if bills_in is not None and bills_in != change.currency:
                raise CatalogError(
                    f"advertiser {change.advertiser_id} bills in {bills_in}, so ad {change.ad_id} cannot be in "
                    f"{change.currency}: an advertiser bills in one currency; create the ad in {bills_in}, or under "
                    "an advertiser of its own"
                )
            created = Ad(
                change.ad_id,
                change.campaign_id or "",
                change.advertiser_id or "",
                change.cpc_micros,
                change.currency or "",
                (entry,),
            )
            return self.grown(self.version + 1, ads=(created,))
        for name in ("campaign_id", "advertiser_id", "currency"):
            given = getattr(change, name)
            if given is not None and given != getattr(ad, name):
                raise CatalogError(
                    f"ad {ad.ad_id}: its {name.removesuffix('_id')} is {getattr(ad, name)}, not {given}; an ad's "
                    "advertiser, campaign and currency never change"
                )
        return self.grown(self.version + 1, ads=(replace(ad, prices=(*ad.prices, entry)),))

    def grown(
        self,
        version: int,
        ads: Iterable[Ad] = (),
        budgets: Mapping[str, Iterable[BudgetChange]] | None = None,
        exclusions: Iterable[ExclusionChange] = (),
    ) -> Catalog:
        """The catalog at `version` with what changed since this one: `ads` new or with their whole history now
        (an ad's owners and currency never change), budget entries added to their campaigns' histories, exclusion
        changes added to the list. What did not change is shared with this catalog, not copied or checked again:
        the cost of a change is the change's, not the catalog's (a change made here was checked by `with_change`,
        `with_budget` or `with_exclusion`; one read from the database was checked by its constraints when it
        committed, `billing.store.catalog_db`)."""
        grown = object.__new__(Catalog)
        grown._ads, grown._owners, grown._currencies = self._ads, self._owners, self._currencies
        grown._campaign_ads, grown._listed = self._campaign_ads, self._listed
        grown._advertiser_campaigns = self._advertiser_campaigns
        ads = list(ads)
        if ads:
            grown._ads = _Layered.of(self._ads, {ad.ad_id: ad for ad in ads})
            new = [ad for ad in ads if ad.ad_id not in self._ads]
            if new:
                grown._owners = {**self._owners, **{ad.campaign_id: ad.advertiser_id for ad in new}}
                grown._currencies = {**self._currencies, **{ad.advertiser_id: ad.currency for ad in new}}
                if self._campaign_ads is not None:
                    index = dict(self._campaign_ads)
                    for ad in new:
                        index[ad.campaign_id] = (*index.get(ad.campaign_id, ()), ad.ad_id)
                    grown._campaign_ads = index
                if self._advertiser_campaigns is not None:
                    owned = dict(self._advertiser_campaigns)
                    for campaign in {ad.campaign_id for ad in new} - self._owners.keys():
                        advertiser = grown._owners[campaign]
                        owned[advertiser] = tuple(sorted((*owned.get(advertiser, ()), campaign)))
                    grown._advertiser_campaigns = owned
                if self._listed is not None:
                    listed = list(self._listed)
                    for ad in new:
                        insort(listed, ad.ad_id, key=grown._list_key)
                    grown._listed = listed
        grown.budgets, grown._budget_starts = self.budgets, self._budget_starts
        if budgets:
            grown.budgets, grown._budget_starts = dict(self.budgets), dict(self._budget_starts)
            for campaign_id, entries in budgets.items():
                history = tuple(
                    sorted((*self.budgets.get(campaign_id, ()), *entries), key=lambda b: (b.effective_from, b.version))
                )
                grown.budgets[campaign_id] = history
                grown._budget_starts[campaign_id] = [b.effective_from for b in history]
        grown.exclusions = self.exclusions
        for change in exclusions:
            grown.exclusions = grown.exclusions.with_change(change)
        grown.version = max(version, self.version)
        return grown

    def apply(self, change: CatalogChange, now_ms: int, backfill: bool = False) -> Catalog:
        """The catalog with any change made at `now_ms` (`with_change`, `with_budget`, `with_exclusion`)."""
        if isinstance(change, BudgetSetting):
            return self.with_budget(
                change.campaign_id, change.effective_from, change.daily_budget_micros, now_ms, backfill, change.made_by
            )
        if isinstance(change, ExclusionSetting):
            return self.with_exclusion(
                change.cidr, change.effective_from, change.excluded, now_ms, backfill, change.made_by
            )
        return self.with_change(change, now_ms, backfill)

    def with_budget(
        self,
        campaign_id: str,
        effective_from: int,
        daily_budget_micros: int | None,
        now_ms: int,
        backfill: bool = False,
        made_by: MadeBy | None = None,
    ) -> Catalog:
        """The catalog with the campaign's daily budget set (None: unlimited) from `effective_from` on, as version
        `version + 1`; CatalogError when refused: an unknown campaign, a budget that is not a whole non-negative
        number of micros, an effective time in the past (unless `backfill`)."""
        _check_time(effective_from, "the effective time")
        if campaign_id not in self._owners:
            raise CatalogError(f"unknown campaign {campaign_id}: a budget is set on a campaign that has ads")
        if not backfill and effective_from < now_ms:
            raise CatalogError(
                f"campaign {campaign_id}: the effective time {format_time(effective_from)} is in the past (now is "
                f"{format_time(now_ms)}): a budget changes from now on"
            )
        try:
            entry = BudgetChange(effective_from, daily_budget_micros, self.version + 1, *_stamp(made_by, now_ms))
        except BudgetError as exc:
            raise CatalogError(f"campaign {campaign_id}: {exc}") from None
        return self.grown(self.version + 1, budgets={campaign_id: (entry,)})

    def with_exclusion(
        self,
        cidr: str,
        effective_from: int,
        excluded: bool,
        now_ms: int,
        backfill: bool = False,
        made_by: MadeBy | None = None,
    ) -> Catalog:
        """The catalog with the IP range `cidr` excluded (or, `excluded` False, no longer excluded) from
        `effective_from` on, as version `version + 1`; CatalogError when refused: not a range, an effective time in
        the past (unless `backfill`), a range already in that state then."""
        _check_time(effective_from, "the effective time")
        try:
            network = str(parse_cidr(cidr))
        except ExclusionError as exc:
            raise CatalogError(str(exc)) from None
        if not backfill and effective_from < now_ms:
            raise CatalogError(
                f"range {network}: the effective time {format_time(effective_from)} is in the past (now is "
                f"{format_time(now_ms)}): the exclusion list changes from now on"
            )
        if self.exclusions.in_force(network, effective_from) == excluded:
            state = "already excluded" if excluded else "not excluded"
            raise CatalogError(f"range {network} is {state} at {format_time(effective_from)}")
        change = ExclusionChange(network, effective_from, excluded, self.version + 1, *_stamp(made_by, now_ms))
        return self.grown(self.version + 1, exclusions=(change,))

    def to_json(self) -> str:
        document = {
            "format": FORMAT,
            "version": self.version,
            "ads": [ad.to_dict() for ad in self._ads.values()],
            "budgets": {c: [b.to_dict() for b in entries] for c, entries in sorted(self.budgets.items())},
            "ip_exclusions": self.exclusions.to_list(),
        }
        return json.dumps(document, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Catalog:
        """A catalog file: format 2 (histories), or the earlier list of constant prices, which becomes a history in
        force from the beginning of time (`effective_from` 0)."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("ads"), list):
            raise CatalogError('a catalog file is a JSON object {"ads": [...]}')
        if data.get("format") is None:
            return cls(Ad(**ad) for ad in data["ads"])
        if data["format"] not in (2, FORMAT):
            raise CatalogError(f"catalog format {data['format']!r} is not one this version reads (2, {FORMAT})")
        ads = []
        for row in data["ads"]:
            prices = tuple(PriceChange(**p) for p in row["prices"])
            if not prices:
                raise CatalogError(f"ad {row.get('ad_id')!r} has no price history")
            fields = {k: row[k] for k in ("ad_id", "campaign_id", "advertiser_id", "currency")}
            ads.append(Ad(**fields, cpc_micros=prices[0].cpc_micros, prices=prices))
        try:
            budgets = {
                campaign: [BudgetChange(**entry) for entry in entries]
                for campaign, entries in (data.get("budgets") or {}).items()
            }
            exclusions = IpExclusions.from_list(data.get("ip_exclusions") or [])
        except (BudgetError, ExclusionError) as exc:
            raise CatalogError(str(exc)) from None
        return cls(ads, int(data.get("version", 0)), budgets, exclusions)


class _AdvertiserOf(Mapping[str, str]):
    """Each ad's advertiser, read through a catalog (`Catalog.advertisers_by_ad`)."""

    __slots__ = ("_catalog",)

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def __getitem__(self, ad_id: str) -> str:
        ad = self._catalog.get(ad_id)
        if ad is None:
            raise KeyError(ad_id)
        return ad.advertiser_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._catalog.ad_ids)

    def __len__(self) -> int:
        return len(self._catalog)


class _Layered(Mapping[str, Ad]):
    """The ads of a catalog grown from another: the other's ads (`base`, shared, never copied) with those added or
    changed since (`delta`), so that a change costs its own ads, not the catalog's size. Read as the dict it stands
    for: an ad keeps its place when changed, a new one comes last. Made whole again (`FLATTEN_AT`) before the
    changes held apart slow the reads."""

    __slots__ = ("_len", "base", "delta")

    FLATTEN_AT = 4096

    def __init__(self, base: dict[str, Ad], delta: dict[str, Ad]) -> None:
        self.base, self.delta = base, delta
        self._len = len(base) + sum(1 for ad_id in delta if ad_id not in base)

    @classmethod
    def of(cls, ads: Mapping[str, Ad], changed: dict[str, Ad]) -> dict[str, Ad] | _Layered:
        base, delta = (ads.base, {**ads.delta, **changed}) if isinstance(ads, _Layered) else (ads, changed)
        if len(delta) >= cls.FLATTEN_AT or len(delta) * 4 >= len(base):
            return {**base, **delta}
        assert isinstance(base, dict)
        return cls(base, delta)

    def __getitem__(self, ad_id: str) -> Ad:
        found = self.delta.get(ad_id)
        return self.base[ad_id] if found is None else found

    def get(self, ad_id: str, default: Ad | None = None) -> Ad | None:  # type: ignore[override]
        found = self.delta.get(ad_id)
        return self.base.get(ad_id, default) if found is None else found

    def __contains__(self, ad_id: object) -> bool:
        return ad_id in self.delta or ad_id in self.base

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from (ad_id for ad_id in self.delta if ad_id not in self.base)

    def values(self) -> Iterator[Ad]:  # type: ignore[override]
        delta = self.delta
        for ad_id, ad in self.base.items():
            yield delta.get(ad_id, ad)
        yield from (ad for ad_id, ad in delta.items() if ad_id not in self.base)


def _entry_order(entry: PriceChange) -> tuple[int, int]:
    """An ad's history in the order it takes effect: by time, then by version."""
    return entry.effective_from, entry.version


def _listed(ids: list[str], shown: int = 3) -> str:
    """A few ids of a list for a one-line message: `ad-1, ad-2, ad-3 and 5 more`."""
    more = len(ids) - shown
    return ", ".join(ids[:shown]) + (f" and {more} more" if more > 0 else "")


def _check_price(cpc_micros: object) -> None:
    if isinstance(cpc_micros, bool) or not isinstance(cpc_micros, int):
        raise CatalogError(f"a price is a whole number of micros, got {cpc_micros!r}")
    if cpc_micros < 0:
        raise CatalogError(f"a price must not be negative, got {cpc_micros}")
    if cpc_micros > 2**63 - 1:
        raise CatalogError(f"a price must fit in 63 bits, got {cpc_micros}")


def _check_time(at_ms: object, name: str) -> None:
    if isinstance(at_ms, bool) or not isinstance(at_ms, int) or at_ms < 0:
        raise CatalogError(f"{name} is a non-negative number of epoch milliseconds, got {at_ms!r}")


def format_time(at_ms: int) -> str:
    """An effective time for a person: ISO-8601 UTC to the millisecond, or `the beginning` for 0."""
    if at_ms == 0:
        return "the beginning"
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


GENERATED_CURRENCIES: tuple[tuple[str, int, int, int], ...] = (
    ("EUR", 10_000, 5, 250),
    ("JPY", 1_000_000, 5, 400),
    ("KWD", 1_000, 15, 750),
    ("USD", 10_000, 5, 250),
)
"""The currencies a generated catalog gives its advertisers, in turn: (ISO 4217 code, its minor unit in micros,
the lowest and highest price of a click in minor units). EUR and USD have cents (0.05 to 2.50), JPY no minor unit
(5 to 400 yen), KWD three decimals (0.015 to 0.750 dinar): a generated catalog meets each way of writing money."""


def generated_currency(advertiser_number: int) -> str:
    """The currency of the generated catalog's advertiser `adv-NNNN`."""
    return GENERATED_CURRENCIES[advertiser_number % len(GENERATED_CURRENCIES)][0]


def generated_price(currency: str, rng: random.Random) -> int:
    """A price of one click in `currency`, in whole minor units, in micros (one draw of `rng`)."""
    for code, unit_micros, lowest, highest in GENERATED_CURRENCIES:
        if code == currency:
            return rng.randint(lowest, highest) * unit_micros
    return rng.randint(5, 250) * 10_000  # a currency of another catalog: cents, as EUR


def generate_catalog(
    advertisers: int,
    campaigns_per_advertiser: int,
    ads_per_campaign: int,
    seed: int,
) -> Catalog:
    """A deterministic catalog: the same arguments give the same ads and prices, in force from the beginning. Each
    advertiser bills in one currency, the advertisers in turn in EUR, JPY, KWD and USD (`GENERATED_CURRENCIES`)."""
    rng = random.Random(f"catalog-{seed}")
    ads = []
    for a in range(advertisers):
        advertiser_id = f"adv-{a:04d}"
        currency = generated_currency(a)
        for c in range(campaigns_per_advertiser):
            campaign_id = f"{advertiser_id}-cmp-{c:03d}"
            for n in range(ads_per_campaign):
                cpc_micros = generated_price(currency, rng)
                ads.append(Ad(f"{campaign_id}-ad-{n:03d}", campaign_id, advertiser_id, cpc_micros, currency))
    return Catalog(ads)
