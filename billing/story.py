"""A click's story: why it was charged, or why not (docs/billing-rules.md, "Who sees what"), from what the product holds
of it.

In (`Evidence`, plain rows that `billing.store.click_story` finds in the data folder's files): every copy of the click
received (the archive, the quarantine, the records released from it, the id conflicts reconciliation found), the
impressions of its ad and user around its time, the user's other clicks around it, what the stream did (the ledger,
`unbilled/`, `not_charged/`), every correction, the export rows that carry it, and the books of its campaign's day
before it (for a budget). With the catalog's history and its change log, the thresholds the click was judged with
and the crawler list, `tell` gives the story (`ClickStory`):

- **the outcome the books hold**: a closed period's, as finance was given it (its export's click row and the
  adjustments booked for it later); an open period's, the stream's ledger plus its corrections (`book_counts`, the
  same arithmetic as the audit's "books"). Charged (at what, net), or not charged and why: the reason the books
  give (a correction's, the export's `not_charged` row, the stream's), or not billable by the attribution rule;
- **why**, read again from the evidence by the contract's rule (`billing.rule`, `billing.invalid`,
  `billing.budgets`): the impression it is attributed to (the latest qualifying, ties to the smallest id) and the
  other ones that qualified, the price entry in force at its time (its version, who made it), the crawler pattern
  its user agent matches, the excluded range its address lies in, the flood's clicks, the earlier twin, the budget
  and what the day had charged before it. Where the rule over everything received so far says otherwise than the
  books of an open period (reconciliation has not taken the period up yet), the story says both.

`for_advertiser` leaves out what belongs to another advertiser (a conflicting copy on its ad, a bill charged to
it, the user's clicks on its ads). Pure: rows in, values out; `describe` words it for people.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from billing.budgets import BudgetChange, day_start, utc_day
from billing.catalog import Catalog, PriceChange, Unbillable
from billing.change_log import ChangeEntry
from billing.invalid import DEFAULT_RULES, ExclusionChange, IvtRules, flood_clicks, parse_cidr, parse_ip
from billing.money import format_micros
from billing.periods import ANY_PERIOD, Periods, format_utc
from billing.rule import ATTRIBUTION_WINDOW_MS

CHARGED = "charged"
NOT_CHARGED = "not_charged"
NOT_BILLABLE = "not_billable"
"""No impression of its ad and user at most 10 s before it: the attribution rule bills nothing."""
QUARANTINED = "quarantined"
"""Every copy received is bad input: none reached the rule."""
NOT_RECEIVED = "not_received"
PAST_HORIZON = "past_horizon"
"""Not found where the story searched, which is not all there is: without a day, the last `story_days` days of
click-level detail while the data folder holds older days; with a day past them, that day's exports (which do not
name it). Not an answer about the click: its day, or the day's click-level files, may still hold it."""

BOOK_KINDS = ("ledger", "correction", "export")
"""The index's kinds of rows that count in the books (`book_counts`)."""


# --- What the index finds -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BookRow:
    """One row of the books for the arithmetic of `book_counts`: a ledger row (+1), a correction (its sign), an
    export's click row (+1 billed or added, 0 retracted)."""

    click_id: str
    kind: str
    period: str
    amount_micros: int
    sign: int
    booked_period: str | None = None
    click_time: int | None = None


@dataclass
class Evidence:
    """Everything found of one click id (plain rows, as the files hold them, with `file` and `row` where they are)."""

    click_id: str
    copies: list[dict[str, Any]] = field(default_factory=list)
    """Archive rows of the click id (valid copies), with `batch_id`, `period`, `file`, `row`."""
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    """Quarantine rows of the click id on the clicks topic (bad copies), with `batch_id`."""
    released: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    unbilled: list[dict[str, Any]] = field(default_factory=list)
    not_charged: list[dict[str, Any]] = field(default_factory=list)
    corrections: list[dict[str, Any]] = field(default_factory=list)
    export_rows: list[dict[str, Any]] = field(default_factory=list)
    """Rows of exports' `billing.parquet` (click and adjustment rows), with `period`, `file`, `row`."""
    export_not_charged: list[dict[str, Any]] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    """The periods with an export (closed) among those the click's rows name."""
    judged_with: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per closed period, what its export was judged with (`manifest.json`: crawler list version, thresholds)."""
    impressions: list[dict[str, Any]] = field(default_factory=list)
    """Archive impression rows of the click's ad and user near its time."""
    user_clicks: list[dict[str, Any]] = field(default_factory=list)
    """Archive click rows of the click's user within the flood window either side of it."""
    budget_day: list[BookRow] = field(default_factory=list)
    """The books of the click's campaign on its UTC day up to its time (with `click_time`), for a budget."""


# --- The story ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy of the click id received: where and when, what it said, and what became of it."""

    topic: str | None
    partition: int | None
    offset: int | None
    received_ms: int | None
    event_time: int | None
    ad_id: str | None
    user_id: str | None
    user_agent: str | None
    ip: str | None
    batch_id: int | None
    status: str
    """`stands` (the first valid copy by arrival), `duplicate` (same content, changes nothing), `id_conflict`
    (other content: quarantined), or a quarantine reason (`time_out_of_range`, `missing_field`, ...)."""
    late: bool = False
    """Arrived after the stream's watermark had passed it: the live join did not see it."""
    released_by: str | None = None
    """`stream` or `reconciliation`: held in quarantine (`unknown_schema`) and released once its schema was known."""
    differs: tuple[str, ...] = ()
    """For an id conflict: the fields that differ from the copy that stands."""
    other_advertiser: bool = False
    """The copy names an ad of another advertiser (its ad is not shown to the click's advertiser)."""


@dataclass(frozen=True, slots=True)
class ImpressionSeen:
    """An impression of the click's ad and user near the click."""

    impression_id: str
    event_time: int
    received_ms: int | None
    gap_ms: int
    """The click's time less the impression's: 0 to 10,000 ms qualifies."""
    qualifies: bool
    attributed: bool = False
    late: bool = False


@dataclass(frozen=True, slots=True)
class PriceInForce:
    """The price entry of the click's ad in force at its time, or why there is none."""

    ad_id: str
    currency: str | None
    effective_from: int | None
    cpc_micros: int | None
    version: int | None
    unbillable: str | None
    """`ad_paused`, `unknown_ad`, or None when priced."""
    change: ChangeEntry | None = None
    """Who made the entry, when and through which door (the change log)."""


