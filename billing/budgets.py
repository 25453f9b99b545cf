"""Daily budgets: the rule of docs/billing-rules.md ("Budgets"), in plain Python.

A campaign may have a daily budget, a history like an ad's prices (`BudgetChange`: from `effective_from` on,
`daily_budget_micros`, or unlimited), kept with the catalog (`billing.catalog.Catalog.budget_at`). Within one
campaign and UTC day, the clicks that would be charged (billable, priced, valid) are taken in order of `event_time`,
then `click_id`; a click is charged when the day's charged total so far plus its price is at most the budget in
force at its `event_time`, and is `over_budget` otherwise (not charged, kept, counted). A later, cheaper click that
still fits is charged; lowering a budget takes nothing back, raising it lets later clicks be charged.

`charge_in_order` is that rule over complete data (reconciliation, the ground truth); the streaming job's sink
applies `BudgetLedger.decide` to the clicks in the order it reads them, against the day's total so far.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from billing.periods import DAY_MS

OVER_BUDGET = "over_budget"
"""The reason of a click not charged because it did not fit its campaign's daily budget."""


class BudgetError(ValueError):
    """A budget change that is refused; one line, for a person."""


@dataclass(frozen=True, slots=True)
class BudgetChange:
    """From `effective_from` on, a campaign may be charged `daily_budget_micros` a UTC day (None: unlimited)."""

    effective_from: int
    daily_budget_micros: int | None
    version: int = 0
    made_by: str | None = None
    """Who made the change (an account of the web UI, or the operating system's user of a command); None for an
    entry recorded before changes said so."""
    door: str | None = None
    """Through which door: `command`, `page` or `api` (an API token; `api TOKEN_ID`), `replay` for recorded history."""
    made_at: int | None = None
    """When the change was made (epoch ms, read under the catalog's lock), not when it takes effect."""

    def __post_init__(self) -> None:
        if isinstance(self.effective_from, bool) or not isinstance(self.effective_from, int) or self.effective_from < 0:
            raise BudgetError(f"effective_from is a non-negative number of epoch ms, got {self.effective_from!r}")
        check_budget(self.daily_budget_micros)

    @property
    def unlimited(self) -> bool:
        return self.daily_budget_micros is None

    def to_dict(self) -> dict[str, Any]:
        return change_record(self)


MADE_FIELDS = ("made_by", "door", "made_at")
"""A change's who, door and when: None for an entry recorded before changes said so."""


def change_record(change: Any) -> dict[str, Any]:
    """A change entry (a dataclass: `BudgetChange`, `billing.invalid.ExclusionChange`) as its record keeps it, field
    by field in order, with who made it, through which door and when only where it has them."""
    values = ((f.name, getattr(change, f.name)) for f in fields(change))
    return {name: value for name, value in values if value is not None or name not in MADE_FIELDS}


def check_budget(micros: object) -> None:
    """BudgetError unless `micros` is None (unlimited) or a whole number of micros from 0 to 2^63 - 1."""
    if micros is None:
        return
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise BudgetError(f"a daily budget is a whole number of micros, got {micros!r}")
    if micros < 0:
        raise BudgetError(f"a daily budget must not be negative, got {micros}")
    if micros > 2**63 - 1:
        raise BudgetError(f"a daily budget must fit in 63 bits, got {micros}")


def utc_day(at_ms: int) -> str:
    """The UTC day of `at_ms`, such as `2026-11-25`."""
    return datetime.fromtimestamp((at_ms // DAY_MS) * DAY_MS / 1000, UTC).strftime("%Y-%m-%d")


def day_start(at_ms: int) -> int:
    """Midnight UTC of the day of `at_ms`, epoch ms."""
    return (at_ms // DAY_MS) * DAY_MS


def parse_day(day: str) -> int:
    """Midnight UTC of `YYYY-MM-DD`, epoch ms; ValueError otherwise."""
    parsed = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A click that would be charged (billable, priced, valid), as the budget rule reads it."""

    click_id: str
    campaign_id: str
    click_time: int
    amount_micros: int


BudgetOf = Callable[[str, int], "int | None"]
"""(campaign, time) -> the daily budget in force then, None for unlimited."""


class BudgetLedger:
    """Each campaign's charged total per UTC day, and the decision for one more click against it."""

    def __init__(self, spent: Mapping[tuple[str, str], int] | None = None) -> None:
        self.spent: dict[tuple[str, str], int] = dict(spent or {})

    def decide(self, candidate: Candidate, budget_of: BudgetOf) -> bool:
        """Whether `candidate` is charged (its price fits the day's budget in force at its time); a charged click
        adds its price to the day's total."""
        key = (candidate.campaign_id, utc_day(candidate.click_time))
        so_far = self.spent.get(key, 0)
        budget = budget_of(candidate.campaign_id, candidate.click_time)
        if budget is not None and so_far + candidate.amount_micros > budget:
            return False
        self.spent[key] = so_far + candidate.amount_micros
        return True


def charge_in_order(
    candidates: Iterable[Candidate],
    budget_of: BudgetOf,
    spent: Mapping[tuple[str, str], int] | None = None,
) -> tuple[set[str], BudgetLedger]:
    """The rule over complete data: the click ids charged, taking each campaign's day in order of event time, then
    click id, from the totals `spent` (campaign, day) -> micros already charged (none: from zero); and the totals
    after."""
    ledger = BudgetLedger(spent)
    charged: set[str] = set()
    for candidate in sorted(candidates, key=lambda c: (c.click_time, c.click_id)):
        if ledger.decide(candidate, budget_of):
            charged.add(candidate.click_id)
    return charged, ledger


@dataclass(frozen=True, slots=True)
class StandingBill:
    """A bill that stands on a campaign's day as the books have it; `movable` when a correction may still take it
    back (its period is open), not when a closed export or the period being closed holds it."""

    click_id: str
    campaign_id: str
    click_time: int
    amount_micros: int
    movable: bool


def over_budget_standing(bills: Iterable[StandingBill], budget_of: BudgetOf) -> set[str]:
    """The click ids of the movable bills that the day's budget no longer lets stand: each campaign's day taken in
    order of event time, then click id, a movable bill stays when the total so far plus its price fits the budget in
    force at its time (`BudgetLedger.decide`), a bill that cannot move counts whatever. The later ones are the ones
    over: what a run takes back so that the day's closed exports and live totals together stay within the budget."""
    ledger = BudgetLedger()
    over: set[str] = set()
    for bill in sorted(bills, key=lambda b: (b.click_time, b.click_id)):
        candidate = Candidate(bill.click_id, bill.campaign_id, bill.click_time, bill.amount_micros)
        if not bill.movable:
            key = (bill.campaign_id, utc_day(bill.click_time))
            ledger.spent[key] = ledger.spent.get(key, 0) + bill.amount_micros
        elif not ledger.decide(candidate, budget_of):
            over.add(bill.click_id)
    return over


class DaysMovedError(RuntimeError):
    """A campaign's day total that corrections were to be applied against moved before they were applied (the
    stream charged it meanwhile); nothing of those days was applied."""

    def __init__(self, days: Iterable[tuple[str, str]]) -> None:
        self.days = sorted(set(days))
        listed = ", ".join(f"{campaign} on {day}" for campaign, day in self.days)
        super().__init__(f"the day total of {listed} moved before the corrections were applied")
