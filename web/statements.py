"""An advertiser's monthly statement: the month's closed periods as finance was given them (each period's export:
its clicks and the adjustments booked in it for earlier periods), and the open remainder, provisional; beside the
charges, what was not charged: invalid clicks (docs/billing-rules.md, "Invalid traffic") and clicks over budget
("Budgets"), counted and with what they would have cost, and the invalid activity credits among the adjustments.

Pure: the statement is built from per-period inputs that `web.charges` reads from the export folder and Redis.
Money is integer micros; the CSV keeps them and adds a decimal column; `web.statement_pdf` writes the PDF.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass, field

from billing.invalid import format_rate
from billing.money import format_amount
from web.model import Figures, NotCharged
from web.ranges import DateRange, day_of

CLOSED, CLOSED_WITHOUT_EXPORT, PROVISIONAL = "closed", "closed (export not on file)", "provisional"


@dataclass(frozen=True, slots=True)
class PeriodCharges:
    """One period of the statement: `charges` are the period's own clicks (net, as the export says, or the
    corrected Redis figure while open), `adjustments` the corrections booked in it for earlier closed periods."""

    period: str
    start_ms: int
    status: str
    clicks: int
    charges_micros: int
    adjustments_micros: int = 0
    adjustments: int = 0
    not_charged: NotCharged = NotCharged()
    """The period's clicks not charged, per reason (the Redis figures: a closed period's are its export's)."""
    invalid_credits_micros: int = 0
    """Of the adjustments, those whose reason is an invalid traffic rule: invalid activity credits (closed periods
    from their export)."""

    @property
    def total_micros(self) -> int:
        return self.charges_micros + self.adjustments_micros


@dataclass(frozen=True, slots=True)
class DayLine:
    day: str
    clicks: int = 0
    closed_micros: int = 0
    adjustments_micros: int = 0
    provisional_micros: int = 0

    @property
    def total_micros(self) -> int:
        return self.closed_micros + self.adjustments_micros + self.provisional_micros

    @property
    def provisional(self) -> bool:
        return self.provisional_micros != 0


@dataclass(frozen=True, slots=True)
class Statement:
    advertiser_id: str
    currency: str
    month: str
    span: DateRange
    periods: list[PeriodCharges]
    days: list[DayLine] = field(default_factory=list)
    month_open: bool = False
    """The month has not ended yet: its figures are provisional whatever its periods say."""

    @property
    def provisional(self) -> bool:
        """Whether a figure of the statement may still change: a period of it is open, or the month is not over."""
        return self.month_open or self.open_periods > 0

    @property
    def closed_micros(self) -> int:
        return sum(p.charges_micros for p in self.periods if p.status != PROVISIONAL)

    @property
    def adjustments_micros(self) -> int:
        return sum(p.adjustments_micros for p in self.periods)

    @property
    def provisional_micros(self) -> int:
        return sum(p.charges_micros for p in self.periods if p.status == PROVISIONAL)

    @property
    def total_micros(self) -> int:
        return self.closed_micros + self.adjustments_micros + self.provisional_micros

    @property
    def clicks(self) -> int:
        return sum(p.clicks for p in self.periods)

    @property
    def invalid(self) -> Figures:
        """Invalid clicks (not charged) in the month, and what they would have cost."""
        return sum((p.not_charged.invalid for p in self.periods), Figures())

    @property
    def over_budget(self) -> Figures:
        """Valid clicks not charged for their campaign's daily budget in the month, and what they would have cost."""
        return sum((p.not_charged.over_budget for p in self.periods), Figures())

    @property
    def invalid_credits_micros(self) -> int:
        return sum(p.invalid_credits_micros for p in self.periods)

    @property
    def invalid_rate(self) -> str:
        """Invalid clicks / (charged + invalid) over the month."""
        return format_rate(self.invalid.clicks, self.clicks)

    @property
    def open_periods(self) -> int:
        return sum(1 for p in self.periods if p.status == PROVISIONAL)

    @property
    def last_open_start_ms(self) -> int | None:
        """The start of the month's latest open period (the last of its figures to become final), None if none."""
        return max((p.start_ms for p in self.periods if p.status == PROVISIONAL), default=None)


def build_statement(
    advertiser_id: str,
    currency: str,
    month: str,
    span: DateRange,
    periods: Iterable[PeriodCharges],
    now_ms: int | None = None,
) -> Statement:
    """The statement of the month from its periods (any order), with one line per day that has any; with `now_ms`,
    a month not over yet is provisional whatever its periods say."""
    ordered = sorted(periods, key=lambda p: p.start_ms)
    days: dict[str, DayLine] = {}
    for p in ordered:
        key = day_of(p.start_ms)
        d = days.get(key, DayLine(key))
        closed = p.charges_micros if p.status != PROVISIONAL else 0
        days[key] = DayLine(
            key,
            d.clicks + p.clicks,
            d.closed_micros + closed,
            d.adjustments_micros + p.adjustments_micros,
            d.provisional_micros + (p.charges_micros if p.status == PROVISIONAL else 0),
        )
    month_open = now_ms is not None and now_ms < span.end_ms
    return Statement(advertiser_id, currency, month, span, ordered, [days[k] for k in sorted(days)], month_open)


CSV_COLUMNS = (
    "advertiser_id",
    "month",
    "period",
    "status",
    "clicks",
    "charges_micros",
    "adjustments_micros",
    "total_micros",
    "total",
    "currency",
    "invalid_clicks_not_charged",
    "invalid_micros_not_charged",
    "over_budget_clicks_not_charged",
    "over_budget_micros_not_charged",
    "invalid_activity_credits_micros",
)
"""The statement's CSV: the charges, then what was not charged (clicks and what they would have cost, never in the
totals) and the invalid activity credits among the adjustments."""


def statement_csv(statement: Statement) -> str:
    """One row per period, then a total row (period `TOTAL`); micros as integers, `total` as an exact decimal."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for p in statement.periods:
        writer.writerow(
            [
                safe_cell(statement.advertiser_id),
                statement.month,
                p.period,
                p.status,
                p.clicks,
                p.charges_micros,
                p.adjustments_micros,
                p.total_micros,
                format_amount(p.total_micros, statement.currency),
                statement.currency,
                p.not_charged.invalid.clicks,
                p.not_charged.invalid.micros,
                p.not_charged.over_budget.clicks,
                p.not_charged.over_budget.micros,
                p.invalid_credits_micros,
            ]
        )
    writer.writerow(
        [
            safe_cell(statement.advertiser_id),
            statement.month,
            "TOTAL",
            PROVISIONAL if statement.provisional else CLOSED,
            statement.clicks,
            statement.closed_micros + statement.provisional_micros,
            statement.adjustments_micros,
            statement.total_micros,
            format_amount(statement.total_micros, statement.currency),
            statement.currency,
            statement.invalid.clicks,
            statement.invalid.micros,
            statement.over_budget.clicks,
            statement.over_budget.micros,
            statement.invalid_credits_micros,
        ]
    )
    return out.getvalue()


def safe_cell(text: str) -> str:
    """A text cell a spreadsheet never reads as a formula: one that starts with `=`, `+`, `-`, `@`, a tab or a
    carriage return gets a leading apostrophe (OWASP's CSV injection advice)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