@dataclass(frozen=True, slots=True)
class StreamStep:
    """What the streaming job did with the click in one micro-batch."""

    action: str
    """`charged` (a ledger row: counted in the live totals), `not_charged` (an invalid traffic rule, the budget),
    `unbilled` (no price at its time)."""
    batch_id: int | None
    period: str | None
    billed_at_ms: int | None
    impression_id: str | None
    amount_micros: int | None
    currency: str | None
    reason: str | None
    advertiser_id: str | None = None


@dataclass(frozen=True, slots=True)
class BookEntry:
    """A correction of the click: reconciliation's entry, an adjustment when booked in a later period."""

    correction_id: str
    kind: str
    reason: str
    amount_micros: int
    currency: str
    corrects_period: str
    booked_period: str
    created_at_ms: int
    ad_id: str
    advertiser_id: str

    @property
    def adjustment(self) -> bool:
        return self.booked_period != self.corrects_period


@dataclass(frozen=True, slots=True)
class ExportRow:
    """A row of a finance export that carries the click: a click row of its period, an adjustment of a later one,
    or a row of the period's not-charged file."""

    period: str
    file: str
    row: int
    """0-based, in the Parquet file; `billing.csv` has it on line `row + 2` (after its header)."""
    record_type: str
    status: str | None
    amount_micros: int | None
    net_micros: int | None
    currency: str | None
    reason: str | None
    correction_id: str | None
    corrects_period: str | None
    advertiser_id: str | None = None

    @property
    def csv_line(self) -> int | None:
        return self.row + 2 if self.file == "billing.parquet" else None


@dataclass(frozen=True, slots=True)
class NearbyClick:
    """A click of the same user near the click (a flood's, the earlier twin); None ids for another advertiser's."""

    click_id: str | None
    ad_id: str | None
    event_time: int


@dataclass(frozen=True, slots=True)
class InvalidTraffic:
    """What each invalid traffic rule finds about the click, the first that applies giving the reason."""

    reason: str | None
    bot_pattern: str | None = None
    """The crawler list's pattern the user agent matches (the first of them)."""
    crawler_list_version: str | None = None
    excluded_range: str | None = None
    exclusion: ExclusionChange | None = None
    exclusion_change: ChangeEntry | None = None
    flood: tuple[NearbyClick, ...] = ()
    """The run of the user's clicks that makes the flood (the click among them), when it is one."""
    twin: NearbyClick | None = None
    """The user's previous click on the same ad, when at most the duplicate window before."""
    rules: IvtRules = DEFAULT_RULES


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """The click against its campaign's daily budget: what the day had charged before it (in event-time order, as
    the books hold them), its price, and the budget in force at its time."""

    campaign_id: str
    day: str
    budget_micros: int | None
    """None: unlimited."""
    entry: BudgetChange | None
    change: ChangeEntry | None
    charged_before_micros: int
    charged_before_clicks: int
    price_micros: int
    currency: str

    @property
    def fits(self) -> bool:
        return self.budget_micros is None or self.charged_before_micros + self.price_micros <= self.budget_micros


@dataclass(frozen=True, slots=True)
class Outcome:
    """The click's outcome as the books hold it."""

    status: str
    """`charged`, `not_charged`, `not_billable`, `quarantined` or `not_received`."""
    reason: str | None
    """Why not charged: a correction's reason, an invalid traffic rule, `over_budget`, `ad_paused`, `unknown_ad`;
    for a click still to be billed by reconciliation, `late_click`, `late_impression` or `missed_match`."""
    amount_micros: int
    """Net micros charged (0 when not charged)."""
    currency: str | None
    period: str | None
    closed: bool
    """The period is closed: the outcome is its export's plus the adjustments booked for it later."""
    settled_by: str | None = None
    """Where the outcome comes from: `export`, `adjustment`, `correction`, `stream`, `rule`."""
    rule_says: str | None = None
    """An open period's books that the rule over everything received contradicts (reconciliation has not taken the
    period up yet): what the rule says, `charged` or a reason."""


@dataclass(frozen=True, slots=True)
class Searched:
    """Where a story looked for the click: its day when given (YYYY-MM-DD, UTC), else the days from `since` to today,
    newest first; `story_days` the horizon of click-level detail (None: every day)."""

    day: str | None = None
    since: str | None = None
    """The oldest day searched without a day given (today less `story_days`); None: every day the folder holds."""
    story_days: int | None = None
    past_horizon: bool = False
    """The answer lies past the horizon: the day given is older than `story_days`, or (without a day) the click is not
    among the days searched and the data folder holds older ones."""
    from_exports: bool = False
    """The answer comes from the finance exports only (a day past the horizon): click-level detail was not read."""
    exported_periods: int | None = None
    """For an answer from the exports: how many of the day's periods have an export in the data folder."""


@dataclass(frozen=True)
class ClickStory:
    """Everything the product knows of one click id, and why it was charged or not."""

    click_id: str
    outcome: Outcome
    advertiser_id: str | None = None
    campaign_id: str | None = None
    ad_id: str | None = None
    user_id: str | None = None
    event_time: int | None = None
    currency: str | None = None
    copies: tuple[Copy, ...] = ()
    impressions: tuple[ImpressionSeen, ...] = ()
    price: PriceInForce | None = None
    invalid: InvalidTraffic | None = None
    budget: BudgetCheck | None = None
    stream: tuple[StreamStep, ...] = ()
    corrections: tuple[BookEntry, ...] = ()
    exports: tuple[ExportRow, ...] = ()
    notes: tuple[str, ...] = ()
    searched: Searched | None = field(default=None, compare=False)
    """Where the story looked (not compared: the same click's story found with its day or without is the same)."""

    @property
    def received(self) -> bool:
        """A copy was found, or (past the horizon) the exports give it an outcome."""
        return bool(self.copies) or self.outcome.status in (CHARGED, NOT_CHARGED, NOT_BILLABLE)

    @property
    def attributed(self) -> ImpressionSeen | None:
        return next((i for i in self.impressions if i.attributed), None)

    @property
    def standing(self) -> Copy | None:
        return next((c for c in self.copies if c.status == "stands"), None)

    def to_dict(self) -> dict[str, Any]:
        """The story as plain values (the API writes micros as strings: `web.click_pages`)."""
        document = asdict(self)
        document["received"] = self.received
        document["why"] = describe(self)
        for row, export in zip(document["exports"], self.exports, strict=True):
            row["csv_line"] = export.csv_line
        for row, correction in zip(document["corrections"], self.corrections, strict=True):
            row["adjustment"] = correction.adjustment
        if self.budget is not None:
            document["budget"]["fits"] = self.budget.fits
        if self.invalid is not None and not (self.invalid.flood or self.invalid.twin):
            del document["invalid"]["rules"]  # the thresholds matter to a flood or a twin only
        return document


