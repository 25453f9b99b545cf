"""Corrections: the entries reconciliation writes so that the provisional ledger plus corrections is the final bill.

In: for one billing period, the final billable clicks (the rule applied to every event received), the provisional
ledger rows the stream wrote, the corrections already written, and facts about late and conflicting events.
Out: only the new corrections still needed, with deterministic ids, so that a second run writes nothing.

Reconciliation works click by click. What a click *stands at* is a count per charge (ad, campaign, advertiser,
amount, currency): each ledger row and each addition counts +1, each retraction -1. The final bill wants one at the
final row's charge and zero everywhere else; every difference becomes a correction. Nothing here reads a clock,
Spark, Redis or Kafka: the caller passes `now_ms` and the rows.

Invariant (docs/billing-rules.md), checked by `check_reconciled`: ledger + corrections = final, per click and charge,
hence the same click ids net and the same micros.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, NamedTuple

from billing.money import Amounts
from billing.rule import BillableClick


class CorrectionKind(StrEnum):
    """Which way a correction moves a click: one more bill, or one bill less."""

    ADDITION = "addition"
    RETRACTION = "retraction"


class CorrectionReason(StrEnum):
    """Why reconciliation wrote a correction."""

    LATE_CLICK = "late_click"
    """Addition: the click arrived after the stream's watermark had passed it."""
    LATE_IMPRESSION = "late_impression"
    """Addition: the impression the click is attributed to arrived after the watermark had passed it."""
    MISSED_MATCH = "missed_match"
    """Addition: neither half was late, yet the stream did not bill the click (for instance the two halves
    arrived too far apart in processing time)."""
    BILLED_AFTER_CLOSE = "billed_after_close"
    """Addition booked in an open period: the stream billed the click after its period had closed, so the
    period's export lacks it."""
    DUPLICATE = "duplicate"
    """Retraction: the click stands more than once at the same charge; every extra copy is retracted."""
    ID_CONFLICT = "id_conflict"
    """Retraction (and, in a pair, addition): the stream billed a copy of a click or an impression that the
    complete data quarantines as a conflict (the first copy by arrival stands). When the final rule bills the
    click at another charge, the wrong bill is retracted and the right one added, both with this reason."""
    NOT_BILLABLE = "not_billable"
    """Retraction: anything else the complete data does not support."""
    KNOWN_BOT = "known_bot"
    """Addition or retraction: the invalid traffic rule (`billing.invalid`) the click's charge turned on. A
    retraction when the complete data finds the click invalid and the stream charged it; an addition when the
    stream did not charge it for this rule and the complete data does (rare: the stream judged a copy that is not
    the one that stands)."""
    EXCLUDED_IP = "excluded_ip"
    """As `known_bot`, for the IP exclusion list."""
    CLICK_FLOOD = "click_flood"
    """As `known_bot`, for a click flood: the stream charged a flood's first clicks before the rest arrived."""
    DUPLICATE_CLICK = "duplicate_click"
    """As `known_bot`, for a double click: the stream charged a click whose earlier twin arrived late."""
    OVER_BUDGET = "over_budget"
    """Addition or retraction: the campaign's daily budget, taken in event-time order over the complete data, charges
    the click where the stream did not, or not where the stream did (a click arrived late, earlier in the day)."""
    CATALOG_CHANGE = "catalog_change"
    """Addition or retraction: the catalog's history prices the click otherwise than the stream did, because the
    stream had not yet seen a change in force at the click's time (a new ad, a new price, a pause): the click the
    stream could not price is added, a bill at a price no longer in force at the click's time is retracted and
    the right one added."""


ADDITION_REASONS = frozenset(
    {
        CorrectionReason.LATE_CLICK,
        CorrectionReason.LATE_IMPRESSION,
        CorrectionReason.MISSED_MATCH,
        CorrectionReason.ID_CONFLICT,
        CorrectionReason.BILLED_AFTER_CLOSE,
        CorrectionReason.CATALOG_CHANGE,
        *(CorrectionReason(r) for r in ("known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")),
    }
)
"""Reasons an addition may carry."""

