"""Compaction of a closed period's batch files (`billing.store.compaction`), on Parquet files written as the stream
writes them (`write_batch_files`): every row kept once with the batch that wrote it, what every reader of the batch
folders reads unchanged, hot and late batches left as written, a crash at each step completed or rolled back by the
next holder of the run lock, and the epoch's guard."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from attribution.epoch import CheckpointRefusedError, newest_batch_id, offsets_read, set_aside_batches_after
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.click_files import ClickFiles, read_located
from billing.store.compaction import STEPS, compact_closed, compactable_through, live_files, read_listed
from billing.store.data_versions import data_versions
from billing.store.parquet_ledger import ledger_up_to, read_batches, read_ledger
from ops.reconcile import ReconcileConfig, run_lock
from tests.batch_files import P0, T0, compact_ledger_stopped_at, write_batch

P1 = "20260101T0100Z"


def ledger_rows(root: Path) -> set[tuple[str, int]]:
    table = read_ledger(DataLayout(root).ledger)
    return set(zip(table["click_id"].to_pylist(), table["batch_id"].to_pylist(), strict=True))


def sources(root: Path, kind: str = "ledger") -> set[tuple[str, int]]:
    """(id, batch that wrote it) of every row of a kind's files, as a story reads them (`read_located`)."""
    files = ClickFiles(DataLayout(root))
    ids = {i for i, _ in ledger_rows(root)}
    rows = read_located([item for i in sorted(ids) for item in files.rows_of(i) if item.kind == kind])
    return {(r["click_id" if kind == "ledger" else "event_id"], r["batch_id"]) for r in rows}


def folders(root: Path, period: str = P0) -> dict[str, list[str]]:
    base = DataLayout(root).ledger / f"period={period}"
    return {p.name: sorted(f.name for f in p.iterdir()) for p in sorted(base.iterdir())}


def test_every_row_is_kept_once_with_its_batch_and_readers_read_the_same(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in range(1, 8):
        write_batch(tmp_path, batch)
    write_batch(tmp_path, 8, T0 + 3_600_000)  # the next period, open
    files_before = sum(1 for _ in tmp_path.rglob("*.parquet"))
    rows, versions = ledger_rows(tmp_path), data_versions(layout, Periods())
    newest, offsets = newest_batch_id(tmp_path), offsets_read(tmp_path, ["clicks"])
    by_source = sources(tmp_path)
    assert by_source == rows and len(rows) == 16

    # The position: the lesser of the stream's commit and Redis's apply, less the hot batches; unknown: nothing.
    assert compactable_through(None, 9) is None and compactable_through(9, None) is None
    assert compactable_through(2, 9) is None and compactable_through(9, 8) == 5
    assert compact_closed(layout, [P0], None).periods == 0
    report = compact_closed(layout, [P0], compactable_through(9, 9))  # batches 1 to 6: 7 is hot, P1 open
    assert report.periods == 3 and report.files_read == 30 and report.files_written == 3, report.describe()
    assert folders(tmp_path) == {"batch_id=6": ["compacted-1-6.parquet"], "batch_id=7": ["part-00000.parquet"]}
    assert sum(1 for _ in tmp_path.rglob("*.parquet")) == files_before - 30 + 3
    # Whatever reads the batch from the path reads the folder's (6) for the rows it holds: the same rows up to any
    # position from 6 on, the same versions, newest batch and offsets; a story, the batch that wrote each row.
    compacted = {(i, 6 if b <= 6 else b) for i, b in rows}
    assert ledger_rows(tmp_path) == compacted
    ledger = read_ledger(layout.ledger)
    for through in (6, 7, 8):
        assert len(ledger_up_to(ledger, through)) == sum(1 for _, b in rows if b <= through)
    assert data_versions(layout, Periods()) == versions
    assert (newest_batch_id(tmp_path), offsets_read(tmp_path, ["clicks"])) == (newest, offsets)
    assert sources(tmp_path) == by_source
    assert sources(tmp_path, "archive_click") == by_source
    # Reconciliation's read of the batches after the one it read through takes each row's own batch.
    newer = read_batches(layout.ledger, [P0], 4, 7)
    assert set(zip(newer["click_id"].to_pylist(), newer["batch_id"].to_pylist(), strict=True)) == {
        (i, b) for i, b in rows if 4 < b <= 7
    }

    # A late event lands in the closed period (batch 10): left as written until it is cold, then merged.
    write_batch(tmp_path, 10)
    compact_closed(layout, [P0], compactable_through(12, 12))
    assert folders(tmp_path) == {"batch_id=10": ["part-00000.parquet"], "batch_id=7": ["compacted-1-7.parquet"]}
    # A reader without the lock that a compaction overtakes between its listing and its reading lists again.
    listings: list[list[Path]] = []

    def overtaken(files: list[Path]) -> int:
        if not listings:
            compact_closed(layout, [P0], compactable_through(13, 13))
        listings.append(files)
        return sum(pq.read_metadata(f).num_rows for f in files)

    assert read_listed(layout.ledger, 2, overtaken) == 18 and len(listings) == 2
    assert folders(tmp_path) == {"batch_id=10": ["compacted-1-10.parquet"]}
    assert sources(tmp_path) == by_source | {("c-10-0", 10), ("c-10-1", 10)}
    assert len(read_ledger(layout.ledger)) == 18 and data_versions(layout, Periods())[P0] == 10

    # A new epoch never moves a compacted folder (it holds rows of committed batches): it refuses, moving nothing.
    with pytest.raises(CheckpointRefusedError, match="compacted"):
        set_aside_batches_after(tmp_path, 9)
    assert folders(tmp_path) == {"batch_id=10": ["compacted-1-10.parquet"]}


def test_a_compaction_stopped_at_each_step_is_completed_or_rolled_back_by_the_next_holder_of_the_lock(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    for batch in range(1, 5):
        write_batch(template, batch)
    rows = ledger_rows(template)

    for step in STEPS:
        root = tmp_path / step
        shutil.copytree(template, root)
        layout = DataLayout(root)
        compact_ledger_stopped_at(layout, step)
        assert layout.compaction_journal.exists(), step
        # Until then, a reader that takes no lock reads each row once (the files a compacted file holds skipped).
        assert len(read_ledger(layout.ledger)) == len(rows), step
        assert sources(root) == rows, step
        with run_lock(ReconcileConfig(data_dir=root, redis_url="", redis_prefix="")):
            assert not layout.compaction_journal.exists(), step
        renamed = step in ("renamed", "removed")
        assert folders(root) == (
            {"batch_id=4": ["compacted-1-4.parquet"]}
            if renamed
            else {f"batch_id={b}": ["part-00000.parquet"] for b in range(1, 5)}
        ), step
        assert not [p for p in root.rglob(".*") if p.is_file()], step
        assert sources(root) == rows, step
        assert len(live_files(layout.ledger)) == (1 if renamed else 4)