# --- The books ----------------------------------------------------------------------------------------------------


def book_counts(rows: Iterable[BookRow], closed: Callable[[str], bool]) -> dict[str, tuple[int, int]]:
    """Per click id, (net clicks, net micros) in the books: a closed period as finance was given it (its export's
    click row, +1 when billed or added, and the adjustments booked for it in later periods), an open one as the
    ledger and its corrections hold it."""
    clicks: dict[str, int] = defaultdict(int)
    micros: dict[str, int] = defaultdict(int)
    for row in rows:
        if counts_in_books(row, closed(row.period)):
            clicks[row.click_id] += row.sign
            micros[row.click_id] += row.sign * row.amount_micros
    return {click: (clicks[click], micros[click]) for click in clicks}


def counts_in_books(row: BookRow, closed: bool) -> bool:
    """Whether a row counts in its period's books: export rows and later adjustments once closed; the ledger and
    every correction while open."""
    if closed:
        return row.kind == "export" or (row.kind == "correction" and row.booked_period != row.period)
    return row.kind in ("ledger", "correction")


def by_price(rows: Iterable[BookRow], closed: Callable[[str], bool]) -> list[tuple[int, int]]:
    """(price in micros, net clicks) of the rows as the books count them, by price, dearest first; a price whose
    clicks net to zero is left out."""
    return by_price_counted(((row, 1) for row in rows), closed)


def by_price_counted(counted: Iterable[tuple[BookRow, int]], closed: Callable[[str], bool]) -> list[tuple[int, int]]:
    """`by_price` of rows each standing for a number of rows alike (a period's price counts)."""
    clicks: dict[int, int] = defaultdict(int)
    for row, n in counted:
        if counts_in_books(row, closed(row.period)):
            clicks[row.amount_micros] += row.sign * n
    return sorted(((price, n) for price, n in clicks.items() if n), reverse=True)


# --- Telling it -----------------------------------------------------------------------------------------------------


def tell(
    evidence: Evidence,
    catalog: Catalog,
    changes: Mapping[int, ChangeEntry],
    periods: Periods,
    rules: IvtRules = DEFAULT_RULES,
    bot_patterns: Callable[[str, str | None], list[str]] = lambda user_agent, version: [],
    crawler_list_version: str | None = None,
) -> ClickStory:
    """The click's story (module doc). `changes` is the change log by version; `rules` the thresholds of periods
    not yet closed (a closed period's export says its own); `bot_patterns` the patterns a user agent matches in a
    version of the crawler list (None: the installed one; a closed period's export names its own)."""
    click_id = evidence.click_id
    copies = _copies(evidence)
    standing = next((c for c in copies if c.status == "stands"), None)
    notes: list[str] = []
    if standing is None or standing.event_time is None or standing.ad_id is None or standing.user_id is None:
        status = QUARANTINED if copies else NOT_RECEIVED
        return ClickStory(
            click_id, Outcome(status, None, 0, None, None, False), copies=tuple(copies), notes=tuple(notes)
        )
    at, ad_id, user_id = standing.event_time, standing.ad_id, standing.user_id
    period = periods.key_of(at)
    closed = period in evidence.closed
    judged = evidence.judged_with.get(period, {}) if closed else {}
    rules = rules.or_judged_with(judged)
    ad = catalog.get(ad_id)
    impressions = _impressions(evidence.impressions, ad_id, user_id, at)
    attributed = next((i for i in impressions if i.attributed), None)
    price = _price(catalog, ad_id, at, changes)
    invalid = _invalid(evidence, standing, catalog, changes, rules, bot_patterns, judged, crawler_list_version)
    advertiser = ad.advertiser_id if ad else _named_advertiser(evidence)
    budget = None
    if ad is not None and price.cpc_micros is not None and catalog.budgets.get(ad.campaign_id):
        budget = _budget(evidence, catalog, changes, ad.campaign_id, ad.currency, at, click_id, price.cpc_micros)
    stream = tuple(_stream(evidence))
    corrections = tuple(sorted(_corrections(evidence), key=lambda c: (c.created_at_ms, c.kind != "retraction")))
    exports = tuple(_exports(evidence))
    outcome = _outcome(evidence, period, closed, corrections, exports, stream, standing, attributed)
    says = _rule_verdict(attributed, price, invalid, budget)
    if not closed and outcome.status != QUARANTINED and says != _books_verdict(outcome):
        outcome = replace(outcome, rule_says=says)
        notes.append(
            f"Reconciliation has not taken period {period} up yet: the rule over everything received so far says "
            f"{_verdict_words(says)}; the books will follow when the period is reconciled."
        )
    judged_version = judged.get("crawler_list_version") if closed else None
    if judged_version and crawler_list_version and judged_version != crawler_list_version:
        notes.append(
            f"Period {period} was judged with version {judged_version} of the crawler list; {crawler_list_version} "
            "is installed now."
        )
    return ClickStory(
        click_id=click_id,
        outcome=outcome,
        advertiser_id=advertiser,
        campaign_id=ad.campaign_id if ad else None,
        ad_id=ad_id,
        user_id=user_id,
        event_time=at,
        currency=ad.currency if ad else outcome.currency,
        copies=tuple(copies),
        impressions=tuple(impressions),
        price=price,
        invalid=invalid,
        budget=budget,
        stream=stream,
        corrections=corrections,
        exports=exports,
        notes=tuple(notes),
    )


def beyond_horizon(evidence: Evidence, searched: Searched) -> ClickStory:
    """The story of a click id not found among the days searched without a day (`searched.since` to today) while the
    data folder holds older ones: not an outcome. It shows what was found all the same (bad copies in the
    quarantine, later exports' adjustments of it), none of which says what its own period billed."""
    return ClickStory(
        evidence.click_id,
        Outcome(PAST_HORIZON, None, 0, None, None, False),
        advertiser_id=_named_advertiser(evidence),
        copies=tuple(_copies(evidence)),
        exports=tuple(_exports(evidence)),
        searched=replace(searched, past_horizon=True),
    )


