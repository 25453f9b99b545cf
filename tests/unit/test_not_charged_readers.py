"""The readers' pure parts for what is not charged: a not-charged hash read into `NotCharged`, added up per period,
day, month and currency, the invalid click rate, the statement's lines and CSV columns, a campaign's budget now and its
days as the API writes them (micros as strings)."""

from __future__ import annotations

import csv
import io
from datetime import date

from billing.budget_days import BudgetDay, BudgetSpan, CampaignDay
from billing.catalog import Ad, Catalog, MadeBy
from web.ad_catalog import BudgetStatus
from web.api import campaign_day_document, not_charged_document
from web.model import (
    NOT_CHARGED_REASONS,
    AdvertiserLine,
    Billed,
    Figures,
    NotCharged,
    Period,
    PeriodBill,
    group,
    not_charged_by_currency,
    total_not_charged,
)
from web.ranges import DateRange
from web.readers import NOT_CHARGED_FIELDS, not_charged_of
from web.statements import CSV_COLUMNS, PROVISIONAL, PeriodCharges, build_statement, statement_csv

H = 3_600_000
DAY = 1_767_225_600_000  # 2026-01-01T00:00Z


def test_a_not_charged_hash_is_read_field_by_field_in_the_reasons_order() -> None:
    assert NOT_CHARGED_REASONS == ("known_bot", "excluded_ip", "click_flood", "duplicate_click", "over_budget")
    assert NOT_CHARGED_FIELDS[:4] == ("known_bot", "known_bot:micros", "excluded_ip", "excluded_ip:micros")
    values = ["3", "900000", None, None, "21", "6300000", "-1", "-300000", "5", "1500000"]  # Redis strings, absent
    read = not_charged_of(values)
    assert read == NotCharged(
        Figures(3, 900_000), Figures(), Figures(21, 6_300_000), Figures(-1, -300_000), Figures(5, 1_500_000)
    )
    assert read.invalid == Figures(23, 6_900_000)  # the four rules together, a correction's -1 included
    assert not_charged_of([None] * 10).is_zero
    big = not_charged_of(["1", str(2**63 - 1)] + ["0"] * 8)
    assert big.invalid.micros == 2**63 - 1  # exact: integers, never floats


def test_the_invalid_click_rate_is_invalid_over_charged_plus_invalid() -> None:
    nc = NotCharged(known_bot=Figures(21, 0))
    assert nc.invalid_rate(479) == "4.2 %"  # 21 / 500
    assert nc.invalid_rate(0) == "100.0 %"
    assert NotCharged().invalid_rate(0) == "-"  # no clicks at all
    assert NotCharged(over_budget=Figures(9, 9)).invalid_rate(10) == "0.0 %"  # over budget is not invalid


def bill(start_ms: int, closed: bool, charged: int, nc: NotCharged) -> PeriodBill:
    return PeriodBill(Period(f"p{start_ms}", start_ms, closed), Billed(Figures(charged, charged)), not_charged=nc)


def test_days_months_and_a_range_add_up_what_was_not_charged() -> None:
    bills = [
        bill(DAY, True, 10, NotCharged(known_bot=Figures(1, 10))),
        bill(DAY + H, False, 5, NotCharged(over_budget=Figures(2, 20))),
        bill(DAY + 24 * H, False, 0, NotCharged(click_flood=Figures(21, 210))),
    ]
    days = group(bills, 10)
    assert [(d.key, d.not_charged.invalid.clicks, d.not_charged.over_budget.clicks) for d in days] == [
        ("2026-01-01", 1, 2),
        ("2026-01-02", 21, 0),
    ]
    (month,) = group(bills, 7)
    assert month.not_charged == total_not_charged(bills)
    assert month.not_charged.invalid == Figures(22, 220) and month.not_charged.over_budget == Figures(2, 20)


