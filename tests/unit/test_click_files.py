"""The click finder over the data folder's Parquet files (`billing.store.click_files`), on files written as the stream
writes them (`write_batch_files`), a closed period compacted (`billing.store.compaction`), a correction, two exports
(the click's own and a later one's adjustment) and a quarantined copy: every row that names a click (as a scan of
every file finds them), found with the click's day and without it (newest day first), the books of a campaign, the
archive's files of a window, and a compaction between a listing and its reading or stopped mid-way."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from attribution.batch_output import write_batch_files
from attribution.decode import QUARANTINE_COLUMNS
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.click_files import ClickFiles, Located, read_located
from billing.store.compaction import compact_closed, compactable_through, live_files
from billing.store.corrections_arrow import CORRECTION_SCHEMA
from billing.store.export_files import export_table, write_export
from tests.batch_files import T0, compact_ledger_stopped_at, write_batch

DAY_MS = 86_400_000
P0, P1, P2 = "20260101T0000Z", "20260101T0100Z", "20260102T0000Z"
HOUR_MS = 3_600_000


def export_row(click_id: str, record_type: str, status: str, corrects: str, booked: str) -> dict[str, object]:
    click = record_type == "click"
    return {
        "record_type": record_type, "click_id": click_id, "impression_id": None, "ad_id": "ad-1",
        "campaign_id": "cmp-1", "advertiser_id": "adv-1", "user_id": "u-0" if click else None,
        "click_time": T0 + 3_000 if click else None, "impression_time": None, "amount_micros": 1_000_000,
        "net_micros": 1_000_000 if status != "retracted" else (0 if click else -1_000_000), "currency": "EUR",
        "status": status, "reason": None if status != "retracted" else "duplicate",
        "correction_id": None if status != "retracted" else "k-1", "corrects_period": corrects, "booked_period": booked,
    }  # fmt: skip


def write_data(root: Path) -> DataLayout:
    """Day 1: batches 1 to 7 in P0 (closed, compacted up to 6), batch 8 in P1; day 2: batch 9 in P2. Click c-3-0
    is retracted by a correction booked in P2 (its adjustment in P2's export) and has a bad copy in quarantine."""
    layout = DataLayout(root)
    for batch in range(1, 8):
        write_batch(root, batch)
    write_batch(root, 8, T0 + HOUR_MS)
    write_batch(root, 9, T0 + DAY_MS)
    correction = {
        "correction_id": "k-1", "kind": "retraction", "click_id": "c-3-0", "impression_id": "i-3-0", "ad_id": "ad-1",
        "campaign_id": "cmp-1", "advertiser_id": "adv-1", "amount_micros": -1_000_000, "currency": "EUR",
        "reason": "duplicate", "corrects_period": P0, "booked_period": P2, "created_at_ms": T0 + DAY_MS,
    }  # fmt: skip
    layout.corrections_of(P0).mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([correction], schema=CORRECTION_SCHEMA), layout.corrections_of(P0) / "run-1.parquet"
    )
    own = [export_row("c-3-0", "click", "retracted", P0, P0), export_row("c-2-1", "click", "billed", P0, P0)]
    write_export(root, P0, export_table(own), T0, T0 + HOUR_MS, T0 + 2 * HOUR_MS)
    later = [export_row("c-3-0", "adjustment", "retracted", P0, P2)]
    write_export(root, P2, export_table(later), T0 + DAY_MS, T0 + DAY_MS + HOUR_MS, T0 + DAY_MS + 2 * HOUR_MS)
    bad = dict.fromkeys(QUARANTINE_COLUMNS) | {"reason": "schema", "topic": "clicks", "event_id": "c-3-0"}
    write_batch_files(pa.Table.from_pylist([bad | {"batch_id": 5}]), layout.quarantine, ("batch_id",))
    report = compact_closed(layout, [P0], compactable_through(9, 9))
    assert report.periods == 3, report.describe()
    return layout


def scanned(layout: DataLayout, click_id: str) -> list[Located]:
    """Every row of every live file of the data folder that names `click_id`, read whole with pyarrow."""
    kinds = [
        ("archive_click", "event_id", live_files(layout.archive_of("click"), 2)),
        ("ledger", "click_id", live_files(layout.ledger, 2)),
        ("unbilled", "click_id", live_files(layout.unbilled, 2)),
        ("not_charged", "click_id", live_files(layout.not_charged, 2)),
        ("quarantine", "event_id", live_files(layout.quarantine, 1)),
        ("correction", "click_id", sorted(layout.corrections.glob("period=*/*.parquet"))),
        ("export", "click_id", sorted(layout.exports.glob("*/billing.parquet"))),
    ]
    found = []
    for kind, column, paths in kinds:
        for path in paths:
            for row, value in enumerate(pq.read_table(path, columns=[column]).column(column).to_pylist()):
                if value == click_id:
                    period = next((p[7:] for p in path.parts if p.startswith("period=")), path.parent.name)
                    batch = next((int(p[9:]) for p in path.parts if p.startswith("batch_id=")), None)
                    found.append(Located(click_id, kind, path, row, period if kind != "quarantine" else None, batch))
    return sorted(found, key=lambda item: (str(item.path), item.row))


