"""The two readers of an open period's batch files that take no run lock, while the open pass compacts them
(`billing.store.compaction.compact_open`): the stream's recent clicks after a start (`attribution.charging.
recent_clicks`, the archive's clicks) and the web's list of clicks not charged (`billing.store.not_charged_clicks`,
`not_charged/`). On files written as the stream writes them: the same rows, each once, before the pass, with the
compacted file in place beside the batch files it holds (a pass stopped after its rename, as a reader may meet it
mid-pass), after the pass, and when a pass removes a file between a reader's listing and its reading; the stream's
other readers of the whole archive (a new epoch's `offsets_read`, a release's `copy_periods`) list again too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from attribution.batch_output import write_batch_files
from attribution.charging import NOT_CHARGED_ROWS, recent_clicks
from attribution.epoch import offsets_read
from attribution.release import copy_periods
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store import compaction
from billing.store.compaction import KINDS, CompactionReport, compact_open, open_periods
from billing.store.not_charged_clicks import NotChargedClick, not_charged_by_stream, not_charged_clicks, stream_rows
from billing.store.parquet_ledger import LEDGER_SCHEMA
from ops.reconcile import ReconcileConfig, run_lock
from tests.batch_files import P0, T0, stopped_at, write_batch

HOUR = 3_600_000
NOT_CHARGED_SCHEMA = pa.schema(
    [("reason", pa.string()) if name == "reason" else LEDGER_SCHEMA.field(name) for name in NOT_CHARGED_ROWS]
)


def write_not_charged(root: Path, batch: int, replayed: tuple[str, ...] = (), period_start: int = T0) -> None:
    """Batch `batch`'s `not_charged/` file as the stream writes it (the partition columns in the path): a click of
    adv-1 (a duplicate click) and one of adv-2 (over budget), and again the clicks `replayed` of adv-1 (a replay's
    copy of an earlier batch's row)."""
    periods = Periods()
    rows = []
    for task, click_id, advertiser, reason in (
        *((0, f"n-{batch}-0", "adv-1", "duplicate_click"), (1, f"n-{batch}-1", "adv-2", "over_budget")),
        *((0, again, "adv-1", "duplicate_click") for again in replayed),
    ):
        at = period_start + batch * 1_000 + task
        rows.append(
            {
                "click_id": click_id, "impression_id": f"i-{click_id}", "ad_id": "ad-1", "campaign_id": "cmp-1",
                "advertiser_id": advertiser, "user_id": f"u-{task}", "click_time": at, "impression_time": at - 5,
                "amount_micros": 1_000_000, "currency": "EUR", "click_received_ms": at, "reason": reason,
                "billed_at_ms": at + 100, "period_start_ms": periods.start_of(at), "period": periods.key_of(at),
                "batch_id": batch,
            }
        )  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=NOT_CHARGED_SCHEMA)
    write_batch_files(table, DataLayout(root).not_charged, ("period", "batch_id"), prune=False)


def open_pass(layout: DataLayout, through: int) -> CompactionReport:
    """A pass over the open periods of every kind (the two readers' kinds among them), up to batch `through`."""
    return compact_open(layout, open_periods(layout, [], KINDS), through, KINDS)


def listed_list(layout: DataLayout, advertiser: str = "adv-1") -> list[NotChargedClick]:
    return not_charged_clicks(layout, Periods(), advertiser, T0, T0 + HOUR)


def not_charged_rows(layout: DataLayout) -> Counter[tuple[str, str]]:
    """(click, reason) of every row of the open period's `not_charged/` files as the list reads them, counted."""
    table = stream_rows(layout.not_charged, [P0], ["click_id", "reason"])
    return Counter(zip(table["click_id"].to_pylist(), table["reason"].to_pylist(), strict=True))


