"""A click's story within and past its horizon (`story_days`, `billing.store.click_story.ClickStories`), over a data
folder written with the product's own writers (`write_batch_files` through `tests.batch_files.write_batch`,
`write_export` with its not-charged file) and a clock set by the test: without a day, only the last `story_days`
days are searched and a click older than them gets the plain answer, never "never received"; with its day, a click
past them is told from that day's exports (and the later exports' adjustments of it), as finance was given it; a day
after today, and a setting that is not a positive whole number, are refused."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from billing.catalog import Ad, Catalog
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.click_story import ClickStories
from billing.store.export_files import export_table, not_charged_table, write_export
from billing.story import CHARGED, NOT_CHARGED, NOT_RECEIVED, PAST_HORIZON, describe, for_advertiser, story_text
from ops.bench.stories import MonthCatalog
from ops.settings import Settings
from tests.batch_files import P0, T0, write_batch
from web.click_pages import story_document

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
OLD_DAY = dt.date(2026, 1, 1)  # P0's day: batches 1 to 3, closed and exported
RECENT_MS = T0 + 140 * DAY_MS  # 2026-05-21: batch 20, within the horizon
NOW_MS = T0 + 151 * DAY_MS + 12 * HOUR_MS  # 2026-06-01T12:00Z
SINCE = "2026-02-20"  # 90 days before 2026-05-21, the newest day the folder holds (the clock's day is later)
RECENT = Periods().key_of(RECENT_MS)
LATER = Periods().key_of(RECENT_MS + HOUR_MS)  # the next period, closed: its export adjusts c-2-1
CATALOG = Catalog([Ad("ad-1", "cmp-1", "adv-1", 1_000_000, "EUR")])


def export_row(click_id: str, record_type: str, status: str, booked: str, reason: str | None) -> dict[str, object]:
    """A row of an export (`EXPORT_SCHEMA`) of a click of P0: its click row in P0's export, or an adjustment of it
    booked in a later period's."""
    net = {"billed": 1_000_000, "added": 1_000_000, "retracted": 0 if record_type == "click" else -1_000_000}[status]
    return {
        "record_type": record_type, "click_id": click_id, "impression_id": None, "ad_id": "ad-1",
        "campaign_id": "cmp-1", "advertiser_id": "adv-1", "user_id": "u-0", "click_time": T0 + 1_000,
        "impression_time": None, "amount_micros": 1_000_000, "net_micros": net, "currency": "EUR", "status": status,
        "reason": reason, "correction_id": None if reason is None else f"k-{click_id}", "corrects_period": P0,
        "booked_period": booked,
    }  # fmt: skip


def write_folder(root: Path) -> DataLayout:
    """Day 2026-01-01 (P0, past the horizon): clicks c-1-0 and c-1-1 (batch 1), c-2-0 and c-2-1 (batch 2), c-3-0
    and c-3-1 (batch 3), as the stream wrote them, and P0's export: c-1-0 billed, c-1-1 retracted (duplicate), c-2-0
    not charged (known_bot), c-2-1 billed; day 2026-05-21 (within it): batch 20 (c-20-0, c-20-1), its period open,
    and the next period's export with an adjustment that retracts c-2-1 (duplicate_click)."""
    for batch in (1, 2, 3):
        write_batch(root, batch)
    write_batch(root, 20, RECENT_MS)
    rows = [
        export_row("c-1-0", "click", "billed", P0, None),
        export_row("c-1-1", "click", "retracted", P0, "duplicate"),
        export_row("c-2-1", "click", "billed", P0, None),
    ]
    refused = {**export_row("c-2-0", "click", "billed", P0, None), "reason": "known_bot"}
    write_export(root, P0, export_table(rows), T0, T0 + HOUR_MS, T0 + 2 * HOUR_MS, not_charged_table([refused]))
    later = [export_row("c-2-1", "adjustment", "retracted", LATER, "duplicate_click")]
    start = Periods().start_of(RECENT_MS + HOUR_MS)
    write_export(root, LATER, export_table(later), start, start + HOUR_MS, start + 2 * HOUR_MS)
    return DataLayout(root)


