"""A click's story over a data folder written by the product's own writers (`ops.bench.stories.write_month`, small):
every click's outcome as its ground truth says, with its day and without, the rows it names, and the stories
following batches written, rewritten in another order and set aside (read from the files: nothing to keep up). The
month's catalog is read from PostgreSQL, which takes in the catalog file the month's writers left in its data folder,
as the product does with a data folder written before its database."""

from __future__ import annotations

import datetime as dt
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from billing.layout import DataLayout
from billing.store.catalog_db import CatalogDatabase
from billing.store.click_story import ClickStories
from billing.store.database import connection_pool
from billing.story import NOT_RECEIVED, BookRow, book_counts, by_price, story_text
from ops.bench.stories import Month, one_more_batch, truth_of, write_month
from ops.postgres_service import LocalPostgres
from tests.conftest import new_database

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class StoredMonth:
    """A month's data folder, and the database its catalog is read from."""

    month: Month
    database: str


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, postgres_server: LocalPostgres) -> Iterator[StoredMonth]:
    month = write_month(tmp_path_factory.mktemp("month"), hours=3, clicks_per_hour=80, batches_per_hour=4, seed=5)
    database = new_database(postgres_server)
    yield StoredMonth(month, database)
    connection_pool(database).close()


@pytest.fixture
def month(stored: StoredMonth) -> Month:
    return stored.month


def stories_of(root: Path, database: str) -> ClickStories:
    layout = DataLayout(root)
    return ClickStories(layout, CatalogDatabase(database, imports=layout.catalog_file))


def test_every_clicks_story_tells_its_ground_truth_and_names_its_rows(month: Month, stored: StoredMonth) -> None:
    stories = stories_of(month.root, stored.database)
    assert stories.catalog.current() == month.catalog  # taken into the database from the month's file
    assert not DataLayout(month.root).catalog_file.exists(), "the file is set aside once taken in"
    told: Counter[str] = Counter()
    for click_id, truth in month.truth.items():
        story = stories.tell(click_id)
        assert truth_of(story) == truth, (click_id, story_text(story))
        told[truth] += 1
        assert [c.status for c in story.copies] == ["stands"]
        if truth in ("charged", "late_click", "known_bot", "ad_paused"):
            assert story.attributed is not None and story.attributed.impression_id == "i" + click_id[1:]
        if story.outcome.closed and truth != "not_billable":
            (row,) = [e for e in story.exports if e.period == story.outcome.period]
            export = pq.read_table(month.root / "exports" / row.period / row.file)
            assert export.column("click_id")[row.row].as_py() == click_id
    assert set(told) == {"charged", "late_click", "known_bot", "ad_paused", "not_billable"}, told


def test_the_why_of_each_kind_of_outcome(month: Month, stored: StoredMonth) -> None:
    stories = stories_of(month.root, stored.database)
    first = {truth: click for click, truth in reversed(list(month.truth.items()))}
    bot = stories.tell(first["known_bot"])
    assert bot.invalid is not None and bot.invalid.bot_pattern and "Googlebot" in story_text(bot)
    paused = stories.tell(first["ad_paused"])
    assert paused.price is not None and paused.price.unbillable == "ad_paused" and paused.price.version == 1
    assert paused.price.change is not None and paused.price.change.kind == "pause"
    late = stories.tell(first["late_click"])
    assert late.copies[0].late and [c.reason for c in late.corrections] == ["late_click"]
    lonely = stories.tell(first["not_billable"])
    assert lonely.attributed is None and lonely.impressions and not lonely.impressions[0].qualifies
    assert "No impression of ad" in story_text(lonely)
    nobody = stories.tell("c-never-sent")
    assert nobody.outcome.status == NOT_RECEIVED and "was ever received" in story_text(nobody)
    # With the click's day (its UTC day): the same story; another day holds none of it.
    for story in (bot, paused, late, lonely):
        day = dt.datetime.fromtimestamp((story.event_time or 0) / 1000, dt.UTC).date()
        assert stories.tell(story.click_id, day) == story
        assert stories.tell(story.click_id, day + dt.timedelta(days=1)).outcome.status == NOT_RECEIVED


def test_the_stories_follow_new_rewritten_and_removed_batches(tmp_path: Path, database: str) -> None:
    month = write_month(tmp_path / "home", hours=2, clicks_per_hour=30, batches_per_hour=2, seed=9)
    stories = stories_of(month.root, database)
    some = next(c for c, t in month.truth.items() if t == "charged")
    assert stories.tell(some).outcome.status == "charged"
    # A new micro-batch: found by the next lookup.
    new = one_more_batch(month.root, month, month.batches)
    assert stories.tell(new).outcome.status == "charged"
    # The batch's archive file rewritten in another row order (a replay): the row is searched for in the file.
    (folder,) = {p.parent for p in (month.root / "archive" / "event_type=click").glob(f"*/batch_id={month.batches}/*")}
    path = next(folder.glob("*.parquet"))
    table = pq.read_table(path)
    pq.write_table(table.take(list(reversed(range(table.num_rows)))), path.with_name(".rewritten"))
    path.with_name(".rewritten").rename(path)
    assert [c.status for c in stories.tell(new).copies] == ["stands"]
    # A batch's folders set aside (a new checkpoint epoch): its click is no longer received.
    for kind in ("archive/event_type=click", "archive/event_type=impression", "ledger"):
        for batch in (month.root / kind).glob(f"*/batch_id={month.batches}"):
            shutil.move(batch, tmp_path / f"aside-{kind.replace('/', '-')}-{batch.parent.name}")
    assert stories.tell(new).outcome.status == NOT_RECEIVED
    assert stories.tell(some).outcome.status == "charged"


