"""Compaction of the quarantine and `released/` (`billing.store.compaction.compact_quarantine`): their batch folders
merged by whole chunks of batch ids at or below the position, every row kept once with its own batch, a chunk
compacted once left alone by later passes, a pass stopped at each step finished by the next holder of the run lock,
and what every reader answers the same throughout (`tests.unit.test_quarantine_readers.answers`)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from billing.layout import DataLayout
from billing.store.click_files import ClickFiles, read_located
from billing.store.compaction import (
    BATCH_ONLY_KINDS,
    QUARANTINE_CHUNK,
    STEPS,
    chunks_due,
    compact_quarantine,
    finish_interrupted,
    plan_folder,
    read_batch_only,
)
from ops.reconcile import ReconcileConfig, run_lock
from tests.batch_files import stopped_at
from tests.unit.test_quarantine_readers import KNOWN_LATER, answers, names, release, write_folder, write_quarantine

CHUNK = 4
"""Batch ids a chunk holds in these tests (`QUARANTINE_CHUNK` is 3,600: an hour at the 1 s trigger)."""


def own_rows(root: Path) -> list[tuple[int, int]]:
    """(offset, own batch) of every quarantine row, as the readers take it."""
    table = read_batch_only(DataLayout(root).quarantine, ["offset", "batch_id"])
    assert table is not None
    return sorted(zip(table["offset"].to_pylist(), table["batch_id"].to_pylist(), strict=True))


def test_whole_chunks_at_or_below_the_position_are_merged_once_each(tmp_path: Path) -> None:
    assert QUARANTINE_CHUNK == 3_600 and [k.keys for k in BATCH_ONLY_KINDS] == [("event_id",), ("event_id",)]
    layout = DataLayout(tmp_path)
    for batch in (1, 2, 3, 5, 6, 9, 10, 11):
        write_quarantine(tmp_path, batch)
    rows = own_rows(tmp_path)
    assert len(rows) == 33

    # The plan: the chunks 0-3, 4-7 and 8-11, each only once its last id is at or below the position.
    assert chunks_due(layout.quarantine, 2, CHUNK) == []
    assert chunks_due(layout.quarantine, 8, CHUNK) == [(0, 3), (4, 7)]
    assert chunks_due(layout.quarantine, 11, CHUNK) == [(0, 3), (4, 7), (8, 11)]
    plan = plan_folder(layout.quarantine, 7, since=4)
    assert plan is not None and (plan.first, plan.last) == (5, 6)
    assert {batch for batch, _ in plan.sources} == {5, 6} and plan.target.name == "compacted-5-6.parquet"
    assert compact_quarantine(layout, None, chunk=CHUNK).chunks == 0, "the position unknown: nothing"

    report = compact_quarantine(layout, 8, chunk=CHUNK)
    assert (report.chunks, report.files_read, report.files_written, report.rows) == (2, 10, 2, 21), report.describe()
    assert report.describe().startswith("compaction of the quarantine: 2 chunk(s) of the quarantine and released/")
    assert names(layout.quarantine) == {
        "batch_id=10": ["part-00000.parquet", "part-00001.parquet"],
        "batch_id=11": ["part-00000.parquet", "part-00001.parquet"],
        "batch_id=3": ["compacted-1-3.parquet"],
        "batch_id=6": ["compacted-5-6.parquet"],
        "batch_id=9": ["part-00000.parquet", "part-00001.parquet"],
    }
    assert own_rows(tmp_path) == rows
    # Sorted by `event_id`, in row groups of 65,536: every row of every file it replaced.
    compacted = pq.ParquetFile(layout.quarantine / "batch_id=3" / "compacted-1-3.parquet")
    assert compacted.metadata.num_rows == 13 and "batch_id" not in compacted.schema_arrow.names
    ids = compacted.read(columns=["event_id"]).column("event_id").to_pylist()
    assert ids[0] == "c-bad" and ids[1:] == [None] * 12

    # A later pass leaves a compacted chunk alone (the same file), and merges the next once it is whole.
    inode = (layout.quarantine / "batch_id=3" / "compacted-1-3.parquet").stat().st_ino
    assert compact_quarantine(layout, 10, chunk=CHUNK).chunks == 0
    assert compact_quarantine(layout, 11, chunk=CHUNK).chunks == 1
    assert (layout.quarantine / "batch_id=3" / "compacted-1-3.parquet").stat().st_ino == inode
    assert sorted(names(layout.quarantine)) == ["batch_id=11", "batch_id=3", "batch_id=6"]
    assert own_rows(tmp_path) == rows
    # A click story finds the bad copy in a compacted file, with the batch that quarantined it.
    found = read_located(ClickFiles(layout).rows_of("c-bad"))
    assert [(r["found_in"], r["batch_id"], r["file"].endswith("compacted-1-3.parquet")) for r in found] == [
        ("quarantine", 3, True)
    ]


def test_the_chunk_of_a_late_batch_folder_is_merged_again_with_its_compacted_file(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in (1, 2):
        write_quarantine(tmp_path, batch)
    compact_quarantine(layout, 5, chunk=CHUNK)
    rows = own_rows(tmp_path)
    # A batch folder that appears in a compacted chunk after its file (no stream writes one there: the position).
    write_quarantine(tmp_path, 3)
    assert compact_quarantine(layout, 5, chunk=CHUNK).chunks == 1
    assert names(layout.quarantine) == {"batch_id=3": ["compacted-1-3.parquet"]}
    assert own_rows(tmp_path) == sorted([*rows, (30, 3), (31, 3), (35, 3), (36, 3), (37, 3)])


@pytest.mark.parametrize("step", STEPS)
def test_a_pass_stopped_at_each_step_is_finished_by_finish_interrupted(tmp_path: Path, step: str) -> None:
    write_folder(tmp_path)  # the quarantine's batches 1 to 6 and 11, `released/`'s 8 and 10
    layout = DataLayout(tmp_path)
    before = answers(tmp_path)
    stopped_at(step, lambda: compact_quarantine(layout, 11, chunk=CHUNK))  # the first chunk, 1 to 3
    assert layout.compaction_journal.exists()
    assert answers(tmp_path) == before, "a reader that takes no lock meets the pass where it stopped"
    done = finish_interrupted(layout)
    assert done is not None and ("completed" if step in ("renamed", "removed") else "rolled back") in done, done
    assert not layout.compaction_journal.exists() and not [p for p in tmp_path.rglob(".*") if p.is_file()]
    assert answers(tmp_path) == before
    # The next pass, under the run lock, merges what is left: 1-3, 4-6 (7 holds nothing), 8-10 of `released/`.
    with run_lock(ReconcileConfig(data_dir=tmp_path, redis_url="", redis_prefix="")):
        report = compact_quarantine(layout, 11, chunk=CHUNK)
    assert report.chunks == (2 if step in ("renamed", "removed") else 3), report.describe()
    assert sorted(names(layout.quarantine)) == ["batch_id=11", "batch_id=3", "batch_id=6"]
    assert names(layout.released) == {"batch_id=10": ["compacted-8-10.parquet"]}
    assert answers(tmp_path) == before
    assert release(tmp_path, 12, KNOWN_LATER) == 2, "batch 11's held records only"


def test_a_pass_that_fails_on_a_chunk_leaves_it_as_written_and_goes_on(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in (1, 2, 5, 6):
        write_quarantine(tmp_path, batch)
    broken = layout.quarantine / "batch_id=2" / "part-00001.parquet"
    broken.write_bytes(b"not parquet")
    report = compact_quarantine(layout, 8, chunk=CHUNK)
    assert report.chunks == 1 and len(report.failed) == 1 and "quarantine batches 0 to 3" in report.failed[0]
    assert sorted(names(layout.quarantine)) == ["batch_id=1", "batch_id=2", "batch_id=6"]
    assert broken.read_bytes() == b"not parquet" and not layout.compaction_journal.exists()


def test_the_open_pass_merges_the_chunk_under_way_and_the_closed_pass_finishes_it(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in (1, 2, 4, 5, 6):
        write_quarantine(tmp_path, batch)
    rows = own_rows(tmp_path)
    # The chunk 4-7 is under way at position 5: the open pass merges its batches so far, the closed pass does not.
    assert chunks_due(layout.quarantine, 5, CHUNK) == [(0, 3)]
    assert chunks_due(layout.quarantine, 5, CHUNK, partial=True) == [(0, 3), (4, 5)]
    assert chunks_due(layout.quarantine, 7, CHUNK, partial=True) == [(0, 3), (4, 7)]  # whole: once
    report = compact_quarantine(layout, 5, chunk=CHUNK, partial=True)
    assert report.chunks == 2, report.describe()
    assert sorted(names(layout.quarantine)) == ["batch_id=2", "batch_id=5", "batch_id=6"]
    assert names(layout.quarantine)["batch_id=5"] == ["compacted-4-5.parquet"]
    assert own_rows(tmp_path) == rows
    # The next pass merges the chunk's file with the batches since; once whole, the closed pass leaves one file.
    write_quarantine(tmp_path, 7)
    rows = own_rows(tmp_path)
    assert compact_quarantine(layout, 6, chunk=CHUNK, partial=True).chunks == 1
    assert names(layout.quarantine)["batch_id=6"] == ["compacted-4-6.parquet"]
    assert compact_quarantine(layout, 7, chunk=CHUNK).chunks == 1
    assert sorted(names(layout.quarantine)) == ["batch_id=2", "batch_id=7"]
    assert names(layout.quarantine)["batch_id=7"] == ["compacted-4-7.parquet"]
    assert own_rows(tmp_path) == rows
    assert compact_quarantine(layout, 7, chunk=CHUNK, partial=True).chunks == 0  # nothing left to merge


def test_a_lookup_reads_only_the_quarantine_chunks_that_may_hold_the_click(tmp_path: Path) -> None:
    from billing.store import click_files

    layout = DataLayout(tmp_path)
    for batch in (1, 2, 3, 5, 6, 9, 10, 11):
        write_quarantine(tmp_path, batch)
    compact_quarantine(layout, 8, chunk=CHUNK)  # the chunks 1-3 (with the bad copy of c-bad) and 5-6
    files = ClickFiles(layout)
    found = files.rows_of("c-bad")
    assert [(r.kind, r.path.name) for r in found] == [("quarantine", "compacted-1-3.parquet")]

    def read(click_id: str) -> list[str]:
        """The quarantine files a lookup of `click_id` reads (folder and name)."""
        quarantine = files._batch_only(click_files.QUARANTINE, click_id)
        return sorted(f"{p.parent.name}/{p.name}" for p in quarantine)

    batch_files = [f"batch_id={b}/part-0000{t}.parquet" for b in (10, 11, 9) for t in (0, 1)]
    chunks = ["batch_id=3/compacted-1-3.parquet", "batch_id=6/compacted-5-6.parquet"]
    assert read("c-nowhere") == sorted([*chunks, *batch_files])
    assert files.refresh_chunk_filters() == 2 and files.refresh_chunk_filters() == 0
    assert layout.click_day_filter(click_files.CHUNK_FILTERS[click_files.QUARANTINE]).is_file()
    assert read("c-nowhere") == sorted(batch_files), "no chunk holds it"
    assert read("c-bad") == sorted(["batch_id=3/compacted-1-3.parquet", *batch_files])
    assert files.rows_of("c-bad") == found

    # A chunk file rewritten in place with a row its part never saw: read, whatever the part says, until written again.
    chunk = layout.quarantine / "batch_id=6" / "compacted-5-6.parquet"
    table = pq.read_table(chunk)
    extra = table.slice(0, 1).to_pylist()[0] | {"event_id": "c-new", "offset": 999}
    pq.write_table(pa.concat_tables([table, pa.Table.from_pylist([extra], table.schema)]), chunk)
    assert [r.path.name for r in files.rows_of("c-new")] == ["compacted-5-6.parquet"]
    assert files.refresh_chunk_filters() == 1
    assert [r.path.name for r in files.rows_of("c-new")] == ["compacted-5-6.parquet"]
    assert "batch_id=6/compacted-5-6.parquet" not in read("c-nowhere")

    # The next chunk merged: a part of its own; a chunk's file gone: its part dropped.
    compact_quarantine(layout, 11, chunk=CHUNK)
    assert files.refresh_chunk_filters() == 1
    assert read("c-nowhere") == []
    chunk.unlink()
    files.refresh_chunk_filters()
    chunk_filter = files.filters.of(click_files.CHUNK_FILTERS[click_files.QUARANTINE])
    assert chunk_filter is not None and sorted(chunk_filter.parts) == [
        "quarantine/batch_id=11/compacted-9-11.parquet",
        "quarantine/batch_id=3/compacted-1-3.parquet",
    ]