def stories(root: Path, story_days: int | None = 90, now_ms: int = NOW_MS) -> ClickStories:
    return ClickStories(DataLayout(root), MonthCatalog(CATALOG), story_days=story_days, clock=lambda: now_ms)


def test_a_click_within_the_horizon_is_found_without_its_day(tmp_path: Path) -> None:
    write_folder(tmp_path)
    story = stories(tmp_path).tell("c-20-0")
    assert (story.outcome.status, story.outcome.amount_micros, story.outcome.period) == (CHARGED, 1_000_000, RECENT)
    assert story.searched is not None
    assert (story.searched.since, story.searched.story_days, story.searched.past_horizon) == (SINCE, 90, False)
    assert story.copies and story.stream, "the whole story: its copies and its live bill"
    assert story_document(story)["searched"]["from_exports"] is False


def test_a_click_older_than_the_horizon_without_its_day_gets_the_plain_answer(tmp_path: Path) -> None:
    write_folder(tmp_path)
    story = stories(tmp_path).tell("c-1-0")
    assert story.outcome.status == PAST_HORIZON and not story.received
    assert story.searched is not None and story.searched.past_horizon and not story.searched.from_exports
    (why,) = describe(story)
    assert f"not among the clicks of the last 90 days (from {SINCE}, UTC)" in why
    assert "--day YYYY-MM-DD" in why and "?day=" in why
    assert "never received" not in story_text(story).lower()
    # The horizon is what hides it: with a longer one, or none, its whole story.
    assert stories(tmp_path, story_days=200).tell("c-1-0").outcome.status == CHARGED
    assert stories(tmp_path, story_days=None).tell("c-1-0").outcome.status == CHARGED
    # A later export's adjustment of an older click, found within the horizon, names the click's day.
    adjusted = stories(tmp_path).tell("c-2-1")
    assert adjusted.outcome.status == PAST_HORIZON and adjusted.advertiser_id == "adv-1"
    assert [(e.period, e.record_type, e.corrects_period) for e in adjusted.exports] == [(LATER, "adjustment", P0)]
    assert any("its day 2026-01-01" in line for line in describe(adjusted))
    # An id that is nowhere, in a folder that holds nothing older than the horizon: never received, certainly.
    fresh = tmp_path / "fresh"
    write_batch(fresh, 20, RECENT_MS)
    nowhere = stories(fresh).tell("c-404")
    assert nowhere.outcome.status == NOT_RECEIVED
    assert describe(nowhere) == ["No click with the id c-404 was ever received."]
    assert stories(tmp_path).tell("c-404").outcome.status == PAST_HORIZON


def test_a_click_older_than_the_horizon_with_its_day_is_told_from_that_days_exports(tmp_path: Path) -> None:
    write_folder(tmp_path)
    told = {click: stories(tmp_path).tell(click, OLD_DAY) for click in ("c-1-0", "c-1-1", "c-2-0", "c-2-1")}
    assert {c: (s.outcome.status, s.outcome.reason, s.outcome.amount_micros) for c, s in told.items()} == {
        "c-1-0": (CHARGED, None, 1_000_000),
        "c-1-1": (NOT_CHARGED, "duplicate", 0),
        "c-2-0": (NOT_CHARGED, "known_bot", 0),
        "c-2-1": (NOT_CHARGED, "duplicate_click", 0),  # billed in P0's export, retracted by a later adjustment
    }
    for story in told.values():
        assert story.searched is not None and story.searched.from_exports and story.searched.past_horizon
        assert story.outcome.closed and story.outcome.period == P0 and story.received
        assert not story.copies and not story.stream and not story.impressions, "click-level detail: not read"
        assert (story.advertiser_id, story.ad_id, story.event_time) == ("adv-1", "ad-1", T0 + 1_000)
        assert any("Told from the finance exports only" in line for line in describe(story))
        assert not any("impression" in line.lower() and "no impression" in line.lower() for line in describe(story))
    assert told["c-1-0"].outcome.settled_by == "export" and told["c-2-1"].outcome.settled_by == "adjustment"
    assert [(e.period, e.file, e.record_type) for e in told["c-2-1"].exports] == [
        (P0, "billing.parquet", "click"),
        (LATER, "billing.parquet", "adjustment"),
    ]
    assert [(e.file, e.reason) for e in told["c-2-0"].exports] == [("not_charged.parquet", "known_bot")]
    document = story_document(told["c-1-0"])
    assert document["searched"]["from_exports"] is True and document["searched"]["day"] == "2026-01-01"
    assert document["outcome"]["amount_micros"] == "1000000" and document["received"] is True
    # An advertiser sees its own click's export answer; another's story holds none of it (the doors answer 404).
    assert for_advertiser(told["c-2-1"], "adv-1", CATALOG).exports == told["c-2-1"].exports
    assert for_advertiser(told["c-2-1"], "adv-2", CATALOG).exports == ()


