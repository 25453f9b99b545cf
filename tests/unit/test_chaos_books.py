"""The chaos suite's verdict on books with invalid traffic and budgets: the provisional ledger plus reconciliation's
corrections, the exports with their later adjustments, and each campaign's day held to its budgets
(`ops.chaos_books.final_ledger`, `exported_books`, `past_budget`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from billing.budgets import DAY_MS, BudgetChange
from billing.catalog import Ad, Catalog
from billing.change_log import ChangeEntry
from billing.corrections import Correction, CorrectionKind, CorrectionReason
from ops.chaos_books import (
    budget_and_range_changes,
    charged_after_raises,
    exported_books,
    final_ledger,
    past_budget,
)

T0 = 1_795_737_600_000  # 2026-11-27T00:00:00Z


def bill(click_id: str, micros: int) -> dict[str, Any]:
    return {"click_id": click_id, "amount_micros": micros}


def correction(click_id: str, kind: CorrectionKind, micros: int, reason: CorrectionReason) -> Correction:
    return Correction(
        correction_id=f"{click_id}-{kind.value}",
        kind=kind,
        click_id=click_id,
        impression_id=None,
        ad_id="ad-1",
        campaign_id="cmp-1",
        advertiser_id="adv-1",
        amount_micros=micros,
        currency="EUR",
        reason=reason,
        corrects_period="2026-11-27T00",
        booked_period="2026-11-27T00",
        created_at_ms=T0,
    )


def test_the_final_ledger_is_the_provisional_one_with_its_additions_and_retractions() -> None:
    corrections = [
        correction("flooded", CorrectionKind.RETRACTION, -300_000, CorrectionReason.CLICK_FLOOD),
        correction("late", CorrectionKind.ADDITION, 200_000, CorrectionReason.LATE_CLICK),
    ]
    rows = [bill("kept", 300_000), bill("flooded", 300_000), bill("twice", 100_000), bill("twice", 100_000)]

    final = final_ledger(rows, corrections)

    # A click billed twice and never retracted stands out: it is no bill of the ground truth's.
    assert final == {"kept": 300_000, "late": 200_000, "twice": -2}
    assert final_ledger(rows[:1], []) == {"kept": 300_000}


def test_a_day_past_every_budget_its_campaign_had_is_named_and_an_unlimited_one_never() -> None:
    catalog = Catalog(
        [Ad("ad-1", "cmp-1", "adv-1", 100_000, "EUR"), Ad("ad-2", "cmp-2", "adv-1", 100_000, "EUR")],
        budgets={
            "cmp-1": [BudgetChange(0, 500_000), BudgetChange(T0 + 3_600_000, 700_000)],
            "cmp-2": [BudgetChange(0, 100_000), BudgetChange(T0, None)],
        },
    )
    # Up to the raised budget: within; past it: named; a campaign that was unlimited, or has no budget: never.
    assert past_budget({("cmp-1", "2026-11-27"): 700_000}, catalog) == []
    charged = {
        ("cmp-1", "2026-11-27"): 700_001,
        ("cmp-1", "2026-11-28"): 100_000,
        ("cmp-2", "2026-11-27"): 5_000_000,
        ("cmp-3", "2026-11-27"): 9_000_000,
    }
    assert past_budget(charged, catalog) == ["cmp-1 2026-11-27: 700001 > 700000"]


def test_the_exports_books_are_each_periods_bills_with_the_adjustments_later_periods_booked_for_them() -> None:
    def row(click: str, record_type: str, status: str, net: int) -> dict[str, Any]:
        return {"click_id": click, "record_type": record_type, "status": status, "net_micros": net}

    rows = [
        row("kept", "click", "billed", 300_000),
        row("added", "click", "added", 200_000),
        row("retracted", "click", "retracted", 0),
        # A late twin found after the period closed: the click billed there retracted, the twin added, later.
        row("billed-then-duplicate", "click", "billed", 100_000),
        row("billed-then-duplicate", "adjustment", "retracted", -100_000),
        row("late-twin", "adjustment", "added", 100_000),
        row("free", "click", "billed", 0),
        row("twice", "click", "billed", 100_000),
        row("twice", "adjustment", "added", 100_000),
    ]

    assert exported_books(rows) == {"kept": 300_000, "added": 200_000, "late-twin": 100_000, "free": 0, "twice": -2}

    # The last reconciliation found a late twin of a closed period's click: both adjustments are booked in the
    # period still open, so no export carries them yet; the books hold them (as the audit counts them).
    pending = [
        correction("kept", CorrectionKind.RETRACTION, -300_000, CorrectionReason.DUPLICATE_CLICK),
        correction("kept-twin", CorrectionKind.ADDITION, 300_000, CorrectionReason.LATE_CLICK),
    ]
    books = exported_books(rows[:1], pending)
    assert books == {"kept-twin": 300_000}
    assert exported_books(rows[:1]) == {"kept": 300_000}


def test_the_mid_run_changes_are_the_budgets_and_ranges_changed_after_the_start() -> None:
    start = 1_795_767_881_000

    def entry(kind: str, made_at: int | None) -> ChangeEntry:
        return ChangeEntry(version=0, kind=kind, made_at=made_at)

    log = [
        entry("start", start - 5_000),
        entry("set-budget", start + 100),  # the run's budgets and ranges of its start
        entry("exclude-ip", start + 120),
        entry("set-price", start + 1_300_000),  # a price is not counted
        entry("set-budget", start + 1_250_000),
        entry("set-budget", start + 1_250_010),
        entry("include-ip", start + 1_250_020),
        entry("set-budget", None),  # read from the catalog, when it was made unknown
    ]

    assert budget_and_range_changes(log, after_ms=start + 60_000) == Counter({"set-budget": 2, "include-ip": 1})
    assert budget_and_range_changes(log, after_ms=start + 1_300_000) == Counter()


def test_the_clicks_charged_after_a_raise_are_counted_per_raised_or_lifted_budget() -> None:
    day = 1_795_737_600_000  # a UTC midnight
    start, change = day + 3_600_000, day + 4_500_000
    catalog = Catalog(
        [Ad(f"ad-{n}", f"cmp-{n}", "adv-1", 100_000, "EUR") for n in (1, 2, 3)],
        budgets={
            "cmp-1": [BudgetChange(start, 500_000), BudgetChange(change, 750_000)],
            "cmp-2": [BudgetChange(start, 500_000), BudgetChange(change, 250_000)],
            "cmp-3": [BudgetChange(start, 500_000), BudgetChange(change, None)],
        },
    )

    def budget(campaign: str, at: int, micros: int | None) -> ChangeEntry:
        return ChangeEntry(
            version=0, kind="set-budget", campaign_id=campaign, effective_from=at, daily_budget_micros=micros
        )

    log = [budget(c, start, 500_000) for c in ("cmp-1", "cmp-2", "cmp-3")]
    log += [budget("cmp-1", change, 750_000), budget("cmp-2", change, 250_000), budget("cmp-3", change, None)]
    log.append(ChangeEntry(version=0, kind="set-price", ad_id="ad-1", effective_from=change))

    def row(campaign: str, at: int) -> dict[str, Any]:
        return {"campaign_id": campaign, "click_time": at}

    rows = [
        row("cmp-1", change - 1),  # before the raise
        row("cmp-1", change),
        row("cmp-1", day + DAY_MS),  # the next day: every budget starts again
        row("cmp-2", change + 5),  # halved: not a raise
        row("cmp-3", day + DAY_MS - 1),
    ]
    # The budgets of the start raise nothing (there was none before); the halved one is not counted.
    assert charged_after_raises(log, catalog, rows) == {f"cmp-1 from {change}": 1, f"cmp-3 from {change}": 1}
    assert charged_after_raises(log, catalog, rows[:1]) == {f"cmp-1 from {change}": 0, f"cmp-3 from {change}": 0}