def tell_from_exports(evidence: Evidence, searched: Searched) -> ClickStory:
    """The story of a click of a day past the horizon (`searched.day`), from the finance exports only (`evidence`
    holds the export rows that name it: the day's click and not-charged rows, and later exports' adjustments): what
    finance was given, counted as `billing.export.export_totals` counts it (a click row billed or added is one
    click, a retracted one none, an adjustment plus or minus one; micros its `net_micros`). Nothing of the
    click-level files (its copies, impression, price, the rule) is read, and the story says so."""
    searched = replace(searched, past_horizon=True, from_exports=True)
    day = (searched.day or "").replace("-", "")

    def of_day(row: Mapping[str, Any]) -> bool:
        if row.get("record_type") == "adjustment":
            return str(row.get("corrects_period") or "").startswith(day)
        return str(row.get("period") or "").startswith(day)

    kept = Evidence(
        evidence.click_id,
        export_rows=[r for r in evidence.export_rows if of_day(r)],
        export_not_charged=[r for r in evidence.export_not_charged if of_day(r)],
    )
    exports = _exports(kept)
    own = [e for e in exports if e.record_type != "adjustment"]
    if not exports:
        return ClickStory(evidence.click_id, Outcome(PAST_HORIZON, None, 0, None, None, False), searched=searched)
    period = own[0].period if own else str(exports[0].corrects_period)
    mine = [e for e in exports if (e.period if e.record_type != "adjustment" else e.corrects_period) == period]
    billed = [e for e in mine if e.file == "billing.parquet"]
    clicks = sum((-1 if e.record_type == "adjustment" else 0) if e.status == "retracted" else 1 for e in billed)
    micros = sum(e.net_micros or 0 for e in billed)
    currency = next((e.currency for e in mine if e.currency), None)
    adjusted = any(e.record_type == "adjustment" for e in mine)
    retraction = next((e for e in reversed(mine) if e.record_type == "adjustment" and e.status == "retracted"), None)
    refused = next((e for e in mine if e.file == "not_charged.parquet"), None)
    retracted = next((e for e in mine if e.record_type == "click" and e.status == "retracted"), None)
    if clicks > 0:
        outcome = Outcome(CHARGED, None, micros, currency, period, True, "adjustment" if adjusted else "export")
    elif retraction is not None:
        outcome = Outcome(NOT_CHARGED, retraction.reason, 0, currency, period, True, "adjustment")
    else:
        why = refused or retracted
        outcome = Outcome(NOT_CHARGED, why.reason if why else None, 0, currency, period, True, "export")
    rows = [*kept.export_rows, *kept.export_not_charged]
    first = next((r for r in rows if r.get("period") == period and r.get("record_type") != "adjustment"), None)
    described = first or next((r for r in rows if r.get("ad_id")), {})
    return ClickStory(
        evidence.click_id,
        outcome,
        advertiser_id=next((e.advertiser_id for e in mine if e.advertiser_id), None),
        campaign_id=described.get("campaign_id"),
        ad_id=described.get("ad_id"),
        user_id=described.get("user_id"),
        event_time=described.get("click_time"),
        currency=currency,
        exports=tuple(mine),
        searched=searched,
    )


def _named_advertiser(evidence: Evidence) -> str | None:
    """The advertiser the books name, for an ad the catalog no longer holds."""
    for row in (*evidence.ledger, *evidence.not_charged, *evidence.export_rows, *evidence.unbilled):
        if row.get("advertiser_id"):
            return str(row["advertiser_id"])
    return None


def _copies(evidence: Evidence) -> list[Copy]:
    """Every copy: valid ones by arrival (the first stands; a later one is a duplicate or an id conflict), then the
    bad ones the intake quarantined."""
    released = {(r["topic"], r["partition"], r["offset"]): r.get("released_by") for r in evidence.released}
    valid = sorted(
        evidence.copies, key=lambda r: (r.get("received_ms") or 0, r.get("partition") or 0, r.get("offset") or 0)
    )
    out: list[Copy] = []
    first: dict[str, Any] | None = None
    for row in valid:
        differs: tuple[str, ...] = ()
        if first is None:
            first, status = row, "stands"
        else:
            differs = tuple(n for n in ("ad_id", "user_id", "event_time") if row.get(n) != first.get(n))
            status = "id_conflict" if differs else "duplicate"
        out.append(
            Copy(
                row.get("topic"),
                row.get("partition"),
                row.get("offset"),
                row.get("received_ms"),
                row.get("event_time"),
                row.get("ad_id"),
                row.get("user_id"),
                row.get("user_agent"),
                row.get("ip"),
                row.get("batch_id"),
                status,
                bool(row.get("late")),
                released.get((row.get("topic"), row.get("partition"), row.get("offset"))),
                differs,
            )
        )
    for row in sorted(evidence.quarantined, key=lambda r: (r.get("received_ms") or 0, r.get("offset") or 0)):
        coordinates = (row.get("topic"), row.get("partition"), row.get("offset"))
        if coordinates in released and released[coordinates] is not None and _released_ok(evidence, coordinates):
            continue  # released into the archive: the archive's copy tells it
        out.append(
            Copy(
                row.get("topic"),
                row.get("partition"),
                row.get("offset"),
                row.get("received_ms"),
                row.get("event_time"),
                row.get("ad_id"),
                None,
                None,
                None,
                row.get("batch_id"),
                str(row.get("reason") or "quarantined"),
            )
        )
    return out


def _released_ok(evidence: Evidence, coordinates: tuple[Any, ...]) -> bool:
    return any(
        (r["topic"], r["partition"], r["offset"]) == coordinates and r.get("reason") is None for r in evidence.released
    )


def _first_copies(rows: Iterable[Mapping[str, Any]], id_name: str) -> dict[str, Mapping[str, Any]]:
    """The first copy of each id by arrival (the one that stands)."""
    first: dict[str, Mapping[str, Any]] = {}
    ordered = sorted(rows, key=lambda r: (r.get("received_ms") or 0, r.get("partition") or 0, r.get("offset") or 0))
    for row in ordered:
        first.setdefault(str(row[id_name]), row)
    return first


def _impressions(rows: Iterable[Mapping[str, Any]], ad_id: str, user_id: str, at: int) -> list[ImpressionSeen]:
    """The standing impressions of the ad and user near the click, latest first; the latest qualifying one (ties:
    the smallest id) is the one the click is attributed to."""
    standing = _first_copies(rows, "event_id")
    mine = [r for r in standing.values() if r.get("ad_id") == ad_id and r.get("user_id") == user_id]
    qualifying = [r for r in mine if at - ATTRIBUTION_WINDOW_MS <= r["event_time"] <= at]
    chosen = max(qualifying, key=lambda r: (r["event_time"], _negated(r["event_id"])), default=None)
    seen = [
        ImpressionSeen(
            str(r["event_id"]),
            r["event_time"],
            r.get("received_ms"),
            at - r["event_time"],
            at - ATTRIBUTION_WINDOW_MS <= r["event_time"] <= at,
            r is chosen,
            bool(r.get("late")),
        )
        for r in mine
    ]
    return sorted(seen, key=lambda i: (-i.event_time, i.impression_id))


