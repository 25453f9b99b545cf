"""An advertiser's monthly statement: the month's closed periods as finance was given them (each period's export:
its clicks and the adjustments booked in it for earlier periods), and the open remainder, provisional.

Pure: the statement is built from per-period inputs that `web.charges` reads from the export folder and Redis.
Money is integer micros; the CSV keeps them and adds a decimal column; `web.statement_pdf` writes the PDF.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass, field

from billing.money import format_micros
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
    def open_periods(self) -> int:
        return sum(1 for p in self.periods if p.status == PROVISIONAL)


def build_statement(
    advertiser_id: str, currency: str, month: str, span: DateRange, periods: Iterable[PeriodCharges]
) -> Statement:
    """The statement of the month from its periods (any order), with one line per day that has any."""
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
    return Statement(advertiser_id, currency, month, span, ordered, [days[k] for k in sorted(days)])


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
)


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
                format_micros(p.total_micros),
                statement.currency,
            ]
        )
    writer.writerow(
        [
            safe_cell(statement.advertiser_id),
            statement.month,
            "TOTAL",
            PROVISIONAL if statement.open_periods else CLOSED,
            statement.clicks,
            statement.closed_micros + statement.provisional_micros,
            statement.adjustments_micros,
            statement.total_micros,
            format_micros(statement.total_micros),
            statement.currency,
        ]
    )
    return out.getvalue()


def safe_cell(text: str) -> str:
    """A text cell a spreadsheet never reads as a formula: one that starts with `=`, `+`, `-`, `@`, a tab or a
    carriage return gets a leading apostrophe (OWASP's CSV injection advice)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