def test_a_day_past_the_horizon_whose_exports_do_not_name_the_click_says_so(tmp_path: Path) -> None:
    write_folder(tmp_path)
    # c-3-0 lies in P0's click-level files, but P0's export does not name it: past the horizon, not read.
    for click in ("c-3-0", "c-404"):
        story = stories(tmp_path).tell(click, OLD_DAY)
        assert story.outcome.status == PAST_HORIZON and not story.received and not story.exports
        (why,) = describe(story)
        assert why.startswith(
            f"2026-01-01 is past the 90-day horizon of click-level detail (story_days), and that day's exports "
            f"(1 period(s) exported) do not name click {click}: "
        )
        assert "not a click the attribution rule does not bill" in why
    unexported = stories(tmp_path).tell("c-1-0", dt.date(2026, 1, 5))
    assert unexported.outcome.status == PAST_HORIZON
    assert "holds no export of that day" in describe(unexported)[0]


def test_a_day_within_the_horizon_reads_that_day_and_a_day_after_today_is_refused(tmp_path: Path) -> None:
    write_folder(tmp_path)
    on_its_day = stories(tmp_path).tell("c-20-0", dt.date(2026, 5, 21))
    assert on_its_day.outcome.status == CHARGED and on_its_day.copies
    assert on_its_day.searched is not None and not on_its_day.searched.from_exports
    wrong_day = stories(tmp_path).tell("c-20-0", dt.date(2026, 5, 22))
    assert wrong_day.outcome.status == NOT_RECEIVED
    said = "No click with the id c-20-0 was received on 2026-05-22 (UTC): that day was searched."
    assert describe(wrong_day) == [said]
    assert stories(tmp_path).tell("c-20-0", dt.date(2026, 6, 1)).outcome.status == NOT_RECEIVED  # today: allowed
    with pytest.raises(ValueError, match=r"2026-06-02 is after today \(2026-06-01, UTC\)"):
        stories(tmp_path).tell("c-20-0", dt.date(2026, 6, 2))


def test_the_horizon_counts_back_from_the_newest_day_the_folder_holds_not_from_a_later_clock(tmp_path: Path) -> None:
    """Recorded traffic, or a folder whose stream stopped long ago: its last `story_days` days are told in full."""
    for batch in (1, 2, 3):
        write_batch(tmp_path, batch)  # 2026-01-01 only
    years_later = T0 + 800 * DAY_MS
    story = stories(tmp_path, now_ms=years_later).tell("c-2-1")
    assert story.outcome.status == CHARGED and story.copies, "the whole story, as the stream wrote it"
    assert story.searched is not None and story.searched.since == "2025-10-03" and not story.searched.past_horizon
    live = stories(tmp_path, now_ms=T0 + 12 * HOUR_MS)  # the clock on the folder's newest day: the same horizon
    assert live.searched().since == "2025-10-03"
    write_batch(tmp_path, 20, RECENT_MS)  # a newer day in the folder moves the horizon with it
    assert stories(tmp_path, now_ms=years_later).tell("c-2-1").outcome.status == PAST_HORIZON


@pytest.mark.parametrize("raw", ["0", "-1", "x", "1.5", ""])
def test_a_story_days_that_is_not_a_positive_whole_number_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="ADBILL_STORY_DAYS") as refused:
        Settings.from_env({"ADBILL_STORY_DAYS": raw})
    assert "\n" not in str(refused.value)
    assert Settings.from_env({"ADBILL_STORY_DAYS": "30"}).story_days == 30
    assert Settings.from_env({}).story_days == 90