RETRACTION_REASONS = frozenset(
    {
        CorrectionReason.DUPLICATE,
        CorrectionReason.ID_CONFLICT,
        CorrectionReason.NOT_BILLABLE,
        CorrectionReason.CATALOG_CHANGE,
        *(CorrectionReason(r) for r in ("known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")),
    }
)
"""Reasons a retraction may carry."""

CHARGE_REASONS = frozenset(
    CorrectionReason(r) for r in ("known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")
)
"""The reasons of a charge decided by the invalid traffic rules or a budget ("invalid activity" when invalid)."""

_REASONS_OF = {CorrectionKind.ADDITION: ADDITION_REASONS, CorrectionKind.RETRACTION: RETRACTION_REASONS}


class Charge(NamedTuple):
    """What one bill of a click charges whom: the ad and its owners, the amount (micros, >= 0) and the currency."""

    ad_id: str
    campaign_id: str
    advertiser_id: str
    amount_micros: int
    currency: str

    def describe(self) -> str:
        return f"{self.amount_micros} {self.currency} on ad {self.ad_id} (advertiser {self.advertiser_id})"


@dataclass(frozen=True, slots=True)
class Correction:
    """One signed entry against a period's provisional ledger.

    `amount_micros` is signed: the click's price for an addition, minus it for a retraction (zero for a free ad,
    which is why `kind` is explicit). `corrects_period` is the period of the click; `booked_period` the period
    whose totals and export carry the entry (the same while the corrected period is open, the current open
    period once it is closed). `created_at_ms` is when reconciliation wrote it (epoch ms, UTC).
    """

    correction_id: str
    kind: CorrectionKind
    click_id: str
    impression_id: str | None
    ad_id: str
    campaign_id: str
    advertiser_id: str
    amount_micros: int
    currency: str
    reason: CorrectionReason
    corrects_period: str
    booked_period: str
    created_at_ms: int

    def __post_init__(self) -> None:
        # Rows read back from Parquet or JSON carry plain strings: store the enums.
        object.__setattr__(self, "kind", CorrectionKind(self.kind))
        object.__setattr__(self, "reason", CorrectionReason(self.reason))
        for name in ("amount_micros", "created_at_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"correction {self.correction_id}: {name} must be an integer, got {value!r}")
        if self.kind == CorrectionKind.ADDITION and self.amount_micros < 0:
            raise ValueError(f"correction {self.correction_id}: an addition has a positive amount")
        if self.kind == CorrectionKind.RETRACTION and self.amount_micros > 0:
            raise ValueError(f"correction {self.correction_id}: a retraction has a negative amount")
        if self.reason not in _REASONS_OF[self.kind]:
            raise ValueError(f"correction {self.correction_id}: {self.reason} is not a reason for an {self.kind}")

    @property
    def clicks(self) -> int:
        """The change in billed clicks: +1 for an addition, -1 for a retraction."""
        return 1 if self.kind == CorrectionKind.ADDITION else -1

    @property
    def charge(self) -> Charge:
        """The charge this correction adds or retracts (amount as a positive price)."""
        return Charge(self.ad_id, self.campaign_id, self.advertiser_id, abs(self.amount_micros), self.currency)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields in order, enums as their strings."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Correction:
        """From `to_dict()` or a row of the corrections table; other keys (such as partition columns) are ignored."""
        return cls(**{name: row[name] for name in CORRECTION_FIELDS})


CORRECTION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Correction))
"""The columns of a correction, in order."""

# --- Ids ---------------------------------------------------------------------------------------------------