class _negated:
    """Orders strings backwards (the smallest id wins a tie of `max`)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _negated) -> bool:
        return self.text > other.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _negated) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)


def _price(catalog: Catalog, ad_id: str, at: int, changes: Mapping[int, ChangeEntry]) -> PriceInForce:
    ad = catalog.get(ad_id)
    entry: PriceChange | None = ad.entry_at(at) if ad else None
    if ad is None or entry is None:
        return PriceInForce(ad_id, ad.currency if ad else None, None, None, None, Unbillable.UNKNOWN_AD.value)
    return PriceInForce(
        ad_id,
        ad.currency,
        entry.effective_from,
        entry.cpc_micros,
        entry.version,
        Unbillable.AD_PAUSED.value if entry.cpc_micros is None else None,
        changes.get(entry.version),
    )


def _invalid(
    evidence: Evidence,
    standing: Copy,
    catalog: Catalog,
    changes: Mapping[int, ChangeEntry],
    rules: IvtRules,
    bot_patterns: Callable[[str, str | None], list[str]],
    judged: Mapping[str, Any],
    installed_version: str | None,
) -> InvalidTraffic:
    """Each rule over the click and its user's clicks (standing copies), the first that applies giving the reason."""
    at = standing.event_time or 0
    version = judged.get("crawler_list_version")
    patterns = bot_patterns(standing.user_agent, str(version) if version else None) if standing.user_agent else []
    excluded = catalog.exclusions.excluding(standing.ip, at) if parse_ip(standing.ip) is not None else None
    exclusion = _exclusion_entry(catalog, excluded, at) if excluded else None
    users = _first_copies(evidence.user_clicks, "event_id")
    users.setdefault(evidence.click_id, {"event_id": evidence.click_id, "ad_id": standing.ad_id, "event_time": at})
    mine = [r for r in users.values() if r.get("user_id", standing.user_id) == standing.user_id]
    times = [(r["event_time"], str(r["event_id"])) for r in mine]
    flooded = flood_clicks(times, rules)
    flood: tuple[NearbyClick, ...] = ()
    if evidence.click_id in flooded:
        run = _flood_run(times, evidence.click_id, rules)
        flood = tuple(NearbyClick(c, _ad_of(mine, c), t) for t, c in run)
    ad_of = {str(r["event_id"]): r.get("ad_id") for r in mine}
    earlier = sorted((t, c) for t, c in times if ad_of.get(c) == standing.ad_id and (t, c) < (at, evidence.click_id))
    twin = None
    if earlier and at - earlier[-1][0] <= rules.duplicate_window_ms:
        twin = NearbyClick(earlier[-1][1], standing.ad_id, earlier[-1][0])
    reason = (
        "known_bot"
        if patterns
        else "excluded_ip"
        if excluded
        else "click_flood"
        if flood
        else "duplicate_click"
        if twin
        else None
    )
    return InvalidTraffic(
        reason,
        patterns[0] if patterns else None,
        str(judged.get("crawler_list_version") or installed_version or "") or None,
        excluded,
        exclusion,
        changes.get(exclusion.version) if exclusion else None,
        flood,
        twin,
        rules,
    )


def _ad_of(rows: Sequence[Mapping[str, Any]], click_id: str) -> Any:
    return next((r.get("ad_id") for r in rows if str(r["event_id"]) == click_id), None)


def _flood_run(times: Sequence[tuple[int, str]], click_id: str, rules: IvtRules) -> list[tuple[int, str]]:
    """The first run of more than `flood_clicks` clicks within the window that holds the click."""
    ordered = sorted(times)
    need = rules.flood_clicks + 1
    for start in range(len(ordered)):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1][0] <= ordered[start][0] + rules.flood_window_ms:
            end += 1
        run = ordered[start : end + 1]
        if len(run) >= need and any(c == click_id for _, c in run):
            return run
    return []


def _exclusion_entry(catalog: Catalog, cidr: str, at: int) -> ExclusionChange | None:
    key = str(parse_cidr(cidr))
    entries = [c for c in catalog.exclusions.changes if str(parse_cidr(c.cidr)) == key and c.effective_from <= at]
    return max(entries, key=lambda c: (c.effective_from, c.version), default=None)


def _budget(
    evidence: Evidence,
    catalog: Catalog,
    changes: Mapping[int, ChangeEntry],
    campaign_id: str,
    currency: str,
    at: int,
    click_id: str,
    price: int,
) -> BudgetCheck:
    """What the campaign's day had charged before the click (the clicks before it by event time, then id, as the
    books hold them) against the budget in force at its time."""
    midnight = day_start(at)
    before = [
        r
        for r in evidence.budget_day
        if r.click_time is not None and midnight <= r.click_time and (r.click_time, r.click_id) < (at, click_id)
    ]
    counts = book_counts(before, lambda period: period in evidence.closed)
    entry = catalog.budget_entry_at(campaign_id, at)
    return BudgetCheck(
        campaign_id,
        utc_day(at),
        catalog.budget_at(campaign_id, at),
        entry,
        changes.get(entry.version) if entry else None,
        sum(m for n, m in counts.values() if n > 0),
        sum(1 for n, _ in counts.values() if n > 0),
        price,
        currency,
    )


def _stream(evidence: Evidence) -> list[StreamStep]:
    steps = [
        StreamStep(
            "charged",
            r.get("batch_id"),
            r.get("period"),
            r.get("billed_at_ms"),
            r.get("impression_id"),
            r.get("amount_micros"),
            r.get("currency"),
            None,
            r.get("advertiser_id"),
        )
        for r in evidence.ledger
    ]
    steps += [
        StreamStep(
            "not_charged",
            r.get("batch_id"),
            r.get("period"),
            r.get("billed_at_ms"),
            r.get("impression_id"),
            r.get("amount_micros"),
            r.get("currency"),
            r.get("reason"),
            r.get("advertiser_id"),
        )
        for r in evidence.not_charged
    ]
    steps += [
        StreamStep(
            "unbilled",
            r.get("batch_id"),
            r.get("period"),
            None,
            r.get("impression_id"),
            None,
            None,
            r.get("reason"),
            r.get("advertiser_id"),
        )
        for r in evidence.unbilled
    ]
    return sorted(steps, key=lambda s: (s.batch_id if s.batch_id is not None else -1, s.action))


