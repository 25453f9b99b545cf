"""Monthly invoices (docs/billing-rules.md, "Invoices"): when a UTC month may be invoiced, what an invoice holds, and
issuing.

**When.** A month is invoiced once every period of it is closed: its last period's lateness horizon has passed and
every period of it that holds data is closed (`PeriodClosing.month_ready`). Months are invoiced in order: a month
waits for the one before it (`PeriodClosing.months_to_issue`), so the numbers follow the months.

**What.** One invoice per advertiser with activity in the month (a row in the exports it covers). The exports it
covers are the closed periods of the month, and a period of an earlier, already invoiced month that was closed after
that month's invoices (late data for an hour that had none): each export is invoiced once, never again. Its lines,
each exact to the micro:

- `charges`: per campaign, the clicks the stream billed live and that stand (the export's click rows, less the
  corrections reconciliation made before the period closed);
- `correction`: per campaign and reason, what reconciliation corrected before the periods closed (late clicks
  added, duplicates retracted, ...), with the periods it corrects;
- `adjustment`: per campaign, reason and corrected period, the adjustments booked in the month's periods for
  periods closed earlier (an adjustment that reaches an invoiced month is booked later, so it is on a later invoice).

The invalid traffic reasons are "invalid activity". The net is the exact sum of the lines; the amount is the net
rounded once, half away from zero, to the currency's minor unit (`billing.money.round_half_away`); the tax is that
amount times the rate of the advertiser's billing profile in force at the month's end, rounded the same way; the
total is their sum. An invoice never changes once issued.

**Numbers.** A gap-free sequence over all invoices, under a lock that holds across hosts (`InvoiceBook`, kept in
the database by `billing.store.invoice_db`): a month's plan (the exports it covers and the advertisers) is written
before its first invoice, each invoice takes the next number, and all of it is kept together or not at all when the
lock is let go; a month an earlier release's issuer stopped half-way is completed from its plan, with the next
numbers.

Pure: the exports' figures come through `InvoiceSource`, the files through `InvoiceBook`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from fractions import Fraction
from typing import Any, Protocol

from billing.invalid import INVALID_REASONS
from billing.money import minor_digits, round_half_away, rounding_rule
from billing.periods import Periods, format_utc
from billing.profiles import BillingProfile, BillingProfiles, tax_fraction
from billing.reconcile_plan import PeriodState

_MONTH = re.compile(r"(\d{4})-(\d{2})", re.ASCII)

INVALID_ACTIVITY = "invalid activity"
"""What an invoice calls a correction or adjustment for an invalid traffic rule (as Google Ads' invoices do)."""

REASON_WORDS = {
    "late_click": "late click",
    "late_impression": "late impression",
    "missed_match": "missed match",
    "billed_after_close": "billed after its period closed",
    "duplicate": "duplicate",
    "id_conflict": "id conflict",
    "not_billable": "not billable",
    "catalog_change": "catalog change",
    "over_budget": "over budget",
    **{reason: INVALID_ACTIVITY for reason in INVALID_REASONS},
}
"""Each correction reason in an invoice's words."""

CHARGES, CORRECTION, ADJUSTMENT = "charges", "correction", "adjustment"
LINE_KINDS = (CHARGES, CORRECTION, ADJUSTMENT)


class InvoiceError(ValueError):
    """A month that cannot be invoiced (not ready, not a month), or rows an invoice cannot carry."""


# --- Months -------------------------------------------------------------------------------------------------


def parse_month(text: str) -> str:
    """`2026-01` as itself; InvoiceError on anything else."""
    match = _MONTH.fullmatch(text) if isinstance(text, str) else None
    if match is None or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1970:
        raise InvoiceError(f"a month is written such as 2026-01; got {text!r}")
    return text


def month_bounds(month: str) -> tuple[int, int]:
    """[start, end) of the UTC month, epoch ms."""
    parse_month(month)
    first = date(int(month[:4]), int(month[5:7]), 1)
    following = (first + timedelta(days=32)).replace(day=1)
    return _ms(first), _ms(following)


def month_of(period: str) -> str:
    """The month of a period key: `20260131T2300Z` -> `2026-01`."""
    return f"{period[0:4]}-{period[4:6]}"


def month_of_ms(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class PeriodClosing:
    """Which periods are closed, as invoicing reads it: the period grid, the lateness horizon, each period's data
    version (a period with data has one) and reconciliation's state of it (a closed period's says when it closed)."""

    periods: Periods
    horizon_ms: int
    versions: Mapping[str, int]
    states: Mapping[str, PeriodState]

    def month_ready(self, month: str, now_ms: int) -> str | None:
        """None when every period of the month is closed (its last period's horizon passed, and each period that
        holds data closed); otherwise why not, in words."""
        start, end = month_bounds(month)
        last_close = end + self.horizon_ms
        if now_ms < last_close:
            return f"its last period closes after {format_utc(last_close)} (the month's end and the lateness horizon)"
        states = self.states
        keys = {p for p in (*self.versions, *states) if start <= self.periods.parse_key(p) < end}
        still_open = sorted(p for p in keys if not (p in states and states[p].closed))
        if still_open:
            listed = ", ".join(still_open[:3]) + (", ..." if len(still_open) > 3 else "")
            return f"{len(still_open)} period(s) not closed yet: {listed}"
        return None

    def months_to_issue(self, issued: Iterable[str], now_ms: int) -> tuple[list[str], dict[str, str]]:
        """The months to invoice now, oldest first, and the first month that must wait, with why: every month with
        data that is not invoiced yet, in order, up to the first one that is not ready (a month waits for the one
        before)."""
        done = set(issued)
        months = sorted({month_of(p) for p in (*self.versions, *self.states)} - done)
        ready: list[str] = []
        for month in months:
            reason = self.month_ready(month, now_ms)
            if reason is not None:
                return ready, {month: reason}
            ready.append(month)
        return ready, {}


# --- Lines and totals ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InvoiceLine:
    """One line: `kind` is `charges`, `correction` or `adjustment`; `corrects` the periods it corrects (the late
    period of a `charges` line for a period closed after its month was invoiced; none otherwise)."""

    kind: str
    campaign_id: str
    description: str
    clicks: int
    amount_micros: int
    reason: str | None = None
    corrects: tuple[str, ...] = ()
    campaign_name: str = ""
    """The campaign's name when the invoice was issued (`billing.store.names_db`), empty for none."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "campaign_id": self.campaign_id,
            "campaign_name": self.campaign_name,
            "description": self.description,
            "reason": self.reason,
            "corrects": list(self.corrects),
            "clicks": self.clicks,
            "amount_micros": str(self.amount_micros),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InvoiceLine:
        return cls(
            kind=str(data["kind"]),
            campaign_id=str(data["campaign_id"]),
            description=str(data["description"]),
            clicks=int(data["clicks"]),
            amount_micros=int(data["amount_micros"]),
            reason=data.get("reason"),
            corrects=tuple(data.get("corrects") or ()),
            campaign_name=str(data.get("campaign_name") or ""),
        )

    @property
    def corrects_text(self) -> str:
        """The periods it corrects, for people: one period, or the first and last and how many."""
        if not self.corrects:
            return ""
        if len(self.corrects) == 1:
            return self.corrects[0]
        return f"{self.corrects[0]} .. {self.corrects[-1]} ({len(self.corrects)} periods)"


@dataclass(frozen=True, slots=True)
class ExportFigures:
    """An advertiser's export rows of one kind summed (`InvoiceSource.figures`): `rows` of `record_type` with
    `status` and `reason` for `corrects_period` in one campaign, and their `net_micros`."""

    advertiser_id: str
    campaign_id: str
    currency: str
    record_type: str
    status: str
    reason: str | None
    corrects_period: str
    booked_period: str
    rows: int
    net_micros: int


@dataclass(frozen=True, slots=True)
class CorrectionFigures:
    """Corrections reconciliation made for a period before it closed (booked in the period they correct), summed per
    advertiser, campaign, reason and kind (`InvoiceSource.corrections`)."""

    advertiser_id: str
    campaign_id: str
    reason: str
    kind: str
    corrects_period: str
    count: int
    amount_micros: int


def reason_words(reason: str | None) -> str:
    return REASON_WORDS.get(reason or "", (reason or "").replace("_", " "))


def invoice_lines(
    month: str, rows: Iterable[ExportFigures], corrections: Iterable[CorrectionFigures]
) -> list[InvoiceLine]:
    """The lines of one advertiser's invoice for `month` from its exports' rows and the corrections made before
    their periods closed; the lines add up to the rows' net exactly."""
    charges: dict[tuple[str, str | None], list[int]] = {}
    fixes: dict[tuple[str, str], tuple[list[int], set[str]]] = {}
    adjustments: dict[tuple[str, str, str], list[int]] = {}
    for r in rows:
        if r.record_type == "click":
            late = r.corrects_period if month_of(r.corrects_period) != month else None
            entry = charges.setdefault((r.campaign_id, late), [0, 0])
            entry[0] += r.rows if r.status != "retracted" else 0
            entry[1] += r.net_micros
        elif r.record_type == "adjustment":
            entry = adjustments.setdefault((r.campaign_id, r.reason or "", r.corrects_period), [0, 0])
            entry[0] += r.rows if r.status == "added" else -r.rows
            entry[1] += r.net_micros
        else:
            raise InvoiceError(f"an export row of type {r.record_type!r} cannot be invoiced")
    for c in corrections:
        late = c.corrects_period if month_of(c.corrects_period) != month else None
        clicks = c.count if c.kind == "addition" else -c.count
        base = charges.setdefault((c.campaign_id, late), [0, 0])
        base[0] -= clicks
        base[1] -= c.amount_micros
        figures, corrected = fixes.setdefault((c.campaign_id, c.reason), ([0, 0], set()))
        figures[0] += clicks
        figures[1] += c.amount_micros
        corrected.add(c.corrects_period)
    lines = []
    for (campaign, late), (clicks, micros) in sorted(charges.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if clicks or micros:
            text = "Clicks billed" if late is None else f"Clicks billed, period {late} (closed after its month)"
            lines.append(InvoiceLine(CHARGES, campaign, text, clicks, micros, None, (late,) if late else ()))
    for (campaign, reason), ((clicks, micros), corrected) in sorted(fixes.items()):
        if clicks or micros:
            text = f"Correction before close: {reason_words(reason)}"
            lines.append(InvoiceLine(CORRECTION, campaign, text, clicks, micros, reason, tuple(sorted(corrected))))
    for (campaign, reason, period), (clicks, micros) in sorted(adjustments.items(), key=lambda kv: (kv[0][2], kv[0])):
        text = f"Adjustment: {reason_words(reason)}"
        lines.append(InvoiceLine(ADJUSTMENT, campaign, text, clicks, micros, reason or None, (period,)))
    return lines


@dataclass(frozen=True, slots=True)
class InvoiceTotals:
    """The net (exact), the amount (the net rounded once), the tax (the amount times the rate, rounded) and the
    total, all in micros (the last three whole minor units of the currency)."""

    net_micros: int
    amount_micros: int
    tax_micros: int
    total_micros: int


def invoice_totals(net_micros: int, currency: str, tax_rate: str | None) -> InvoiceTotals:
    """The totals of a net in `currency` at `tax_rate` percent (None: no profile, no tax)."""
    amount = round_half_away(net_micros, currency)
    tax = 0 if tax_rate is None else round_half_away(Fraction(amount) * tax_fraction(tax_rate), currency)
    return InvoiceTotals(net_micros, amount, tax, amount + tax)


# --- The invoice --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invoice:
    """An issued invoice, as kept (`to_json`) and shown; never changed once issued."""

    number: int
    month: str
    advertiser_id: str
    currency: str
    issued_at_ms: int
    terms_days: int
    issuer: str
    bill_to: BillingProfile | None
    periods: tuple[str, ...]
    lines: tuple[InvoiceLine, ...]
    totals: InvoiceTotals
    tax_rate: str | None
    rounding_rule: str

    @property
    def label(self) -> str:
        """The number as printed: `INV-000042`."""
        return f"INV-{self.number:06d}"

    @property
    def due_at_ms(self) -> int:
        return self.issued_at_ms + self.terms_days * 86_400_000

    @property
    def due_date(self) -> str:
        return datetime.fromtimestamp(self.due_at_ms / 1000, UTC).date().isoformat()

    @property
    def issued_date(self) -> str:
        return datetime.fromtimestamp(self.issued_at_ms / 1000, UTC).date().isoformat()

    @property
    def payment_terms(self) -> str:
        if self.totals.total_micros < 0:
            return f"A credit: it is set against the next amount due, or paid back within {self.terms_days} days."
        return f"Payment due within {self.terms_days} days of the invoice date, by {self.due_date}."

    @property
    def minor_digits(self) -> int:
        return minor_digits(self.currency)

    def lines_of(self, kind: str) -> list[InvoiceLine]:
        return [line for line in self.lines if line.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        """The invoice as a JSON document: micros as strings of digits."""
        t = self.totals
        return {
            "number": self.number,
            "label": self.label,
            "month": self.month,
            "advertiser_id": self.advertiser_id,
            "currency": self.currency,
            "issued_at_ms": self.issued_at_ms,
            "issued_date": self.issued_date,
            "terms_days": self.terms_days,
            "due_date": self.due_date,
            "payment_terms": self.payment_terms,
            "issuer": self.issuer,
            "bill_to": None if self.bill_to is None else self.bill_to.to_dict(),
            "periods": list(self.periods),
            "lines": [line.to_dict() for line in self.lines],
            "net_micros": str(t.net_micros),
            "amount_micros": str(t.amount_micros),
            "tax_rate": self.tax_rate,
            "tax_micros": str(t.tax_micros),
            "total_micros": str(t.total_micros),
            "minor_digits": self.minor_digits,
            "rounding_rule": self.rounding_rule,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Invoice:
        return cls(
            number=int(data["number"]),
            month=parse_month(str(data["month"])),
            advertiser_id=str(data["advertiser_id"]),
            currency=str(data["currency"]),
            issued_at_ms=int(data["issued_at_ms"]),
            terms_days=int(data["terms_days"]),
            issuer=str(data["issuer"]),
            bill_to=None if data.get("bill_to") is None else BillingProfile.from_dict(data["bill_to"]),
            periods=tuple(data.get("periods") or ()),
            lines=tuple(InvoiceLine.from_dict(line) for line in data.get("lines") or ()),
            totals=InvoiceTotals(
                int(data["net_micros"]), int(data["amount_micros"]), int(data["tax_micros"]), int(data["total_micros"])
            ),
            tax_rate=data.get("tax_rate"),
            rounding_rule=str(data["rounding_rule"]),
        )

    @classmethod
    def from_json(cls, text: str) -> Invoice:
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class InvoiceTerms:
    """What every invoice says of who issues it and when it is due."""

    issuer: str = "adbill"
    terms_days: int = 30


def build_invoice(
    number: int,
    month: str,
    advertiser_id: str,
    rows: Sequence[ExportFigures],
    corrections: Sequence[CorrectionFigures],
    profiles: BillingProfiles,
    periods: Sequence[str],
    issued_at_ms: int,
    terms: InvoiceTerms,
    campaign_names: Mapping[str, str] | None = None,
) -> Invoice:
    """One advertiser's invoice for `month` from its rows in the exports it covers, each line with its campaign's
    name when it has one; InvoiceError when the rows are in several currencies (an advertiser bills in one)."""
    currencies = sorted({r.currency for r in rows})
    if len(currencies) != 1:
        listed = currencies or "no currency"
        raise InvoiceError(f"{advertiser_id}'s rows of {month} are in {listed}: an invoice is in one currency")
    currency = currencies[0]
    names = campaign_names or {}
    lines = [
        replace(line, campaign_name=names.get(line.campaign_id, "")) for line in invoice_lines(month, rows, corrections)
    ]
    net = sum(line.amount_micros for line in lines)
    if net != sum(r.net_micros for r in rows):
        raise InvoiceError(f"the lines of {advertiser_id}'s invoice of {month} do not add up to its exports' net")
    _, end = month_bounds(month)
    profile = profiles.in_force(advertiser_id, end - 1)
    rate = profile.tax_rate if profile else None
    return Invoice(
        number=number,
        month=month,
        advertiser_id=advertiser_id,
        currency=currency,
        issued_at_ms=issued_at_ms,
        terms_days=terms.terms_days,
        issuer=terms.issuer,
        bill_to=profile,
        periods=tuple(periods),
        lines=tuple(lines),
        totals=invoice_totals(net, currency, rate),
        tax_rate=rate,
        rounding_rule=rounding_rule(currency),
    )


# --- Issuing ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonthPlan:
    """What a month's invoices cover, written before the first of them and never changed: the exports (periods)
    and the advertisers with rows in them."""

    month: str
    periods: tuple[str, ...]
    advertisers: tuple[str, ...]
    planned_at_ms: int

    def to_json(self) -> str:
        data = {
            "month": self.month,
            "periods": list(self.periods),
            "advertisers": list(self.advertisers),
            "planned_at_ms": self.planned_at_ms,
        }
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> MonthPlan:
        data = json.loads(text)
        return cls(
            parse_month(data["month"]),
            tuple(data["periods"]),
            tuple(data["advertisers"]),
            int(data["planned_at_ms"]),
        )


class InvoiceSource(Protocol):
    """The closed periods' exports, as invoices read them."""

    def exported(self) -> list[str]:
        """The periods with an export."""

    def figures(self, periods: Sequence[str]) -> list[ExportFigures]:
        """Every row of the periods' exports, summed per advertiser, campaign, record type, status, reason, corrected
        and booked period."""

    def corrections(self, periods: Sequence[str]) -> list[CorrectionFigures]:
        """The corrections of each period booked in it (made before it closed), summed."""


class InvoiceBook(Protocol):
    """Where invoices are kept (`billing.store.invoice_db.InvoiceDatabase`)."""

    def lock(self) -> AbstractContextManager[None]:
        """Held while a month is issued: one issuer at a time; what is written under it is kept when it is let go,
        or none of it."""

    def issued_months(self) -> list[str]:
        """Months whose every invoice is written."""

    def plan(self, month: str) -> MonthPlan | None: ...

    def write_plan(self, plan: MonthPlan) -> None: ...

    def planned_periods(self) -> set[str]:
        """Every period any month's plan covers."""

    def has(self, month: str, advertiser_id: str) -> bool: ...

    def last_number(self) -> int:
        """The highest number issued (0 before the first)."""

    def write(self, invoice: Invoice) -> None:
        """Keep an invoice, whole or not at all; its number is issued once the lock is let go."""

    def mark_issued(self, month: str) -> None: ...


@dataclass
class Issued:
    """What one issuing did."""

    months: list[str] = field(default_factory=list)
    invoices: list[Invoice] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)

    def describe(self) -> list[str]:
        out = []
        for month in self.months:
            mine = [i for i in self.invoices if i.month == month]
            numbers = f"{mine[0].label} to {mine[-1].label}" if len(mine) > 1 else (mine[0].label if mine else "")
            out.append(f"invoices of {month}: {len(mine)} issued{f' ({numbers})' if numbers else ''}")
        out += [f"invoices of {month} wait: {why}" for month, why in self.waiting.items()]
        return out


@dataclass(frozen=True, slots=True)
class Issuer:
    """Issues invoices into `book` from the exports' figures (`source`), with the billing profiles in force, the
    clock that dates them, the payment terms and the campaigns' names to print."""

    book: InvoiceBook
    source: InvoiceSource
    profiles: BillingProfiles
    clock: Callable[[], int]
    terms: InvoiceTerms = InvoiceTerms()
    campaign_names: Mapping[str, str] | None = None

    def issue_month(self, month: str) -> list[Invoice]:
        """Issue the month's invoices not issued yet (all of them, the first time), under the book's lock, and return
        them. The caller has checked that the month is ready (`PeriodClosing.month_ready`). Idempotent: a month issued
        is left alone; one stopped half-way is completed from its plan."""
        parse_month(month)
        book, source, clock = self.book, self.source, self.clock
        made: list[Invoice] = []
        with book.lock():
            if month in book.issued_months():
                return made
            plan = book.plan(month)
            if plan is None:
                planned = book.planned_periods()
                earlier = {m for m in book.issued_months() if m < month}
                covered = sorted(
                    p
                    for p in source.exported()
                    if month_of(p) == month or (month_of(p) in earlier and p not in planned)
                )
                advertisers = sorted({f.advertiser_id for f in source.figures(covered)})
                plan = MonthPlan(month, tuple(covered), tuple(advertisers), clock())
                book.write_plan(plan)
            missing = [a for a in plan.advertisers if not book.has(month, a)]
            if missing:
                rows = source.figures(plan.periods)
                fixes = source.corrections(plan.periods)
                number = book.last_number()
                for advertiser_id in missing:
                    number += 1
                    invoice = build_invoice(
                        number,
                        month,
                        advertiser_id,
                        [r for r in rows if r.advertiser_id == advertiser_id],
                        [c for c in fixes if c.advertiser_id == advertiser_id],
                        self.profiles,
                        plan.periods,
                        clock(),
                        self.terms,
                        self.campaign_names,
                    )
                    book.write(invoice)
                    made.append(invoice)
            book.mark_issued(month)
        return made

    def issue_ready(self, closing: PeriodClosing, only: str | None = None) -> Issued:
        """Issue every month that is ready and not invoiced yet, oldest first (`PeriodClosing.months_to_issue`); with
        `only`, that month alone, once every month before it is invoiced (InvoiceError when it is not ready, with
        why)."""
        ready, waiting = closing.months_to_issue(self.book.issued_months(), self.clock())
        done = Issued(waiting=waiting)
        if only is not None:
            parse_month(only)
            if only in self.book.issued_months():
                return Issued()
            if only not in ready:
                first = next(iter(waiting), None)
                if first is None or first > only:
                    why = "no period of it holds data"
                elif first == only:
                    why = waiting[only]
                else:
                    why = f"{first} comes first and is not ready ({waiting[first]})"
                raise InvoiceError(f"{only} cannot be invoiced yet: {why}")
            ready = [m for m in ready if m <= only]
            done.waiting = {}
        for month in ready:
            done.invoices += self.issue_month(month)
            done.months.append(month)
        return done


def _ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1000