def correction_id(kind: CorrectionKind | str, click_id: str, corrects_period: str, ordinal: int) -> str:
    """The deterministic id of the `ordinal`-th (from 0) correction of `kind` for `click_id` in `corrects_period`.

    The first 24 hex digits of the SHA-256 of the compact JSON array `[kind, click_id, corrects_period, ordinal]`
    (UTF-8, `separators=(",", ":")`, ASCII escapes), such as `["addition","c1","20260101T0000Z",0]`. JSON keeps
    the parts apart whatever characters an id holds. The same history gives the same ids, so a run that is
    repeated, or replayed after a crash, writes the same rows.
    """
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
        raise ValueError(f"an ordinal is a non-negative integer, got {ordinal!r}")
    text = json.dumps([str(CorrectionKind(kind)), click_id, corrects_period, ordinal], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


# --- Inputs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrivalFacts:
    """What the complete data says about how events arrived; it picks a correction's reason, never its amount.

    - `late_click_ids`, `late_impression_ids`: events the stream's watermark had passed when they arrived
      (`received_ms - event_time` above that stream's watermark delay, or captured by the stream as late);
    - `conflicting_click_ids`, `conflicting_impression_ids`: ids that had a later copy with other content (the
      stream may have billed either copy; the first by arrival stands).
    - `billed_after_close_click_ids`: clicks of a closed period that the stream billed after the period's export
      was written;
    - `unpriced_click_ids`: matched clicks that the stream could not price, or that the catalog's history prices
      at nothing now (their ad paused or unknown at their time);
    - `not_charged_reasons`: priced clicks the complete data does not charge, with the rule (an invalid traffic
      rule's name, `over_budget`);
    - `stream_not_charged`: priced clicks the stream did not charge, with its reason.
    Click and impression ids are kept apart: they come from different generators and may collide.
    """

    late_click_ids: Collection[str] = frozenset()
    late_impression_ids: Collection[str] = frozenset()
    conflicting_click_ids: Collection[str] = frozenset()
    conflicting_impression_ids: Collection[str] = frozenset()
    billed_after_close_click_ids: Collection[str] = frozenset()
    unpriced_click_ids: Collection[str] = frozenset()
    not_charged_reasons: Mapping[str, str] = field(default_factory=dict)
    stream_not_charged: Mapping[str, str] = field(default_factory=dict)


BillRow = BillableClick | Mapping[str, Any]
"""A bill: a `BillableClick` or a mapping with its fields (a final row, or a ledger row with extra columns)."""


class _Bill(NamedTuple):
    click_id: str
    impression_id: str | None
    charge: Charge


def _bill(row: BillRow) -> _Bill:
    get = row.__getitem__ if isinstance(row, Mapping) else lambda name: getattr(row, name)
    amount = get("amount_micros")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise ValueError(f"click {get('click_id')}: amount_micros must be a non-negative integer, got {amount!r}")
    charge = Charge(get("ad_id"), get("campaign_id"), get("advertiser_id"), amount, get("currency"))
    return _Bill(get("click_id"), get("impression_id"), charge)


def _final_by_click(final: Iterable[BillRow]) -> dict[str, _Bill]:
    by_click: dict[str, _Bill] = {}
    for row in final:
        bill = _bill(row)
        if by_click.setdefault(bill.click_id, bill) is not bill:
            raise ValueError(f"the final bill holds click {bill.click_id} twice: the rule bills a click once")
    return by_click


def _distinct_corrections(corrections: Iterable[Correction]) -> tuple[list[Correction], list[str]]:
    """Corrections by id (an identical copy counts once) and the problems found (same id, other content)."""
    by_id: dict[str, Correction] = {}
    problems: list[str] = []
    for correction in corrections:
        earlier = by_id.setdefault(correction.correction_id, correction)
        if earlier != correction:
            problems.append(f"correction id {correction.correction_id} is used by two different corrections")
    return list(by_id.values()), problems


_Entry = tuple[int, Charge, str | None]
"""One thing that makes a click stand: (+1 for a ledger row or an addition, -1 for a retraction; charge; impression)."""


def _entries_of(ledger: Iterable[BillRow], corrections: Iterable[Correction]) -> dict[str, list[_Entry]]:
    entries: dict[str, list[_Entry]] = {}
    for row in ledger:
        bill = _bill(row)
        entries.setdefault(bill.click_id, []).append((1, bill.charge, bill.impression_id))
    for correction in corrections:
        entries.setdefault(correction.click_id, []).append(
            (correction.clicks, correction.charge, correction.impression_id)
        )
    return entries


def _settled(entries: list[_Entry], target: _Bill | None) -> bool:
    """The common case, decided cheaply: one ledger row at the final charge and nothing else."""
    return target is not None and len(entries) == 1 and entries[0][0] == 1 and entries[0][1] == target.charge


class _Standing:
    """How many times one click stands at each charge, and the impressions those bills carry."""

    __slots__ = ("count", "impressions")

    def __init__(self, entries: Iterable[_Entry]) -> None:
        self.count: Counter[Charge] = Counter()
        self.impressions: defaultdict[Charge, list[str]] = defaultdict(list)
        for sign, charge, impression_id in entries:
            self.count[charge] += sign
            held = self.impressions[charge]
            if sign > 0 and impression_id is not None:
                held.append(impression_id)
            elif sign < 0 and held:
                held.remove(impression_id if impression_id in held else held[-1])


# --- Reconciliation ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Step:
    kind: CorrectionKind
    reason: CorrectionReason
    charge: Charge
    impression_id: str | None


def reconcile_period(
    period: str,
    final: Iterable[BillRow],
    ledger: Iterable[BillRow],
    corrections: Iterable[Correction],
    *,
    booked_period: str,
    now_ms: int,
    facts: ArrivalFacts | None = None,
    reserved_ids: Collection[str] = (),
) -> list[Correction]:
    """The new corrections of `period` that make ledger + corrections equal the final bill; [] when it already does.

    - `final`: the billable clicks of the period, the rule applied to every event received (one row per click);
    - `ledger`: the stream's provisional rows of the period (a click may appear more than once); for a closed
      period, what finance was given instead: the click rows its export bills;
    - `corrections`: every correction already written for the period, whatever period it was booked in (an
      identical copy counts once; a correction of another period is a ValueError);
    - `booked_period`: where new corrections are booked (`booking_period`); `now_ms`: their `created_at_ms`;
    - `facts`: late and conflicting event ids, which pick the reasons;
    - `reserved_ids`: correction ids already used for the period that `corrections` leaves out (a closed
      period's corrections from before its close, which its export already holds).

    Per click and charge, the difference between what stands and what the final bill wants becomes additions or
    retractions (retractions first, then additions; by click id). Reasons:

    - a retraction at the final charge (an extra copy) is `duplicate`; at another charge, every copy but one is
      `duplicate` and the last is `catalog_change` when the final bills the click on the same ad at another
      price (a price change the stream had not seen) and no copy conflicts, `id_conflict` when the final bills
      the click at another charge or the click or the bill's impression had a conflicting copy, `catalog_change`
      when the catalog prices the matched click at nothing (`unpriced_click_ids`), else `not_billable`;
    - an addition is `catalog_change` when it replaces a bill at another price of the same ad, `id_conflict` when
      the click stood at another charge (the pair of a replaced bill), else `billed_after_close` when the stream
      billed it after its period closed, else the rule's name when the stream did not charge the click for an
      invalid traffic rule or the budget, or an earlier correction took it back for one (an early `over_budget`
      retraction that the complete data no longer supports), else `catalog_change` when the stream could not price it
      (`unpriced_click_ids`), else `late_click` when the click arrived late, else `late_impression` when its final
      impression did, else `missed_match`.

    The work is independent per click id: the caller may pass only the click ids that can differ, as long as it
    passes every final row, ledger row and correction of each id it passes.
    """
    late_clicks = facts.late_click_ids if facts else frozenset()
    late_impressions = facts.late_impression_ids if facts else frozenset()
    conflicting_clicks = facts.conflicting_click_ids if facts else frozenset()
    conflicting_impressions = facts.conflicting_impression_ids if facts else frozenset()

    existing, problems = _distinct_corrections(corrections)
    if problems:
        raise ValueError("; ".join(problems))
    for correction in existing:
        if correction.corrects_period != period:
            raise ValueError(
                f"correction {correction.correction_id} corrects {correction.corrects_period}, not {period}"
            )
    wanted = _final_by_click(final)
    entries = _entries_of(ledger, existing)
    ordinals = Counter((c.click_id, c.kind) for c in existing)
    taken = {c.correction_id for c in existing} | set(reserved_ids)
    after_close = facts.billed_after_close_click_ids if facts else frozenset()
    unpriced = facts.unpriced_click_ids if facts else frozenset()
    refused: Mapping[str, str] = facts.not_charged_reasons if facts else {}
    stream_refused: Mapping[str, str] = facts.stream_not_charged if facts else {}
    # The rule an earlier correction took a click back for (an early `over_budget` retraction in an open period):
    # when the complete data charges the click after all, the addition that books it back says the same rule.
    taken_back = {
        c.click_id: str(c.reason)
        for c in sorted(existing, key=lambda c: c.created_at_ms)
        if c.kind == CorrectionKind.RETRACTION and c.reason in CHARGE_REASONS
    }

    new: list[Correction] = []
    for click_id in sorted(wanted.keys() | entries.keys()):
        target = wanted.get(click_id)
        of_click = entries.get(click_id, [])
        if _settled(of_click, target):
            continue
        steps = _steps_for_click(
            target,
            _Standing(of_click),
            billed_after_close=click_id in after_close,
            late_click=click_id in late_clicks,
            late_impression=target is not None and target.impression_id in late_impressions,
            conflicting_click=click_id in conflicting_clicks,
            conflicting_impressions=conflicting_impressions,
            unpriced=click_id in unpriced,
            final_reason=refused.get(click_id),
            stream_reason=stream_refused.get(click_id) or taken_back.get(click_id),
        )
        for step in steps:
            ordinal = ordinals[(click_id, step.kind)]
            identity = correction_id(step.kind, click_id, period, ordinal)
            while identity in taken:  # only when earlier ids were not made by this scheme in this order
                ordinal += 1
                identity = correction_id(step.kind, click_id, period, ordinal)
            ordinals[(click_id, step.kind)] = ordinal + 1
            taken.add(identity)
            sign = 1 if step.kind == CorrectionKind.ADDITION else -1
            new.append(
                Correction(
                    correction_id=identity,
                    kind=step.kind,
                    click_id=click_id,
                    impression_id=step.impression_id,
                    ad_id=step.charge.ad_id,
                    campaign_id=step.charge.campaign_id,
                    advertiser_id=step.charge.advertiser_id,
                    amount_micros=sign * step.charge.amount_micros,
                    currency=step.charge.currency,
                    reason=step.reason,
                    corrects_period=period,
                    booked_period=booked_period,
                    created_at_ms=now_ms,
                )
            )
    return new


def _steps_for_click(
    target: _Bill | None,
    stands: _Standing,
    *,
    billed_after_close: bool = False,
    late_click: bool,
    late_impression: bool,
    conflicting_click: bool,
    conflicting_impressions: Collection[str],
    unpriced: bool = False,
    final_reason: str | None = None,
    stream_reason: str | None = None,
) -> list[_Step]:
    final_charge = target.charge if target is not None else None
    charges = sorted(stands.count.keys() | ({final_charge} if final_charge is not None else set()))
    elsewhere = [charge for charge, n in stands.count.items() if n > 0 and charge != final_charge]
    stands_elsewhere = bool(elsewhere)
    # The stream billed the click on the same ad at another price: a price change it had not seen yet.
    repriced = (
        final_charge is not None
        and not conflicting_click
        and stands_elsewhere
        and all(c.ad_id == final_charge.ad_id and c.currency == final_charge.currency for c in elsewhere)
    )
    retractions: list[_Step] = []
    additions: list[_Step] = []
    for charge in charges:
        want = 1 if charge == final_charge else 0
        have = stands.count.get(charge, 0)
        if have > want:
            # Retract the bills whose impression differs from the final one first: what stays matches it best.
            keep = target.impression_id if target is not None and charge == final_charge else None
            held = sorted(stands.impressions.get(charge, []), key=lambda imp: (imp == keep, imp))
            for n in range(have - want):
                impression_id = held[n] if n < len(held) else None
                conflicting = conflicting_click or any(
                    imp in conflicting_impressions for imp in stands.impressions.get(charge, [])
                )
                reason = _first_that_holds(
                    (want == 1 or n < have - 1, CorrectionReason.DUPLICATE),
                    (repriced and not conflicting, CorrectionReason.CATALOG_CHANGE),
                    (target is None and not conflicting and final_reason in CHARGE_REASONS, final_reason),
                    (target is not None or conflicting, CorrectionReason.ID_CONFLICT),
                    (unpriced, CorrectionReason.CATALOG_CHANGE),
                    otherwise=CorrectionReason.NOT_BILLABLE,
                )
                retractions.append(_Step(CorrectionKind.RETRACTION, reason, charge, impression_id))
        elif have < want and target is not None and charge == final_charge:
            reason = _first_that_holds(
                (repriced, CorrectionReason.CATALOG_CHANGE),
                (stands_elsewhere, CorrectionReason.ID_CONFLICT),
                (billed_after_close, CorrectionReason.BILLED_AFTER_CLOSE),
                (stream_reason in CHARGE_REASONS, stream_reason),
                (unpriced, CorrectionReason.CATALOG_CHANGE),
                (late_click, CorrectionReason.LATE_CLICK),
                (late_impression, CorrectionReason.LATE_IMPRESSION),
                otherwise=CorrectionReason.MISSED_MATCH,
            )
            additions.extend(
                _Step(CorrectionKind.ADDITION, reason, charge, target.impression_id) for _ in range(want - have)
            )
        elif have < want:
            # Below zero at a charge the final bill does not use: only if ledger rows that corrections retracted
            # disappeared (the ledger is append-only, so a partial read). Restore zero; the next run squares it.
            additions.extend(
                _Step(CorrectionKind.ADDITION, CorrectionReason.MISSED_MATCH, charge, None) for _ in range(want - have)
            )
    return retractions + additions


def _first_that_holds(*cases: tuple[bool, str | None], otherwise: CorrectionReason) -> CorrectionReason:
    """The reason of the first case whose condition holds, read top to bottom; `otherwise` when none does."""
    for holds, reason in cases:
        if holds:
            if reason is None:
                raise ValueError("a case that holds names no reason")
            return CorrectionReason(reason)
    return otherwise


def over_budget_room(
    period: str,
    over_budget: Collection[str],
    ledger: Iterable[BillRow],
    corrections: Iterable[Correction],
    *,
    now_ms: int,
) -> list[Correction]:
    """The `over_budget` retractions, in the open `period`, of the bills that still stand there of the clicks
    `over_budget` names: those the complete data received so far finds over their campaign's daily budget. A run
    that raises a campaign's day (a late click earlier in the day) books them with the raise, so that the day's
    closed exports and live totals together never charge more than the budget while `period` is still open.

    Booked in `period` itself, with the ids `reconcile_period` would give them: when `period` is reconciled and
    closed, ledger + corrections already stand where the rule wants them, and nothing is retracted twice; a click
    the complete data charges after all by then is added back, with the reason `over_budget`. `ledger` and
    `corrections` are the period's rows and corrections (others, and other clicks', are left out here)."""
    wanted = frozenset(over_budget)
    rows = [row for row in ledger if _bill(row).click_id in wanted]
    earlier = [c for c in corrections if c.corrects_period == period and c.click_id in wanted]
    facts = ArrivalFacts(not_charged_reasons=dict.fromkeys(wanted, CorrectionReason.OVER_BUDGET.value))
    new = reconcile_period(period, [], rows, earlier, booked_period=period, now_ms=now_ms, facts=facts)
    # Only what takes a bill back: an open period's additions wait for its own reconciliation.
    return [c for c in new if c.kind == CorrectionKind.RETRACTION]


def standing_bills(ledger: Iterable[BillRow], corrections: Iterable[Correction]) -> list[tuple[str, Charge]]:
    """The bills that stand once `corrections` are counted on `ledger` (a period's ledger rows, or what its export
    bills): (click id, charge), a click as many times as it stands at that charge (none below zero), by click id."""
    distinct, _ = _distinct_corrections(corrections)
    out: list[tuple[str, Charge]] = []
    for click_id, entries in sorted(_entries_of(ledger, distinct).items()):
        for charge, times in sorted(_Standing(entries).count.items()):
            out += [(click_id, charge)] * max(times, 0)
    return out


def booking_period(corrects_period: str, open_period: str, closed_periods: Collection[str]) -> str:
    """Where a correction of `corrects_period` is booked: there while it is open, else in the current `open_period`."""
    if open_period in closed_periods:
        raise ValueError(f"{open_period} is closed: corrections are booked in an open period")
    return open_period if corrects_period in closed_periods else corrects_period


def pending_adjustments(corrections: Iterable[Correction], closed: set[str]) -> list[Correction]:
    """The adjustments for the `closed` periods booked in a period not closed yet: in its correction files only, so
    far; finance gets them in that period's export when it closes."""
    return [c for c in corrections if c.corrects_period in closed and c.booked_period not in closed]


# --- The invariant -----------------------------------------------------------------------------------------


def check_reconciled(
    final: Iterable[BillRow],
    ledger: Iterable[BillRow],
    corrections: Iterable[Correction],
) -> list[str]:
    """What breaks `ledger + corrections = final` for one period; [] when it holds.

    Checked per click and charge (so the click ids net, the clicks and micros per advertiser, campaign and ad,
    and the totals per currency all agree), plus: one final row per click, one correction per id, one corrected
    period.
    """
    problems: list[str] = []
    wanted: dict[str, _Bill] = {}
    for row in final:
        bill = _bill(row)
        if wanted.setdefault(bill.click_id, bill) is not bill:
            problems.append(f"click {bill.click_id}: the final bill holds it more than once")
    listed = list(corrections)
    distinct, conflicts = _distinct_corrections(listed)
    problems.extend(conflicts)
    copies = Counter(c.correction_id for c in listed)
    problems.extend(f"correction {cid} is stored {n} times" for cid, n in sorted(copies.items()) if n > 1)
    periods = sorted({c.corrects_period for c in distinct})
    if len(periods) > 1:
        problems.append(f"corrections of several periods checked together: {', '.join(periods)}")

    entries = _entries_of(ledger, distinct)
    for click_id in sorted(wanted.keys() | entries.keys()):
        target = wanted.get(click_id)
        of_click = entries.get(click_id, [])
        if _settled(of_click, target):
            continue
        counts = _Standing(of_click).count
        for charge in sorted(counts.keys() | ({target.charge} if target is not None else set())):
            want = 1 if target is not None and charge == target.charge else 0
            have = counts.get(charge, 0)
            if have != want:
                problems.append(f"click {click_id}: stands {have} time(s) at {charge.describe()}, final wants {want}")

    net_micros = Amounts.of(
        (charge.currency, sign * charge.amount_micros) for of_click in entries.values() for sign, charge, _ in of_click
    )
    final_micros = Amounts.of((bill.charge.currency, bill.charge.amount_micros) for bill in wanted.values())
    for currency in sorted(net_micros.keys() | final_micros.keys()):
        if net_micros.get(currency, 0) != final_micros.get(currency, 0):
            problems.append(
                f"total {currency}: ledger + corrections = {net_micros.get(currency, 0)} micros, final = "
                f"{final_micros.get(currency, 0)}"
            )
    return problems


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, StrEnum) else value