def recent(root: Path, before: int = 100, first: int | None = None, floor: int | None = None) -> Counter[tuple]:  # type: ignore[type-arg]
    """The archive's clicks the stream's recent clicks read after a start, counted."""
    table = recent_clicks(DataLayout(root).archive_of("click"), Periods(), before, first, floor)
    columns = [table[c].to_pylist() for c in table.column_names]
    return Counter(zip(*columns, strict=True))


def overtaking(layout: DataLayout, through: int) -> tuple[list[list[Path]], Callable[[Path, int], list[Path]]]:
    """A listing of the batch folders that an open pass (up to `through`) overtakes the first time: the files it
    listed are gone when they are read. The listings made, and the listing to use as `compaction.live_files`."""
    listings: list[list[Path]] = []
    real = compaction.live_files

    def listed(root: Path, depth: int = 2) -> list[Path]:
        files = real(root, depth)
        if not listings:
            open_pass(layout, through)
        listings.append(files)
        return files

    return listings, listed


def test_the_not_charged_list_reads_each_row_once_while_its_open_period_is_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = DataLayout(tmp_path)
    for batch in range(1, 8):
        write_not_charged(tmp_path, batch, ("n-4-0",) if batch == 5 else ())
    assert open_periods(layout, [], KINDS) == [P0]
    listed, rows, refused = listed_list(layout), not_charged_rows(layout), not_charged_by_stream(layout, [P0])
    assert len(listed) == 7 and [c.click_id for c in listed][:2] == ["n-7-0", "n-6-0"]
    assert not any(c.final for c in listed) and {c.advertiser_id for c in listed} == {"adv-1"}
    assert sum(rows.values()) == 15 and rows[("n-4-0", "duplicate_click")] == 2  # the replay's copy too
    others = listed_list(layout, "adv-2")
    assert len(others) == 7 and {c.reason for c in others} == {"over_budget"}

    # An open pass stopped after its rename: the compacted file (batches 1 to 5) beside the batch files it holds.
    stopped_at("renamed", lambda: open_pass(layout, 5))
    period = layout.not_charged / f"period={P0}"
    assert sorted(p.relative_to(period).as_posix() for p in period.rglob("*.parquet")) == [
        *(f"batch_id={b}/part-00000.parquet" for b in range(1, 5)),
        "batch_id=5/compacted-1-5.parquet",
        "batch_id=5/part-00000.parquet",
        *(f"batch_id={b}/part-00000.parquet" for b in (6, 7)),
    ]
    assert not_charged_rows(layout) == rows
    assert listed_list(layout) == listed and listed_list(layout, "adv-2") == others
    assert not_charged_by_stream(layout, [P0]) == refused

    # Finished by the next holder of the lock: the same.
    with run_lock(ReconcileConfig(data_dir=tmp_path, redis_url="", redis_prefix="")):
        pass
    assert sorted(p.name for p in period.iterdir()) == ["batch_id=5", "batch_id=6", "batch_id=7"]
    assert not_charged_rows(layout) == rows and listed_list(layout) == listed
    assert not_charged_by_stream(layout, [P0]) == refused

    # A pass that removes the files the list has listed before it reads them: it lists again, each row once.
    for batch in range(8, 11):
        write_not_charged(tmp_path, batch)
    grown = listed_list(layout)
    listings, listed_by = overtaking(layout, 8)
    monkeypatch.setattr(compaction, "live_files", listed_by)
    assert listed_list(layout) == grown and len(grown) == 10
    assert len(listings) == 2 and "compacted-6-8.parquet" in {p.name for p in listings[1]}  # the batches since
    monkeypatch.undo()
    assert sorted(p.name for p in period.iterdir()) == ["batch_id=10", "batch_id=5", "batch_id=8", "batch_id=9"]