def test_per_currency_never_two_currencies_together() -> None:
    lines = [
        AdvertiserLine("a", "EUR", Billed(), NotCharged(known_bot=Figures(1, 100))),
        AdvertiserLine("b", "EUR", Billed(), NotCharged(known_bot=Figures(2, 200))),
        AdvertiserLine("c", "JPY", Billed(), NotCharged(known_bot=Figures(4, 10**12))),
        AdvertiserLine("d", "", Billed(), NotCharged(known_bot=Figures(8, 8))),  # currency unknown: in no total
    ]
    assert not_charged_by_currency(lines) == {
        "EUR": NotCharged(known_bot=Figures(3, 300)),
        "JPY": NotCharged(known_bot=Figures(4, 10**12)),
    }


def test_the_api_writes_what_was_not_charged_beside_the_bill_with_micros_as_strings() -> None:
    nc = NotCharged(duplicate_click=Figures(3, 2**53 + 1), over_budget=Figures(1, 5))
    doc = not_charged_document(nc, Billed(Figures(7, 70)))["not_charged"]
    assert doc["invalid"] == {"clicks": 3, "micros": str(2**53 + 1)}
    assert doc["invalid_click_rate"] == "30.0 %"
    assert doc["over_budget"] == {"clicks": 1, "micros": "5"}
    assert set(doc) == {"invalid", "invalid_click_rate", *NOT_CHARGED_REASONS}


def test_the_statement_has_the_lines_and_columns_and_they_never_enter_the_total() -> None:
    span = DateRange(date(2026, 1, 1), date(2026, 1, 31))
    periods = [
        PeriodCharges("20260101T0000Z", DAY, "closed", 10, 1_000, 0, 0, NotCharged(known_bot=Figures(2, 200)), -50),
        PeriodCharges(
            "20260101T0100Z", DAY + H, PROVISIONAL, 5, 500, not_charged=NotCharged(over_budget=Figures(3, 3))
        ),
    ]
    s = build_statement("adv-1", "EUR", "2026-01", span, periods)
    assert s.total_micros == 1_500 and s.invalid == Figures(2, 200) and s.over_budget == Figures(3, 3)
    assert s.invalid_rate == "11.8 %" and s.invalid_credits_micros == -50  # 2 / (15 + 2)
    rows = list(csv.DictReader(io.StringIO(statement_csv(s))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [(r["invalid_clicks_not_charged"], r["over_budget_clicks_not_charged"]) for r in rows] == [
        ("2", "0"),
        ("0", "3"),
        ("2", "3"),
    ]
    assert rows[-1]["invalid_micros_not_charged"] == "200" and rows[-1]["invalid_activity_credits_micros"] == "-50"
    assert rows[-1]["total_micros"] == "1500"


def test_a_campaigns_budget_now_and_one_of_its_days_as_the_api_writes_them() -> None:
    catalog = (
        Catalog([Ad("ad-1", "cmp-1", "adv-1", 300_000, "EUR")])
        .with_budget("cmp-1", DAY, 9_000_000, DAY, made_by=MadeBy("ada", "page"))
        .with_budget("cmp-1", DAY + 2 * H, None, DAY + H, made_by=MadeBy("ops", "command"))
    )
    now = BudgetStatus.of(catalog, "cmp-1", DAY + H)
    assert (now.daily_budget_micros, now.currency, now.advertiser_id) == (9_000_000, "EUR", "adv-1")
    assert now.next_change is not None and now.next_change.daily_budget_micros is None
    assert [(b.made_by, b.door, b.made_at) for b in now.history] == [("ada", "page", DAY), ("ops", "command", DAY + H)]
    assert BudgetStatus.of(catalog, "cmp-1", DAY - 1).daily_budget_micros is None  # before the first: unlimited
    day = CampaignDay(
        "cmp-1", "2026-01-01", DAY, (BudgetSpan(DAY, 9_000_000), BudgetSpan(DAY + 2 * H, None)),
        BudgetDay(30, 9_000_000, 4, 1_200_000), False,
    )  # fmt: skip
    assert campaign_day_document(day) == {
        "campaign_id": "cmp-1",
        "day": "2026-01-01",
        "budget_micros": None,
        "budgets": [
            {"from_ms": DAY, "daily_budget_micros": "9000000"},
            {"from_ms": DAY + 2 * H, "daily_budget_micros": None},
        ],
        "charged": {"clicks": 30, "micros": "9000000"},
        "over_budget": {"clicks": 4, "micros": "1200000"},
        "room_micros": None,
        "capped": False,
    }