def _corrections(evidence: Evidence) -> list[BookEntry]:
    return [
        BookEntry(
            str(r["correction_id"]),
            str(r["kind"]),
            str(r["reason"]),
            int(r["amount_micros"]),
            str(r["currency"]),
            str(r["corrects_period"]),
            str(r["booked_period"]),
            int(r["created_at_ms"]),
            str(r["ad_id"]),
            str(r["advertiser_id"]),
        )
        for r in evidence.corrections
    ]


def _exports(evidence: Evidence) -> list[ExportRow]:
    rows = [
        ExportRow(
            str(r["period"]),
            "billing.parquet",
            int(r["row"]),
            str(r.get("record_type")),
            r.get("status"),
            r.get("amount_micros"),
            r.get("net_micros"),
            r.get("currency"),
            r.get("reason"),
            r.get("correction_id"),
            r.get("corrects_period"),
            r.get("advertiser_id"),
        )
        for r in evidence.export_rows
    ]
    rows += [
        ExportRow(
            str(r["period"]),
            "not_charged.parquet",
            int(r["row"]),
            "not_charged",
            None,
            r.get("amount_micros"),
            0,
            r.get("currency"),
            r.get("reason"),
            None,
            str(r["period"]),
            r.get("advertiser_id"),
        )
        for r in evidence.export_not_charged
    ]
    return sorted(rows, key=lambda e: (e.period, e.file, e.row))


def _outcome(
    evidence: Evidence,
    period: str,
    closed: bool,
    corrections: Sequence[BookEntry],
    exports: Sequence[ExportRow],
    stream: Sequence[StreamStep],
    standing: Copy,
    attributed: ImpressionSeen | None,
) -> Outcome:
    """The outcome the books hold for the click's period, and the reason they give when it is not charged."""
    rows = [
        *(BookRow(evidence.click_id, "ledger", str(s.period), s.amount_micros or 0, 1) for s in stream
          if s.action == "charged" and s.period == period),  # fmt: skip
        *(BookRow(evidence.click_id, "correction", c.corrects_period, abs(c.amount_micros),
                  1 if c.kind == "addition" else -1, c.booked_period) for c in corrections
          if c.corrects_period == period),  # fmt: skip
        *(BookRow(evidence.click_id, "export", e.period, e.amount_micros or 0, 1 if e.status != "retracted" else 0)
          for e in exports if e.file == "billing.parquet" and e.record_type == "click" and e.period == period),
    ]  # fmt: skip
    clicks, micros = book_counts(rows, lambda p: closed).get(evidence.click_id, (0, 0))
    currency = next((c.currency for c in corrections), None) or next((s.currency for s in stream if s.currency), None)
    currency = currency or next((e.currency for e in exports if e.currency), None)
    counted = [c for c in corrections if c.corrects_period == period and (not closed or c.adjustment)]
    if clicks > 0:
        settled = "adjustment" if closed and counted else "export" if closed else "correction" if counted else "stream"
        return Outcome(CHARGED, None, micros, currency, period, closed, settled)
    last_retraction = next((c for c in reversed(counted) if c.kind == "retraction"), None)
    if last_retraction is not None:
        settled = "adjustment" if closed else "correction"
        return Outcome(NOT_CHARGED, last_retraction.reason, 0, currency, period, closed, settled)
    if closed:
        refused = next((e for e in exports if e.file == "not_charged.parquet" and e.period == period), None)
        if refused is not None:
            return Outcome(NOT_CHARGED, refused.reason, 0, refused.currency, period, closed, "export")
        retracted = next((e for e in exports if e.record_type == "click" and e.period == period), None)
        if retracted is not None:
            return Outcome(NOT_CHARGED, retracted.reason, 0, retracted.currency, period, closed, "export")
    else:
        declined = next((s for s in reversed(stream) if s.action != "charged" and s.period == period), None)
        if declined is not None:
            return Outcome(NOT_CHARGED, declined.reason, 0, declined.currency, period, closed, "stream")
    if attributed is None:
        return Outcome(NOT_BILLABLE, None, 0, currency, period, closed, "rule")
    # Billable by the rule, and no book holds it yet: the stream missed it and reconciliation has not run.
    reason = "late_click" if standing.late else "late_impression" if attributed.late else "missed_match"
    return Outcome(NOT_CHARGED, reason, 0, currency, period, closed, "rule")


def _rule_verdict(
    attributed: ImpressionSeen | None, price: PriceInForce, invalid: InvalidTraffic, budget: BudgetCheck | None
) -> str:
    """What the rule says over the evidence: `not_billable`, `charged`, or the reason it is not charged."""
    if attributed is None:
        return NOT_BILLABLE
    if price.unbillable:
        return price.unbillable
    if invalid.reason:
        return invalid.reason
    if budget is not None and not budget.fits:
        return "over_budget"
    return CHARGED


def _books_verdict(outcome: Outcome) -> str | None:
    if outcome.status == CHARGED:
        return CHARGED
    if outcome.status == NOT_BILLABLE:
        return NOT_BILLABLE
    if outcome.reason in ("late_click", "late_impression", "missed_match"):
        return CHARGED  # the books do not hold it yet, and the rule charges it: said by the reason itself
    return outcome.reason


def _verdict_words(verdict: str) -> str:
    if verdict == CHARGED:
        return "charged"
    if verdict == NOT_BILLABLE:
        return "not billable (no qualifying impression)"
    return f"not charged ({verdict})"


# --- What an advertiser may see -------------------------------------------------------------------------------