def test_a_clicks_rows_with_its_day_and_without_are_every_row_that_names_it(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    assert files.refresh()
    assert files.periods() == [P2, P1, P0]
    ids = [f"c-{batch}-{task}" for batch in range(1, 10) for task in (0, 1)]
    for click_id in ids:  # without the day, and with it: every row a scan of every file finds
        expected = scanned(layout, click_id)
        day = dt.date(2026, 1, 2 if click_id.startswith("c-9-") else 1)
        assert files.rows_of(click_id) == expected, click_id
        assert files.rows_of(click_id, day) == expected, click_id
    rows = read_located(files.rows_of("c-3-0", dt.date(2026, 1, 1)))
    kinds = sorted((r["found_in"], r.get("period"), r["batch_id"], Path(r["file"]).name) for r in rows)
    assert kinds == [
        ("archive_click", P0, 3, "compacted-1-6.parquet"),  # the compacted file, each row with its own batch
        ("correction", P0, None, "run-1.parquet"),
        ("export", P0, None, "billing.parquet"),
        ("export", P2, None, "billing.parquet"),  # the later export's adjustment
        ("ledger", P0, 3, "compacted-1-6.parquet"),
        ("quarantine", None, 5, "part-00000.parquet"),
    ]
    # The wrong day: the later export's adjustment and the quarantine's copy only; an id that is nowhere: nothing.
    assert {r.kind for r in files.rows_of("c-3-0", dt.date(2026, 1, 2))} == {"export", "quarantine"}
    assert files.rows_of("c-404") == [] and files.rows_of("c-404", dt.date(2026, 1, 1)) == []
    # A late batch of the compacted period stays as written and is read beside the compacted file.
    write_batch(tmp_path, 10)
    assert files.rows_of("c-10-0") == scanned(layout, "c-10-0") != []
    assert len(files.rows_of("c-10-0")) == 2 and all(item.batch_id == 10 for item in files.rows_of("c-10-0"))


def test_the_books_of_a_campaign_and_the_archive_of_a_window(tmp_path: Path) -> None:
    layout = write_data(tmp_path)
    files = ClickFiles(layout)
    kinds = {
        (P0, P0): {"ledger": 14, "correction": 1, "export": 2},  # the later export's adjustment is not a click row
        (P0, P2): {"ledger": 18, "correction": 1, "export": 2},
        (P1, P2): {"ledger": 4},
    }
    for (first, last), counts in kinds.items():
        for kwargs in ({"campaign_id": "cmp-1"}, {"ad_id": "ad-1"}):
            rows = files.book_rows(first, last, **kwargs)
            assert Counter(r.kind for r in rows) == counts, (first, last, kwargs)
            assert all(first <= r.period <= last for r in rows)
        assert files.book_rows(first, last, campaign_id="cmp-2") == []
    books = files.book_rows(P0, P0, campaign_id="cmp-1")
    assert sorted((r.kind, r.sign) for r in books if r.click_id == "c-3-0") == [
        ("correction", -1),
        ("export", 0),
        ("ledger", 1),
    ]
    assert next(r.click_time for r in books if r.kind == "correction") == T0 + 3_000  # from the archive
    assert files.closed_periods() == {P0, P2}
    assert files.manifest_path(P0) == layout.export(P0) / "manifest.json"
    assert files.export_folder(P0) == layout.export(P0)
    # The archive's files of a window: pruned by their statistics, the compacted file standing for its batches.
    clicks = layout.archive_of("click") / f"period={P0}"
    every = [clicks / "batch_id=6" / "compacted-1-6.parquet", clicks / "batch_id=7" / "part-00001.parquet"]
    every.insert(1, clicks / "batch_id=7" / "part-00000.parquet")
    assert files.archive_files("archive_click", [P0], T0, T0 + HOUR_MS) == every
    assert files.archive_files("archive_click", [P0], T0 + 7_000, T0 + 7_000) == every[1:2]
    assert files.archive_files("archive_click", [P1, P2], T0, T0 + HOUR_MS) == []
    window = Periods().range_keys(T0, T0 + 2 * HOUR_MS)
    impressions = [p for p in live_files(layout.archive_of("impression"), 2) if P2 not in str(p)]
    assert files.archive_files("archive_impression", window, T0, T0 + 2 * HOUR_MS) == impressions
    assert len(impressions) == 5  # P0's compacted file and its batch 7's two files, P1's two


def test_a_compaction_between_the_listing_and_the_reading_lists_again(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in range(1, 8):
        write_batch(tmp_path, batch)
    files = ClickFiles(layout)
    folder = layout.ledger / f"period={P0}"
    listings: list[list[Path]] = []

    def listed() -> list[Path]:
        listing = live_files(folder, depth=1)
        if not listings:  # the first listing is overtaken by a compaction before it is read
            compact_closed(layout, [P0], compactable_through(9, 9))
        listings.append(listing)
        return listing

    found = files._located("ledger", listed, "c-2-1")
    assert len(listings) == 2 and len(listings[0]) == 7 and [p.name for p in listings[1]][0] == "compacted-1-6.parquet"
    assert [(item.path.name, item.batch_id) for item in found] == [("compacted-1-6.parquet", 6)]
    assert [r["batch_id"] for r in read_located(found)] == [2]


def test_a_compaction_stopped_after_its_rename_is_read_once(tmp_path: Path) -> None:
    """The compacted file in place and the batch files it holds not removed yet: each row is found once, in it."""
    layout = DataLayout(tmp_path)
    for batch in range(1, 6):
        write_batch(tmp_path, batch)
    compact_ledger_stopped_at(layout, "renamed")
    assert len(list((layout.ledger / f"period={P0}").glob("*/*.parquet"))) == 6  # batches 1 to 5, and 1 to 4 compacted
    found = ClickFiles(layout).rows_of("c-2-1")
    assert [(item.kind, item.path.name) for item in found] == [
        ("archive_click", "part-00001.parquet"),
        ("ledger", "compacted-1-4.parquet"),
    ]
    assert found == scanned(layout, "c-2-1")
