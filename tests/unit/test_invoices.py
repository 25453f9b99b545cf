"""Monthly invoices: the rounding (half away from zero, once, to the currency's minor unit), the tax, the lines, and
when a month may be invoiced. The numbers (gap-free across crashes and with two issuers at once) of invoices that
never change, kept in the database: tests/integration/test_invoice_numbers.py."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from billing.invoices import (
    ADJUSTMENT,
    CHARGES,
    CORRECTION,
    CorrectionFigures,
    ExportFigures,
    Invoice,
    InvoiceError,
    InvoiceTerms,
    PeriodClosing,
    build_invoice,
    invoice_lines,
    invoice_totals,
)
from billing.money import minor_digits, round_half_away, rounding_rule
from billing.periods import Periods
from billing.profiles import BillingProfile, BillingProfiles, ProfileError, parse_tax_rate, profile_change, tax_fraction
from billing.reconcile_plan import PeriodState

JAN = 1_767_225_600_000  # 2026-01-01T00:00Z
FEB = 1_769_904_000_000  # 2026-02-01T00:00Z
HOUR = 3_600_000
HORIZON = 900_000


# --- Rounding -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("micros", "currency", "rounded"),
    [
        (1_234_567, "EUR", 1_230_000),  # 1.234567 -> 1.23: below the half
        (1_235_000, "EUR", 1_240_000),  # exactly half a cent: away from zero
        (1_234_999, "EUR", 1_230_000),  # a micro below the half
        (1_005_000, "EUR", 1_010_000),  # 1.005 -> 1.01 (a float would say 1.00)
        (-1_005_000, "EUR", -1_010_000),  # a negative net: away from zero too, symmetric
        (-1_004_999, "EUR", -1_000_000),
        (-4_999, "EUR", 0),  # rounds to zero, no negative zero
        (0, "EUR", 0),
        (2_675_000, "USD", 2_680_000),  # two decimals for USD
        (500_000, "JPY", 1_000_000),  # 0.5 JPY -> 1 JPY: no minor unit
        (499_999, "JPY", 0),
        (-500_000, "JPY", -1_000_000),
        (1_234_567_890, "JPY", 1_235_000_000),
        (1_000_500, "KWD", 1_001_000),  # three decimals: 1.0005 -> 1.001
        (1_000_499, "KWD", 1_000_000),
        (-1_000_500, "KWD", -1_001_000),
        (9_223_372_036_854_775_000, "EUR", 9_223_372_036_854_780_000),  # at the top of int64, exact
    ],
)
def test_rounding_is_half_away_from_zero_to_the_minor_unit(micros: int, currency: str, rounded: int) -> None:
    assert round_half_away(micros, currency) == rounded


def test_minor_units_follow_iso_4217() -> None:
    assert [minor_digits(c) for c in ("EUR", "USD", "JPY", "KWD", "BHD", "CLP", "GBP")] == [2, 2, 0, 3, 3, 0, 2]
    assert "JPY: whole units" in rounding_rule("JPY") and "half away from zero" in rounding_rule("EUR")


@pytest.mark.parametrize("value", [1.5, True, "1000"])
def test_rounding_takes_integers_and_fractions_only(value: object) -> None:
    with pytest.raises(TypeError):
        round_half_away(value, "EUR")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("net", "currency", "rate", "amount", "tax", "total"),
    [
        # 100.005 EUR -> 100.01; 19 % of 100.01 = 19.0019 -> 19.00
        (100_005_000, "EUR", "19", 100_010_000, 19_000_000, 119_010_000),
        # 10.00 EUR at 7.7 %: 0.77 exactly
        (10_000_000, "EUR", "7.7", 10_000_000, 770_000, 10_770_000),
        # the tax's own half: 0.50 EUR at 1 % = 0.005 -> 0.01
        (500_000, "EUR", "1", 500_000, 10_000, 510_000),
        # a credit: -0.50 EUR at 1 % = -0.005 -> -0.01
        (-500_000, "EUR", "1", -500_000, -10_000, -510_000),
        # JPY: 1234.5 -> 1235; 10 % = 123.5 -> 124
        (1_234_500_000, "JPY", "10", 1_235_000_000, 124_000_000, 1_359_000_000),
        # KWD: 3 decimals; 5 % of 1.001 = 0.05005 -> 0.050
        (1_000_500, "KWD", "5", 1_001_000, 50_000, 1_051_000),
        # no profile: no tax
        (1_234_567, "EUR", None, 1_230_000, 0, 1_230_000),
        # a rate with six decimals, exact
        (1_000_000_000, "USD", "8.875125", 1_000_000_000, 88_750_000, 1_088_750_000),
    ],
)
def test_the_tax_is_the_rounded_net_times_the_rate_rounded_the_same_way(
    net: int, currency: str, rate: str | None, amount: int, tax: int, total: int
) -> None:
    totals = invoice_totals(net, currency, rate)
    assert (totals.net_micros, totals.amount_micros, totals.tax_micros, totals.total_micros) == (
        net,
        amount,
        tax,
        total,
    )


@pytest.mark.parametrize(
    ("typed", "kept"),
    [("19", "19"), ("7.70", "7.7"), ("0", "0"), ("100", "100"), (" 20 % ", "20"), ("0.000001", "0.000001")],
)
def test_a_tax_rate_is_an_exact_decimal(typed: str, kept: str) -> None:
    assert parse_tax_rate(typed) == kept
    assert tax_fraction(kept) == Fraction(kept) / 100


@pytest.mark.parametrize("typed", ["-1", "101", "100.5", "1e2", "19,5", "0.0000001", "", "abc", "nan"])
def test_a_tax_rate_that_is_not_one_is_refused(typed: str) -> None:
    with pytest.raises(ProfileError):
        parse_tax_rate(typed)


# --- Profiles -----------------------------------------------------------------------------------------------


def test_a_profile_is_kept_with_history_and_changes_from_now_on() -> None:
    # The rule alone; its store in the database: tests/integration/test_profiles_and_names_database.py.
    first = BillingProfiles().with_profile(profile_change("adv-1", "Acme", "1 Main St\nParis", "FR1", "20", JAN), JAN)
    later = profile_change("adv-1", "Acme SA", "2 Rue\nLyon", "FR1", "5.5", FEB)
    profiles = first.with_profile(later, JAN + HOUR)
    [january, february] = profiles.history("adv-1")
    assert (january.version, february.version, february.made_at, profiles.version) == (1, 2, JAN + HOUR, 2)
    assert profiles.in_force("adv-1", FEB - 1) == january  # the month's end: January's profile
    assert profiles.in_force("adv-1", FEB) == february
    assert profiles.in_force("adv-1", JAN - 1) is None
    with pytest.raises(ProfileError, match="before now"):
        profiles.with_profile(profile_change("adv-1", "X", "Y", "", "1", JAN), JAN + HOUR)
    with pytest.raises(ProfileError, match="already has a profile from"):
        profiles.with_profile(profile_change("adv-1", "X", "Y", "", "1", FEB), JAN + HOUR)
    with pytest.raises(ProfileError, match="needs a name"):
        profile_change("adv-1", " ", "Y", "", "1", JAN)


# --- Lines --------------------------------------------------------------------------------------------------


def fig(
    campaign: str,
    record_type: str,
    status: str,
    rows: int,
    net: int,
    reason: str | None = None,
    period: str = "20260105T1000Z",
    booked: str | None = None,
    advertiser: str = "adv-1",
    currency: str = "EUR",
) -> ExportFigures:
    return ExportFigures(
        advertiser, campaign, currency, record_type, status, reason, period, booked or period, rows, net
    )


def test_lines_per_campaign_with_corrections_and_adjustments_that_add_up_exactly() -> None:
    rows = [
        fig("cmp-a", "click", "billed", 100, 25_000_000),  # 100 clicks at 0.25 billed live and confirmed
        fig("cmp-a", "click", "added", 3, 750_000, "late_click"),  # 3 late clicks added before close
        fig("cmp-a", "click", "retracted", 2, 0, "duplicate"),  # 2 duplicates retracted before close
        fig("cmp-b", "click", "billed", 10, 12_345_678),
        # adjustments booked in January for periods closed earlier (one in December)
        fig("cmp-a", "adjustment", "retracted", 4, -1_000_000, "known_bot", "20251231T2300Z", "20260105T1000Z"),
        fig("cmp-a", "adjustment", "retracted", 1, -250_000, "click_flood", "20251231T2300Z", "20260105T1000Z"),
        fig("cmp-b", "adjustment", "added", 1, 1_234_567, "late_click", "20260101T0000Z", "20260105T1000Z"),
    ]
    fixes = [
        CorrectionFigures("adv-1", "cmp-a", "late_click", "addition", "20260105T1000Z", 3, 750_000),
        CorrectionFigures("adv-1", "cmp-a", "duplicate", "retraction", "20260105T1000Z", 2, -500_000),
    ]
    lines = invoice_lines("2026-01", rows, fixes)
    summary = [(ln.kind, ln.campaign_id, ln.description, ln.clicks, ln.amount_micros, ln.corrects) for ln in lines]
    assert summary == [
        # billed live: the export's 103 clicks and 25.75, less the corrections (+3 clicks 0.75, -2 clicks -0.50)
        (CHARGES, "cmp-a", "Clicks billed", 102, 25_500_000, ()),
        (CHARGES, "cmp-b", "Clicks billed", 10, 12_345_678, ()),
        (CORRECTION, "cmp-a", "Correction before close: duplicate", -2, -500_000, ("20260105T1000Z",)),
        (CORRECTION, "cmp-a", "Correction before close: late click", 3, 750_000, ("20260105T1000Z",)),
        # by the period they correct; the invalid traffic rules are "invalid activity", each with its reason
        (ADJUSTMENT, "cmp-a", "Adjustment: invalid activity", -1, -250_000, ("20251231T2300Z",)),
        (ADJUSTMENT, "cmp-a", "Adjustment: invalid activity", -4, -1_000_000, ("20251231T2300Z",)),
        (ADJUSTMENT, "cmp-b", "Adjustment: late click", 1, 1_234_567, ("20260101T0000Z",)),
    ]
    assert sum(ln.amount_micros for ln in lines) == sum(r.net_micros for r in rows)
    assert {ln.reason for ln in lines if ln.kind == ADJUSTMENT} == {"click_flood", "known_bot", "late_click"}


def test_an_invoice_in_jpy_rounds_its_net_once_and_takes_the_profile_at_the_months_end() -> None:
    profiles = BillingProfiles(
        [
            BillingProfile("adv-2", "Kabushiki", "Tokyo", "JP1", "10", JAN - HOUR, 1),
            BillingProfile("adv-2", "Kabushiki", "Tokyo", "JP1", "8", FEB, 2),  # from February: not January's
        ],
        2,
    )
    rows = [fig("cmp-j", "click", "billed", 3, 1_234_500_000, advertiser="adv-2", currency="JPY")]
    invoice = build_invoice(7, "2026-01", "adv-2", rows, [], profiles, ["20260105T1000Z"], FEB + HOUR, InvoiceTerms())
    t = invoice.totals
    assert (t.net_micros, t.amount_micros, t.tax_micros, t.total_micros) == (
        1_234_500_000,
        1_235_000_000,
        124_000_000,
        1_359_000_000,
    )
    assert invoice.tax_rate == "10" and invoice.bill_to and invoice.bill_to.version == 1
    assert invoice.label == "INV-000007" and invoice.due_date == "2026-03-03"
    assert "half away from zero" in invoice.rounding_rule and "JPY" in invoice.rounding_rule
    again = Invoice.from_json(invoice.to_json())
    assert again == invoice
    document = json.loads(invoice.to_json())
    assert document["total_micros"] == "1359000000" and document["lines"][0]["amount_micros"] == "1234500000"


def test_rows_in_two_currencies_make_no_invoice() -> None:
    rows = [fig("c", "click", "billed", 1, 1), fig("c", "click", "billed", 1, 1, currency="USD")]
    with pytest.raises(InvoiceError, match="one currency"):
        build_invoice(1, "2026-01", "adv-1", rows, [], BillingProfiles(), [], FEB, InvoiceTerms())


# --- When -----------------------------------------------------------------------------------------------------


def closed(at: int = FEB + HORIZON) -> PeriodState:
    return PeriodState(version=1, closed_at_ms=at)


def test_a_month_is_ready_once_every_period_of_it_is_closed() -> None:
    last = "20260131T2300Z"
    states = {"20260105T1000Z": closed(), last: PeriodState(version=3)}  # the last hour is not closed yet
    versions = {"20260105T1000Z": 1, last: 3, "20260201T0000Z": 4}
    closing = PeriodClosing(Periods(), HORIZON, versions, states)  # reads the states as they are changed below
    assert "after 2026-02-01T00:15:00.000Z" in (closing.month_ready("2026-01", FEB) or "")
    assert closing.month_ready("2026-01", FEB + HORIZON) == "1 period(s) not closed yet: 20260131T2300Z"
    states[last] = closed()
    assert closing.month_ready("2026-01", FEB + HORIZON) is None
    # February is not over: January alone; and a month waits for the one before it.
    ready, waiting = closing.months_to_issue([], FEB + HORIZON)
    assert ready == ["2026-01"] and list(waiting) == ["2026-02"]
    states["20251231T2300Z"] = PeriodState(version=1)  # December still has an open period
    ready, waiting = closing.months_to_issue([], FEB + HORIZON)
    assert ready == [] and list(waiting) == ["2025-12"]
    ready, _ = closing.months_to_issue(["2025-12"], FEB + HORIZON)
    assert ready == ["2026-01"]