def for_advertiser(story: ClickStory, advertiser_id: str, catalog: Catalog) -> ClickStory:
    """The story as the click's own advertiser sees it: nothing that names another advertiser (a copy on its ad,
    the stream's or reconciliation's entries charging it, the user's clicks on its ads, who made the operator's
    exclusion entries)."""

    def own_ad(ad_id: str | None) -> bool:
        return ad_id is not None and catalog.advertiser_of(ad_id) == advertiser_id

    copies = tuple(
        c if c.ad_id is None or own_ad(c.ad_id) else replace(c, ad_id=None, other_advertiser=True) for c in story.copies
    )
    invalid = story.invalid
    if invalid is not None:
        flood = tuple(c if own_ad(c.ad_id) else NearbyClick(None, None, c.event_time) for c in invalid.flood)
        # The exclusion list is the operator's: its range and since when, not who keeps it.
        e = invalid.exclusion
        bare = None if e is None else ExclusionChange(e.cidr, e.effective_from, e.excluded, e.version)
        invalid = replace(invalid, flood=flood, exclusion=bare, exclusion_change=None)
    return replace(
        story,
        copies=copies,
        invalid=invalid,
        stream=tuple(s for s in story.stream if s.advertiser_id in (None, advertiser_id)),
        corrections=tuple(c for c in story.corrections if c.advertiser_id == advertiser_id),
        exports=tuple(e for e in story.exports if e.advertiser_id in (None, advertiser_id)),
    )


# --- In words -------------------------------------------------------------------------------------------------------

REASON_WORDS = {
    "ad_paused": "the ad was paused at the click's time",
    "unknown_ad": "the catalog had no such ad at the click's time",
    "known_bot": "invalid traffic: a known crawler's user agent",
    "excluded_ip": "invalid traffic: an address of the IP exclusion list",
    "click_flood": "invalid traffic: a click flood",
    "duplicate_click": "invalid traffic: a second click on the ad within the duplicate window",
    "over_budget": "the campaign's daily budget was spent",
    "duplicate": "the click was billed twice; the extra bill was retracted",
    "id_conflict": "a copy that did not stand (an id conflict) had been billed",
    "not_billable": "the complete data does not support the bill",
    "catalog_change": "the catalog's history prices the click otherwise",
    "late_click": "the click arrived after the stream's watermark: reconciliation bills it",
    "late_impression": "its impression arrived after the stream's watermark: reconciliation bills it",
    "missed_match": "the stream did not match it: reconciliation bills it",
}


def describe(
    story: ClickStory, money: Callable[[int, str], str] | None = None, time: Callable[[int], str] | None = None
) -> list[str]:
    """The story's "why", a sentence a line, with `money(micros, currency)` (all six decimals by default) and
    `time(epoch_ms)` (ISO-8601 UTC by default; the pages pass their own format)."""
    show = money or (lambda micros, currency: format_micros(micros, currency))
    at = time or format_utc

    def _when(at_ms: int | None) -> str:
        return _when_text(at_ms, at)

    def _by(change: ChangeEntry | None) -> str:
        return _by_text(change, at)

    outcome, cur = story.outcome, story.currency or story.outcome.currency or ""
    searched = story.searched
    if outcome.status == PAST_HORIZON:
        return _past_horizon_words(story)
    if outcome.status == NOT_RECEIVED:
        if searched is not None and searched.day:
            return [
                f"No click with the id {story.click_id} was received on {searched.day} (UTC): that day was searched."
            ]
        return [f"No click with the id {story.click_id} was ever received."]
    if outcome.status == QUARANTINED:
        reasons = ", ".join(sorted({c.status for c in story.copies}))
        return [f"Every copy of click {story.click_id} received was bad input ({reasons}): none reached the rule."]
    lines = []
    state = "closed: as exported, with later adjustments" if outcome.closed else "open"
    begins = f"from {at(ANY_PERIOD.parse_key(outcome.period))}" if outcome.period else "of the click"
    books = f"the period {begins} ({state})"
    if outcome.status == CHARGED:
        lines.append(f"Charged {show(outcome.amount_micros, cur)} in the books of {books}.")
    elif outcome.status == NOT_BILLABLE:
        lines.append(f"Not charged: not billable, in the books of {books}.")
    else:
        words = REASON_WORDS.get(outcome.reason or "", outcome.reason or "")
        lines.append(f"Not charged: {words} ({outcome.reason}); in the books of {books}.")
    if searched is not None and searched.from_exports:
        lines.append(
            f"Told from the finance exports only (what finance was given): {searched.day} is past the "
            f"{searched.story_days}-day horizon of click-level detail (story_days), which was not searched: its "
            "copies, impression, price and the rule's reading are not shown."
        )
        return [*lines, *story.notes]
    attributed = story.attributed
    if attributed is None:
        nearest = next((i for i in story.impressions if i.event_time <= (story.event_time or 0)), None)
        gap = f"; the latest before it was {nearest.gap_ms:,} ms before" if nearest else ""
        lines.append(f"No impression of ad {story.ad_id} for its user at most 10 s before the click{gap}.")
    else:
        others = [i.impression_id for i in story.impressions if i.qualifies and not i.attributed]
        more = f" ({len(others)} other(s) qualified: {', '.join(others)})" if others else ""
        lines.append(
            f"Attributed to impression {attributed.impression_id}, {attributed.gap_ms:,} ms before the click: the "
            f"latest of its ad and user at most 10 s before it{more}."
        )
    price = story.price
    if price is not None:
        if price.unbillable == Unbillable.UNKNOWN_AD.value:
            lines.append(f"Ad {price.ad_id} had no price at the click's time (unknown to the catalog then).")
        elif price.unbillable == Unbillable.AD_PAUSED.value:
            lines.append(
                f"Ad {price.ad_id} was paused from {_when(price.effective_from)} (catalog version {price.version}"
                f"{_by(price.change)})."
            )
        elif price.cpc_micros is not None:
            lines.append(
                f"Price in force at its time: {show(price.cpc_micros, price.currency or cur)} from "
                f"{_when(price.effective_from)} (catalog version {price.version}{_by(price.change)})."
            )
    invalid = story.invalid
    if invalid is not None:
        if invalid.bot_pattern:
            lines.append(
                f"Its user agent matches the crawler pattern {invalid.bot_pattern!r}"
                f"{f' (crawler list {invalid.crawler_list_version})' if invalid.crawler_list_version else ''}."
            )
        if invalid.excluded_range:
            since = f" from {_when(invalid.exclusion.effective_from)}" if invalid.exclusion else ""
            lines.append(
                f"Its address lies in {invalid.excluded_range}, excluded{since}{_by(invalid.exclusion_change)}."
            )
        if invalid.flood:
            span = invalid.flood[-1].event_time - invalid.flood[0].event_time
            lines.append(
                f"Its user made {len(invalid.flood)} clicks within {span:,} ms (more than "
                f"{invalid.rules.flood_clicks} within {invalid.rules.flood_window_ms:,} ms is a flood)."
            )
        if invalid.twin:
            twin_gap = (story.event_time or 0) - invalid.twin.event_time
            lines.append(
                f"Its user clicked the same ad {twin_gap:,} ms before (click {invalid.twin.click_id}): a repeat within "
                f"{invalid.rules.duplicate_window_ms:,} ms is charged once."
            )
    budget = story.budget
    if budget is not None:
        limit = "unlimited" if budget.budget_micros is None else show(budget.budget_micros, budget.currency)
        lines.append(
            f"Campaign {budget.campaign_id}'s daily budget on {budget.day}: {limit}"
            f"{f' (catalog version {budget.entry.version}{_by(budget.change)})' if budget.entry else ''}; "
            f"charged before this click that day: {show(budget.charged_before_micros, budget.currency)} "
            f"({budget.charged_before_clicks} click(s)); this click's price "
            f"{show(budget.price_micros, budget.currency)} {'fits' if budget.fits else 'does not fit'}."
        )
    lines.extend(story.notes)
    return lines


