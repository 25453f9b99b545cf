"""The catalog's change log: who changed the catalog, when, and through which door (docs/billing-rules.md, "Who sees
what"); with the billing profiles' changes beside it (`profile_changes`), one list of every change.

Every change of the catalog (a new ad, a price, a pause, a resume, a campaign's daily budget, a range of the IP
exclusion list, a new catalog) is numbered by the catalog's version (`billing.catalog.Catalog.version`): the
version it made is on the history entry it added. The log keeps, per version, what the entry cannot say: who made
the change (`MadeBy.who`: an account of the web UI, or the operating system's user of a command), through which door
(`command`, `page`, `api token TOKEN_ID`, `replay`, `simulator`) and when (`made_at`, read under the catalog's
lock), and whether it was a back-fill of recorded history. The store writes one row per change under the
catalog's lock, in the change's own transaction (`billing.store.catalog_db.CatalogDatabase`).

`describe_change(catalog, version)` reads what a version changed from the catalog itself; `merge_log(catalog,
recorded)` gives one entry per change: the recorded line of each version, and an entry read from the catalog for a
version the log does not hold (a change made before the log existed, by hand, or by a writer stopped between the
catalog's rename and the log's line), marked `recorded` False, its author unknown.

Pure: plain values and JSON text; the file is the store's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from billing.catalog import AdChange, BudgetSetting, Catalog, CatalogChange, MadeBy
from billing.profiles import BillingProfile

KINDS = (
    "start",
    "create-ad",
    "set-price",
    "pause",
    "resume",
    "set-budget",
    "exclude-ip",
    "include-ip",
    "billing-profile",
    "unknown",
)
"""What a change did: a new catalog (`start`), an ad's price history, a campaign's budget, the exclusion list, an
advertiser's billing profile (kept with the profiles, numbered by their own versions: `profile_changes`); `unknown`
for a version the catalog no longer shows (an ad removed from the file by hand)."""

DOORS = ("command", "page", "api", "replay", "simulator")
"""Through which door a change came: `adbill catalog` (or another command), the admin page, the API (with the token's
id after a blank: `api 3f2a9c0e1b7d`), a replayed capture's line, the traffic simulator's own changes."""


@dataclass(frozen=True, slots=True)
class ChangeEntry:
    """One change of the catalog, as the log keeps it."""

    version: int
    kind: str
    made_at: int | None = None
    """When the change was made (epoch ms UTC, read under the catalog's lock); None when not recorded."""
    who: str | None = None
    door: str | None = None
    ad_id: str | None = None
    campaign_id: str | None = None
    advertiser_id: str | None = None
    currency: str | None = None
    cidr: str | None = None
    effective_from: int | None = None
    cpc_micros: int | None = None
    daily_budget_micros: int | None = None
    excluded: bool | None = None
    name: str | None = None
    """A billing profile's name, address line first (`billing-profile`)."""
    tax_rate: str | None = None
    """A billing profile's tax rate, percent as exact decimal text (`billing-profile`)."""
    ads: int | None = None
    """A new catalog (`start`): how many ads it holds."""
    backfill: bool = False
    """Recorded history whose effective time lies before it was made (`adbill replay`, `--backfill`); a change made
    through those doors that takes effect when made or later (the simulator's live changes) is none."""
    recorded: bool = True
    """False: read from the catalog for a version the log does not hold; who, door and when are unknown."""

    def __post_init__(self) -> None:
        if self.backfill and self.made_at is not None and (self.effective_from or 0) >= self.made_at:
            object.__setattr__(self, "backfill", False)

    @property
    def door_kind(self) -> str | None:
        """The door without its detail: `api` for `api 3f2a9c0e1b7d`."""
        return None if self.door is None else self.door.split(" ", 1)[0]

    @property
    def token_id(self) -> str | None:
        """The API token's id, for a change made through the API with a token."""
        if self.door is None or " " not in self.door or self.door_kind != "api":
            return None
        return self.door.split(" ", 1)[1]

    @property
    def subject(self) -> str:
        """What was changed, for a person: `ad ad-1`, `campaign cmp-1`, `range 203.0.113.0/24`, `catalog`."""
        if self.kind == "billing-profile":
            return f"billing profile of {self.advertiser_id}"
        if self.ad_id:
            return f"ad {self.ad_id}"
        if self.cidr:
            return f"range {self.cidr}"
        if self.campaign_id:
            return f"campaign {self.campaign_id}"
        return "catalog"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """One line of the log file: compact JSON without the fields left empty."""
        kept = {k: v for k, v in asdict(self).items() if v is not None and k != "recorded"}
        if not kept.get("backfill"):
            kept.pop("backfill", None)
        return json.dumps(kept, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> ChangeEntry:
        """A line of the log file; ValueError when it is not one."""
        data = json.loads(line)
        if not isinstance(data, dict) or not isinstance(data.get("version"), int) or "kind" not in data:
            raise ValueError(f"not a change log line: {line[:80]!r}")
        names = {f.name for f in fields(cls)} - {"recorded"}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class Provenance:
    """What the log keeps of a change beside what it did: when it was made (epoch ms UTC, read under the catalog's
    lock; None: not recorded), who made it and through which door (None: not known), and whether it back-filled
    recorded history."""

    made_at: int | None = None
    made_by: MadeBy | None = None
    backfill: bool = False

    def entry_fields(self, version: int) -> dict[str, Any]:
        """The fields of the log entry of `version` that say which version a change made, when, by whom, through
        which door, and whether it was a backfill."""
        who, door = (self.made_by.who, self.made_by.door) if self.made_by else (None, None)
        return {"version": version, "made_at": self.made_at, "who": who, "door": door, "backfill": self.backfill}


def describe_change(catalog: Catalog, version: int, provenance: Provenance = Provenance()) -> ChangeEntry:
    """The change that made `version` of the catalog, read from the entry it added (a price, a budget, an exclusion);
    `start` for version 0 (the catalog a deployment started with). It searches the catalog for the version: where
    the change is known, `describe_made` costs the change's size, not the catalog's."""
    made = provenance.entry_fields(version)
    if version == 0:  # the ads the catalog started with: those whose history begins at version 0
        started = sum(1 for ad in catalog if ad.prices and min(p.version for p in ad.prices) == 0)
        return ChangeEntry(kind="start", ads=started, **made)
    for ad in catalog:
        if any(entry.version == version for entry in ad.prices):
            return _price_entry(catalog, ad.ad_id, made)
    for campaign_id, budgets in catalog.budgets.items():
        if any(budget.version == version for budget in budgets):
            return _budget_entry(catalog, campaign_id, made)
    if any(change.version == version for change in catalog.exclusions.changes):
        return _exclusion_entry(catalog, made)
    return ChangeEntry(kind="unknown", **made)


def describe_made(catalog: Catalog, change: CatalogChange, provenance: Provenance = Provenance()) -> ChangeEntry:
    """The entry of `change`, just made as `catalog`'s version: `describe_change` without searching the catalog for
    the version (the change says which ad, campaign or range it touched), so that its cost is the change's, not the
    catalog's."""
    made = provenance.entry_fields(catalog.version)
    if isinstance(change, AdChange):
        return _price_entry(catalog, change.ad_id, made)
    if isinstance(change, BudgetSetting):
        return _budget_entry(catalog, change.campaign_id, made)
    return _exclusion_entry(catalog, made)


def _price_entry(catalog: Catalog, ad_id: str, made: dict[str, Any]) -> ChangeEntry:
    """The log entry of the price entry that made version `made["version"]` of ad `ad_id`."""
    version = made["version"]
    ad = catalog[ad_id]
    entry = next(p for p in ad.prices if p.version == version)
    return ChangeEntry(
        kind=_price_kind(catalog, ad_id, version),
        effective_from=entry.effective_from,
        cpc_micros=entry.cpc_micros,
        ad_id=ad.ad_id,
        campaign_id=ad.campaign_id,
        advertiser_id=ad.advertiser_id,
        currency=ad.currency,
        **made,
    )


def _budget_entry(catalog: Catalog, campaign_id: str, made: dict[str, Any]) -> ChangeEntry:
    """The log entry of the budget entry that made version `made["version"]` of campaign `campaign_id`."""
    budget = next(b for b in catalog.budget_history(campaign_id) if b.version == made["version"])
    advertiser = catalog.advertiser_of_campaign(campaign_id)
    return ChangeEntry(
        kind="set-budget",
        campaign_id=campaign_id,
        advertiser_id=advertiser,
        currency=catalog.currency_of(advertiser or ""),
        effective_from=budget.effective_from,
        daily_budget_micros=budget.daily_budget_micros,
        **made,
    )


def _exclusion_entry(catalog: Catalog, made: dict[str, Any]) -> ChangeEntry:
    """The log entry of the exclusion list's entry that made version `made["version"]`."""
    excluded = next(c for c in catalog.exclusions.changes if c.version == made["version"])
    return ChangeEntry(
        kind="exclude-ip" if excluded.excluded else "include-ip",
        cidr=excluded.cidr,
        effective_from=excluded.effective_from,
        excluded=excluded.excluded,
        **made,
    )


def _price_kind(catalog: Catalog, ad_id: str, version: int) -> str:
    """create-ad for an ad's first entry, pause for no price, resume after a pause, set-price otherwise."""
    ad = catalog[ad_id]
    entry = next(p for p in ad.prices if p.version == version)
    earlier = [p for p in ad.prices if p.version < version]
    if not earlier:
        return "create-ad"
    if entry.cpc_micros is None:
        return "pause"
    before = [p for p in earlier if p.effective_from <= entry.effective_from]
    in_force = max(before, key=lambda p: (p.effective_from, p.version)) if before else None
    return "resume" if in_force is not None and in_force.cpc_micros is None else "set-price"


def read_lines(lines: Iterable[str]) -> list[ChangeEntry]:
    """The entries of the log's lines; a line that does not read (a write torn by a crash) is left out."""
    entries = []
    for line in lines:
        if not line.strip():
            continue
        try:
            entries.append(ChangeEntry.from_json(line))
        except (ValueError, TypeError):
            continue
    return entries


def merge_log(catalog: Catalog, recorded: Iterable[ChangeEntry]) -> list[ChangeEntry]:
    """One entry per change, oldest first: the recorded line of each version (the first, should a version have been
    written twice), and for every version of the catalog the log lacks, the change read from the catalog
    (`recorded` False). A `start` is kept per recorded start: each new catalog is a change."""
    by_version: dict[int, ChangeEntry] = {}
    starts: list[ChangeEntry] = []
    for entry in recorded:
        if entry.kind == "start":
            starts.append(entry)
        else:
            by_version.setdefault(entry.version, entry)
    present = _versions(catalog)
    if 0 in present and not any(s.version == 0 for s in starts):
        starts.insert(0, replace(describe_change(catalog, 0), recorded=False))
    for version in sorted(present - set(by_version) - {0}):
        by_version[version] = replace(describe_change(catalog, version), recorded=False)
    merged = [*starts, *by_version.values()]
    return sorted(merged, key=lambda e: (e.version, e.made_at or 0))


def _versions(catalog: Catalog) -> set[int]:
    """Every version a history entry of the catalog carries (0 for what the catalog started with)."""
    found = {p.version for ad in catalog for p in ad.prices}
    found |= {b.version for entries in catalog.budgets.values() for b in entries}
    found |= {c.version for c in catalog.exclusions.changes}
    found |= set(range(1, catalog.version + 1))
    return found


def by_version(entries: Iterable[ChangeEntry]) -> dict[int, ChangeEntry]:
    """The entries by the version they made (the latest start for version 0): to put beside history entries."""
    return {e.version: e for e in entries}


@dataclass(frozen=True)
class ChangeFilter:
    """Which changes a person asks for; every field empty means all."""

    who: str | None = None
    door: str | None = None
    kind: str | None = None
    advertiser_id: str | None = None
    campaign_id: str | None = None
    ad_id: str | None = None
    since_ms: int | None = None
    """Made at or after (epoch ms); an entry whose time is not recorded is left out once a time is asked for."""
    until_ms: int | None = None
    """Made before (epoch ms)."""

    def keeps(self, entry: ChangeEntry) -> bool:
        checks: Mapping[str, str | None] = {
            "who": entry.who,
            "door": entry.door_kind,
            "kind": entry.kind,
            "advertiser_id": entry.advertiser_id,
            "campaign_id": entry.campaign_id,
            "ad_id": entry.ad_id,
        }
        for name, value in checks.items():
            wanted = getattr(self, name)
            if wanted and value != wanted:
                return False
        if self.since_ms is not None and (entry.made_at is None or entry.made_at < self.since_ms):
            return False
        return not (self.until_ms is not None and (entry.made_at is None or entry.made_at >= self.until_ms))


def filtered(entries: Iterable[ChangeEntry], wanted: ChangeFilter) -> list[ChangeEntry]:
    """The entries `wanted` keeps, newest first: by when they were made (a change of the catalog and one of the
    billing profiles are numbered apart), then by version; an entry whose time is not recorded is an old one."""
    return sorted((e for e in entries if wanted.keeps(e)), key=lambda e: (e.made_at or 0, e.version), reverse=True)


def profile_changes(entries: Iterable[BillingProfile]) -> list[ChangeEntry]:
    """Each entry of the billing profiles' history as a change (`billing-profile`), with who made it, through which
    door and when, so that one list holds every change people make to the records billing reads."""
    return [
        ChangeEntry(
            version=e.version,
            kind="billing-profile",
            made_at=e.made_at,
            who=e.made_by,
            door=e.door,
            advertiser_id=e.advertiser_id,
            effective_from=e.effective_from,
            name=e.name,
            tax_rate=e.tax_rate,
            recorded=e.made_at is not None,
        )
        for e in entries
    ]