def test_the_books_count_a_closed_period_as_exported_and_an_open_one_as_billed_and_corrected() -> None:
    rows = [
        BookRow("a", "ledger", "P1", 100, 1),  # closed: the ledger does not count, the export does
        BookRow("a", "export", "P1", 100, 1),
        BookRow("a", "correction", "P1", 100, -1, booked_period="P2"),  # an adjustment after the close
        BookRow("b", "ledger", "P2", 100, 1),  # open: ledger and corrections
        BookRow("b", "correction", "P2", 100, -1, booked_period="P2"),
        BookRow("b", "correction", "P2", 250, 1, booked_period="P2"),
        BookRow("c", "correction", "P1", 100, 1, booked_period="P1"),  # in the export already
        BookRow("c", "export", "P1", 100, 1),
    ]
    closed = {"P1"}.__contains__
    assert book_counts(rows, closed) == {"a": (0, 0), "b": (1, 250), "c": (1, 100)}
    assert by_price(rows, closed) == [(250, 1), (100, 1)]


def test_clicks_by_price_add_up_to_the_charged_clicks(month: Month, stored: StoredMonth) -> None:
    stories = stories_of(month.root, stored.database)
    ad = Counter(month.ad_of[c] for c, t in month.truth.items() if t in ("charged", "late_click")).most_common(1)[0]
    split = stories.by_price(ad[0], "20260101T0000Z", "20260101T0200Z")
    assert len(split) == 1 and split[0][1] == ad[1]
    assert split[0][0] == month.catalog[ad[0]].price_at(month_start(month))


def month_start(month: Month) -> int:
    from ops.bench.stories import T0

    return T0


def _archive(event_id: str, ad: str, user: str, at: int, received: int, ip: str | None = None) -> dict[str, object]:
    return {"event_id": event_id, "ad_id": ad, "user_id": user, "event_time": at, "received_ms": received,
            "topic": "clicks", "partition": 0, "offset": received, "user_agent": "Mozilla/5.0", "ip": ip,
            "late": False, "batch_id": 1, "period": "20260101T0000Z"}  # fmt: skip


def test_a_flood_an_excluded_range_and_what_another_advertiser_may_not_see() -> None:
    from billing.catalog import Ad, Catalog
    from billing.invalid import ExclusionChange, IpExclusions
    from billing.periods import Periods
    from billing.story import Evidence, for_advertiser, tell

    t0 = 1_767_225_600_000
    catalog = Catalog(
        [Ad("ad-1", "cmp-1", "adv-1", 1_000_000, "EUR"), Ad("ad-9", "cmp-9", "adv-9", 1_000_000, "EUR")],
        exclusions=IpExclusions([ExclusionChange("203.0.113.0/24", t0, True, 0)]),
    )
    # 21 clicks of one user within 20 s, on two advertisers' ads: a flood, every one of them.
    clicks = [_archive(f"f{n:02d}", "ad-1" if n % 2 else "ad-9", "u-flood", t0 + 50_000 + n * 1_000, t0 + 60_000 + n)
              for n in range(21)]  # fmt: skip
    impression = {**_archive("i-1", "ad-1", "u-flood", t0 + 50_500, t0 + 50_600), "event_id": "i-1"}
    evidence = Evidence("f01", copies=[clicks[1]], impressions=[impression], user_clicks=clicks)
    story = tell(evidence, catalog, {}, Periods())
    assert story.invalid is not None and story.invalid.reason == "click_flood" and len(story.invalid.flood) == 21
    assert story.outcome.rule_says == "click_flood"  # no book holds it yet, and the rule says it is invalid
    seen = for_advertiser(story, "adv-1", catalog)
    assert {c.ad_id for c in seen.invalid.flood} == {"ad-1", None}  # type: ignore[union-attr]
    assert {c.click_id for c in seen.invalid.flood if c.ad_id is None} == {None}  # type: ignore[union-attr]
    # An address of the excluded range, from the range's effective time on.
    excluded = _archive("x1", "ad-1", "u-x", t0 + 5_000, t0 + 5_100, ip="203.0.113.9")
    told = tell(Evidence("x1", copies=[excluded], user_clicks=[excluded]), catalog, {}, Periods())
    assert told.invalid is not None and (told.invalid.reason, told.invalid.excluded_range) == (
        "excluded_ip",
        "203.0.113.0/24",
    )