def test_the_streams_recent_clicks_are_read_once_each_with_their_own_batch_while_their_period_is_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = DataLayout(tmp_path)
    for batch in range(1, 8):
        write_batch(tmp_path, batch)
    write_batch(tmp_path, 8, T0 - HOUR)  # a click of the hour before (a late event), in batch 8
    floor = T0 + 2_000  # the flood window behind a watermark: the clicks from batch 2 on, not the hour before
    # What the reader asks, by the batches it runs after a start and the checkpoint's first batch (a new epoch).
    asks = [(100, None, None), (9, None, floor), (4, None, None), (6, 3, None), (100, 5, floor)]
    before = {ask: recent(tmp_path, *ask) for ask in asks}
    assert sum(before[(100, None, None)].values()) == 16 and max(before[(100, None, None)].values()) == 1
    assert {row[0] for row in before[(9, None, floor)]} == {f"c-{b}-{t}" for b in range(2, 8) for t in (0, 1)}
    assert {row[0] for row in before[(4, None, None)]} == {f"c-{b}-{t}" for b in range(1, 4) for t in (0, 1)}
    assert {row[0] for row in before[(6, 3, None)]} == {f"c-{b}-{t}" for b in range(3, 6) for t in (0, 1)}

    # An open pass stopped after its rename (the archive's clicks are the pass's first kind): the compacted file
    # of batches 1 to 5 beside the batch files it holds. Each row once, by the batch that wrote it (not 5, its
    # folder's: the reader that asks for the batches before 4, or from 3 on, gets those alone).
    stopped_at("renamed", lambda: open_pass(layout, 5))
    period = layout.archive_of("click") / f"period={P0}"
    assert (period / "batch_id=5" / "compacted-1-5.parquet").is_file()
    assert len(list(period.glob("batch_id=[1-4]/*.parquet"))) == 8
    assert {ask: recent(tmp_path, *ask) for ask in asks} == before

    # Finished by the next holder of the lock: the same.
    with run_lock(ReconcileConfig(data_dir=tmp_path, redis_url="", redis_prefix="")):
        pass
    assert sorted(p.name for p in period.iterdir()) == ["batch_id=5", "batch_id=6", "batch_id=7"]
    assert {ask: recent(tmp_path, *ask) for ask in asks} == before

    # A pass that removes the files the reader has listed before it reads them: it lists again, each row once.
    listings, listed_by = overtaking(layout, 7)
    monkeypatch.setattr(compaction, "live_files", listed_by)
    assert recent(tmp_path) == before[(100, None, None)]
    assert len(listings) == 2 and "compacted-6-7.parquet" in {p.name for p in listings[1]}  # the batches since
    monkeypatch.undo()
    assert sorted(p.name for p in period.iterdir()) == ["batch_id=5", "batch_id=7"]
    assert {ask: recent(tmp_path, *ask) for ask in asks} == before


def test_a_new_epochs_offsets_and_a_releases_copies_list_again_when_an_open_pass_removes_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's readers of the whole archive (no lock): a file an open pass removes between their listing and
    their reading makes them list again, and they read what they read before the pass."""
    layout = DataLayout(tmp_path)
    for batch in range(1, 8):
        write_batch(tmp_path, batch)
    asked = [("click", "c-2-1", P0), ("impression", "i-6-0", P0), ("click", "c-never", P0)]
    offsets, copies = offsets_read(tmp_path, ["clicks"]), copy_periods(layout, asked)
    assert offsets == {"clicks": {0: 8, 1: 8}} and copies == {("click", "c-2-1"): {P0}, ("impression", "i-6-0"): {P0}}

    listings, listed_by = overtaking(layout, 4)
    monkeypatch.setattr(compaction, "live_files", listed_by)
    assert offsets_read(tmp_path, ["clicks"]) == offsets
    assert "compacted-1-4.parquet" in {p.name for p in listings[1]} and len(listings) == 3  # and the quarantine's
    listings, listed_by = overtaking(layout, 6)
    monkeypatch.setattr(compaction, "live_files", listed_by)
    assert copy_periods(layout, asked) == copies
    assert "compacted-5-6.parquet" in {p.name for p in listings[1]} and len(listings) == 2
