"""An ad's clicks by price read from the closed periods' price counts (billing.store.price_counts): the answer the
book rows themselves give, for every ad and span, before and after the counts are written, after a correction lands
in a counted period or a later one, and with a counts file that does not read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from billing.corrections import Correction, CorrectionKind, CorrectionReason, correction_id
from billing.layout import DataLayout
from billing.store.click_files import ClickFiles
from billing.store.corrections_arrow import corrections_to_arrow
from billing.story import by_price, by_price_counted
from ops.bench.stories import Month, write_month


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Month:
    return write_month(tmp_path_factory.mktemp("month"), hours=6, clicks_per_hour=60, batches_per_hour=4, seed=7)


@pytest.fixture
def month(written: Month, tmp_path: Path) -> Iterator[Month]:
    """A copy of the month each test may change."""
    import shutil

    root = tmp_path / "data"
    shutil.copytree(written.root, root)
    yield Month(root, written.catalog, written.hours, truth=written.truth, ad_of=written.ad_of)


def raw(files: ClickFiles, ad: str, first: str, last: str) -> list[tuple[int, int]]:
    closed = files.closed_periods()
    return by_price(files.book_rows(first, last, ad_id=ad), closed.__contains__)


def counted(files: ClickFiles, ad: str, first: str, last: str) -> list[tuple[int, int]]:
    closed = files.closed_periods()
    return by_price_counted(files.price_rows(first, last, ad), closed.__contains__)


def spans(files: ClickFiles) -> list[tuple[str, str]]:
    periods = sorted(files.periods())
    return [(periods[0], periods[-1]), (periods[0], periods[0]), (periods[1], periods[3]), (periods[-2], periods[-1])]


def every_answer_agrees(files: ClickFiles, month: Month) -> int:
    """The busiest ads (the paused one among them) and every span, through the counts and from the rows; how many
    answers were not empty."""
    answered = 0
    ads = Counter(month.ad_of.values())
    for ad in sorted({*[a for a, _ in ads.most_common(6)], month.catalog.ad_ids[-1]}):
        for first, last in spans(files):
            expected = raw(files, ad, first, last)
            assert counted(files, ad, first, last) == expected, (ad, first, last)
            answered += bool(expected)
    return answered


def charged_click(month: Month, files: ClickFiles, period: str) -> tuple[str, str, int]:
    """A charged click of `period` with its ad and price, from the period's export."""
    export = pq.read_table(files.export_folder(period) / "billing.parquet").to_pylist()
    row = next(r for r in export if r["record_type"] == "click" and r["status"] != "retracted" and r["click_id"])
    return row["click_id"], row["ad_id"], row["amount_micros"]


def retraction(month: Month, click: str, ad_id: str, amount: int, corrects: str, booked: str) -> Correction:
    ad = month.catalog[ad_id]
    return Correction(
        correction_id(CorrectionKind.RETRACTION, click, corrects, 1),
        CorrectionKind.RETRACTION,
        click,
        None,
        ad_id,
        ad.campaign_id,
        ad.advertiser_id,
        -amount,
        ad.currency,
        CorrectionReason.DUPLICATE,
        corrects,
        booked,
        1,
    )


def test_clicks_by_price_from_the_counts_are_those_of_the_rows_for_every_ad_and_span(month: Month) -> None:
    layout = DataLayout(month.root)
    files = ClickFiles(layout)
    closed = sorted(files.closed_periods())
    assert len(closed) == 4 and len(files.periods()) == 6
    assert every_answer_agrees(files, month) > 10  # nothing counted yet: every period read from its rows

    refresh = files.refresh_filters(closed)
    assert refresh.counted == closed, refresh
    assert "price counts of 4 period(s)" in refresh.describe()
    assert sorted(p.name for p in layout.price_counts.iterdir()) == ["20260101.parquet"]
    assert every_answer_agrees(files, month) > 10
    # The closed periods come from the counts: rows without click ids, some standing for several rows.
    ad = max(set(month.ad_of.values()), key=list(month.ad_of.values()).count)
    rows = files.price_rows(closed[0], closed[-1], ad)
    assert rows and all(row.click_id == "" for row, _ in rows) and any(n > 1 for _, n in rows), rows
    # Nothing changed: a second run writes no counts.
    assert files.refresh_filters(closed).counted == []


def test_a_correction_in_a_counted_period_or_a_later_one_is_counted_from_its_rows(month: Month) -> None:
    layout = DataLayout(month.root)
    files = ClickFiles(layout)
    closed = sorted(files.closed_periods())
    files.refresh_filters(closed)
    first, last = sorted(files.periods())[0], sorted(files.periods())[-1]
    click, ad, amount = charged_click(month, files, closed[0])
    before = counted(files, ad, first, last)

    # A retraction booked later in the counted period's own folder: its counts no longer cover its files.
    folder = layout.corrections_of(closed[0])
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(corrections_to_arrow([retraction(month, click, ad, amount, closed[0], last)]), folder / "x.parquet")
    after = counted(files, ad, first, last)
    assert after == raw(files, ad, first, last) and after != before, (before, after)
    assert dict(before)[amount] - dict(after).get(amount, 0) == 1
    assert every_answer_agrees(files, month) > 10

    # The next run counts that period again; the answer stands.
    assert files.refresh_filters(closed).counted == [closed[0]]
    assert counted(files, ad, first, last) == after
    assert all(row.click_id == "" for row, _ in files.price_rows(closed[0], closed[0], ad))

    # One booked in the open period, against another closed one: read from the open period's rows.
    click2, ad2, amount2 = charged_click(month, files, closed[1])
    folder = layout.corrections_of(last)
    folder.mkdir(parents=True, exist_ok=True)
    later = retraction(month, click2, ad2, amount2, closed[1], last)
    pq.write_table(corrections_to_arrow([later]), folder / "y.parquet")
    assert counted(files, ad2, first, last) == raw(files, ad2, first, last)
    assert every_answer_agrees(files, month) > 10


def test_a_counts_file_that_does_not_read_leaves_the_rows_to_answer(month: Month) -> None:
    layout = DataLayout(month.root)
    files = ClickFiles(layout)
    files.refresh_filters(files.closed_periods())
    layout.price_counts_day("20260101").write_bytes(b"not parquet")
    assert every_answer_agrees(ClickFiles(layout), month) > 10
    # A run writes it anew: it holds no part the reader can use, so every closed period is due again.
    assert len(ClickFiles(layout).refresh_filters(files.closed_periods()).counted) == 4
    assert every_answer_agrees(ClickFiles(layout), month) > 10
