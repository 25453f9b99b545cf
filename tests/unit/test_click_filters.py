"""The day filters of click ids (billing.store.click_filters) and the finder reading through them
(billing.store.click_files): never another answer than the files give, fewer files read."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from billing.store import click_files
from billing.store.click_files import ClickFiles
from billing.store.click_filters import DayFilter, block_of, bloom_blocks, hash_ids, may_hold
from billing.store.corrections_arrow import CORRECTION_SCHEMA
from tests.unit.test_click_files import P0, P1, P2, scanned, write_data

DAY1, DAY2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
IDS = [f"c-{batch}-{task}" for batch in range(1, 10) for task in (0, 1)]


def correction(click_id: str) -> pa.Table:
    row = {
        "correction_id": f"k-{click_id}", "kind": "addition", "click_id": click_id, "impression_id": "i-x",
        "ad_id": "ad-1", "campaign_id": "cmp-1", "advertiser_id": "adv-1", "amount_micros": 1_000_000,
        "currency": "EUR", "reason": "late_click", "corrects_period": P0, "booked_period": P2, "created_at_ms": 1,
    }  # fmt: skip
    return pa.Table.from_pylist([row], schema=CORRECTION_SCHEMA)


def test_a_filter_holds_every_id_given_and_few_others() -> None:
    ids = pa.array([f"click-{n}" for n in range(20_000)])
    words = bloom_blocks(ids)
    blocks = len(words)
    raw = words.tobytes()

    def holds(click_id: str) -> bool:
        block = block_of(blocks, click_id)
        return may_hold(raw[block * 32 : block * 32 + 32], blocks, click_id)

    assert all(holds(f"click-{n}") for n in range(0, 20_000, 7))
    false_positives = sum(holds(f"other-{n}") for n in range(20_000))
    assert false_positives < 20_000 * 0.01, false_positives  # about 0.3 % at 12 bits an id
    assert words.nbytes <= 20_000 * 12 / 8 + 32
    # The hash is stable (it is in the files): the same value in every process, and nulls are left out.
    assert hash_ids(pa.array(["a", None, "a"])).tolist() == [hash_ids(pa.array(["a"])).tolist()[0]] * 2


def test_the_finder_reads_the_same_rows_through_the_filters_and_fewer_files(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    refresh = files.refresh_filters(files.closed_periods())
    assert refresh.written == [P0, P2] and refresh.hashed > 0 and refresh.waiting == []
    assert sorted(p.name for p in layout.click_day_filters.iterdir()) == ["20260101.bloom", "20260102.bloom"]
    assert set(DayFilter(layout.click_day_filter("20260101")).parts) == {P0}  # P1 is open: no part
    for click_id in [*IDS, "c-404"]:
        expected = scanned(layout, click_id)
        assert files.rows_of(click_id) == expected, click_id
        assert files.rows_of(click_id, DAY2 if click_id.startswith("c-9-") else DAY1) == expected, click_id
    assert {r.kind for r in files.rows_of("c-3-0", DAY2)} == {"export", "quarantine"}
    # An id the closed period does not hold reads none of its files; one it holds reads them all.
    ledger = files._lister("ledger", [P0], files._skips([P0], "c-404"))
    assert files.files("ledger", P0) and ledger() == []
    assert files._lister("ledger", [P0], files._skips([P0], "c-2-1"))() == files.files("ledger", P0)
    # Up to date: nothing written again.
    again = files.refresh_filters(files.closed_periods())
    assert (again.written, again.hashed, again.describe()) == ([], 0, "click filters: up to date")
    assert files.stale_filters([P0, P2]) == []


def test_a_file_the_filter_does_not_cover_is_read_whatever_it_says(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    files.refresh_filters(files.closed_periods())
    # A correction booked to the closed period after its filter was written: not covered, read.
    pq.write_table(correction("c-late"), layout.corrections_of(P0) / "run-2.parquet")
    assert [(r.kind, r.period) for r in files.rows_of("c-late", DAY1)] == [("correction", P0)]
    assert [(r.kind, r.period) for r in files.rows_of("c-late")] == [("correction", P0)]
    assert files.stale_filters([P0, P2]) == [P0]
    # A covered file rewritten in place (another size and time): read again too.
    run1 = layout.corrections_of(P0) / "run-1.parquet"
    pq.write_table(pa.concat_tables([pq.read_table(run1), correction("c-moved")]), run1)
    os.utime(run1, ns=(1, 1))
    assert [r.kind for r in files.rows_of("c-moved", DAY1)] == ["correction"]
    # The next run writes the part again: it covers both files, and still finds them.
    assert files.refresh_filters(files.closed_periods()).written == [P0]
    covers = DayFilter(layout.click_day_filter("20260101")).parts[P0].covers
    assert {Path(key).name for key in covers} >= {"run-1.parquet", "run-2.parquet"}
    assert [r.kind for r in files.rows_of("c-late", DAY1)] == ["correction"]
    assert [r.kind for r in files.rows_of("c-moved", DAY1)] == ["correction"]


def test_a_day_file_that_does_not_read_is_passed_over(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    files.refresh_filters(files.closed_periods())
    layout.click_day_filter("20260101").write_bytes(b"not a filter")
    assert files.filters.of("20260101") is None
    for click_id in ["c-3-0", "c-2-1", "c-404"]:
        assert files.rows_of(click_id, DAY1) == scanned(layout, click_id)
    # Written again whole by the next run, the other day's file untouched.
    before = layout.click_day_filter("20260102").read_bytes()
    assert files.refresh_filters(files.closed_periods()).written == [P0]
    assert DayFilter(layout.click_day_filter("20260101")).parts.keys() == {P0}
    assert layout.click_day_filter("20260102").read_bytes() == before


def test_a_period_whose_batch_files_are_not_compacted_yet_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    monkeypatch.setattr(click_files, "FILTER_MAX_FILES", 3)
    assert len(files.filter_files(P0)) > 3
    refresh = files.refresh_filters(files.closed_periods())
    assert refresh.written == [] and refresh.waiting == [P0, P2]  # P1 is open: neither written nor waiting
    assert refresh.describe().endswith(f"2 closed period(s) wait for their compaction, the oldest {P0}")
    assert files.rows_of("c-3-0", DAY1) == scanned(layout, "c-3-0")


def test_a_part_written_again_keeps_the_days_other_parts(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    files.write_filters([P0])
    first = DayFilter(layout.click_day_filter("20260101"))
    files.write_filters([P1])  # another period of the same day (as when it closes later)
    both = DayFilter(layout.click_day_filter("20260101"))
    assert set(both.parts) == {P0, P1}
    assert both.part_words(P0) == first.part_words(P0) and both.parts[P0].covers == first.parts[P0].covers
    for click_id in ["c-8-0", "c-3-0", "c-404"]:
        assert files.rows_of(click_id, DAY1) == scanned(layout, click_id)


def test_a_file_that_does_not_read_is_left_uncovered_and_read_as_it_is(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    broken = layout.corrections_of(P0) / "run-9.parquet"
    broken.write_bytes(b"PAR1 not parquet")
    assert P0 in files.refresh_filters(files.closed_periods()).written
    covers = DayFilter(layout.click_day_filter("20260101")).parts[P0].covers
    assert not any(key.endswith("run-9.parquet") for key in covers) and covers
    assert files.stale_filters([P0]) == [P0]  # it stays a file to read, and to cover once it reads