def _past_horizon_words(story: ClickStory) -> list[str]:
    """The plain answer where the story did not search (`PAST_HORIZON`): how far it searched, and what finds more."""
    searched = story.searched or Searched()
    days = searched.story_days
    if searched.day:
        exported = searched.exported_periods or 0
        if not exported:
            return [
                f"{searched.day} is past the {days}-day horizon of click-level detail (story_days), and the data "
                f"folder holds no export of that day: nothing here says what finance was given for click "
                f"{story.click_id}."
            ]
        return [
            f"{searched.day} is past the {days}-day horizon of click-level detail (story_days), and that day's exports "
            f"({exported} period(s) exported) do not name click {story.click_id}: an export names every click its "
            "period billed or did not charge for a reason, not a click the attribution rule does not bill (no "
            "impression of its ad and user at most 10 s before it) nor one never received."
        ]
    lines = [
        f"Click {story.click_id} is not among the clicks of the last {days} days (from {searched.since}, UTC): "
        f"click-level detail is searched for the last {days} days (story_days). If the click is older, its day "
        "(--day YYYY-MM-DD; ?day=YYYY-MM-DD on the page and the API) finds what that day's exports gave finance."
    ]
    corrected = sorted(
        {e.corrects_period for e in story.exports if e.corrects_period and e.record_type == "adjustment"}
    )
    if corrected:
        named = ", ".join(f"{p} (its day {p[:4]}-{p[4:6]}-{p[6:8]})" for p in corrected)
        lines.append(f"Later exports carry adjustments of it for period {named}.")
    if story.copies:
        lines.append(
            "Bad copies of it were received (quarantined, listed with the copies); a valid copy older than the horizon "
            "was not searched."
        )
    return lines


def _when_text(at_ms: int | None, time: Callable[[int], str] = format_utc) -> str:
    return "the beginning" if not at_ms else time(at_ms)


def _by_text(change: ChangeEntry | None, time: Callable[[int], str] = format_utc) -> str:
    if change is None or not change.recorded or not change.who:
        return ", author not recorded" if change is not None else ""
    made = f" at {time(change.made_at)}" if change.made_at else ""
    return f", made by {change.who} through the {change.door}{made}"


def story_text(story: ClickStory) -> str:
    """The whole story as text, for `adbill explain` (money with all six decimals, times in UTC)."""
    out = [
        f"click {story.click_id}"
        + "".join(
            f" · {name} {value}"
            for name, value in (
                ("advertiser", story.advertiser_id),
                ("campaign", story.campaign_id),
                ("ad", story.ad_id),
                ("user", story.user_id),
            )
            if value
        )
    ]
    if story.event_time is not None:
        out.append(f"clicked at {format_utc(story.event_time)} (period {story.outcome.period})")
    out += ["", "why:", *(f"  {line}" for line in describe(story))]
    if story.copies:
        out += ["", "copies received (first to arrive first):"]
        for c in story.copies:
            where = f"{c.topic}/{c.partition}@{c.offset}"
            extra = f"; differs in {', '.join(c.differs)}" if c.differs else ""
            extra += "; late" if c.late else ""
            extra += f"; released from quarantine by {c.released_by}" if c.released_by else ""
            extra += f"; ad {c.ad_id}" if c.ad_id and c.ad_id != story.ad_id else ""
            extra += "; an ad of another advertiser" if c.other_advertiser else ""
            out.append(
                f"  {c.status:<12} {where:<24} received {_utc(c.received_ms)}  event {_utc(c.event_time)}  "
                f"batch {c.batch_id}{extra}"
            )
            if c.user_agent or c.ip:
                out.append(f"  {'':<12} user agent {c.user_agent!r}, ip {c.ip}")
    if story.impressions:
        out += ["", "impressions of the ad and user near the click:"]
        for i in story.impressions:
            mark = "attributed" if i.attributed else "qualifies" if i.qualifies else "outside the window"
            gap = f"{abs(i.gap_ms):,} ms {'before' if i.gap_ms >= 0 else 'after'}"
            out.append(f"  {i.impression_id}  {_utc(i.event_time)}  {gap}  {mark}")
    cur = story.currency or ""
    if story.stream:
        out += ["", "the streaming job:"]
        for s in story.stream:
            amount = f" {format_micros(s.amount_micros, s.currency or cur)}" if s.amount_micros is not None else ""
            why = f" ({s.reason})" if s.reason else ""
            when = f" at {_utc(s.billed_at_ms)}" if s.billed_at_ms else ""
            out.append(f"  batch {s.batch_id}{when}: {s.action}{amount}{why}, period {s.period}")
    if story.corrections:
        out += ["", "corrections and adjustments:"]
        for entry in story.corrections:
            kind = "adjustment" if entry.adjustment else "correction"
            out.append(
                f"  {entry.correction_id}  {kind} {entry.kind} {format_micros(entry.amount_micros, entry.currency)} "
                f"({entry.reason}); corrects {entry.corrects_period}, booked in {entry.booked_period}, made "
                f"{_utc(entry.created_at_ms)}"
            )
    if story.exports:
        out += ["", "export rows:"]
        for e in story.exports:
            line = f"  exports/{e.period}/{e.file} row {e.row}"
            line += f" (billing.csv line {e.csv_line})" if e.csv_line else ""
            net = f", net {format_micros(e.net_micros, e.currency or cur)}" if e.net_micros is not None else ""
            out.append(f"{line}: {e.record_type} {e.status or ''}{net}{f' ({e.reason})' if e.reason else ''}")
    return "\n".join(out)


def _utc(at_ms: int | None) -> str:
    return "-" if at_ms is None else format_utc(at_ms)
