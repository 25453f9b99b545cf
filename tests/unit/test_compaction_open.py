"""Compaction of the open periods (`billing.store.compaction.compact_open`), on Parquet files written as the stream
writes them: a pass while the stream writes newer batches beside it, a second pass merging the first one's file with
the batches since, nothing above the position touched, the kinds with a reader of the open periods that does not
skip superseded files left as written, a pass stopped at each step completed or rolled back by the next holder of
the run lock, and the passes between the runs of `adbill reconcile --every` (`ops.reconcile.OpenPasses`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from billing.layout import DataLayout
from billing.store import compaction
from billing.store.compaction import (
    OPEN_KINDS,
    STEPS,
    compact_open,
    compactable_through,
    live_files,
    open_periods,
)
from billing.store.parquet_ledger import read_batches, read_ledger
from ops.reconcile import OpenPasses, ReconcileConfig, run_lock
from tests.batch_files import P0, T0, stopped_at, write_batch
from tests.unit.test_compaction import P1, folders, ledger_rows, sources


def files_above(root: Path, through: int) -> dict[str, tuple[int, int, int]]:
    """(inode, size, modification time) of every file of a batch after `through`, any kind: what a pass must not
    touch."""
    out = {}
    for path in root.rglob("*.parquet"):
        batch = compaction.batch_of(path.parent.name)
        if batch is not None and batch > through:
            stat = path.stat()
            out[str(path.relative_to(root))] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return out


def own_batches(root: Path, after: int, through: int) -> set[tuple[str, int]]:
    """(click, batch) of the ledger's rows of batches after `after` up to `through`, as reconciliation reads them."""
    table = read_batches(DataLayout(root).ledger, [P0, P1], after, through)
    return set(zip(table["click_id"].to_pylist(), table["batch_id"].to_pylist(), strict=True))


def test_an_open_period_is_compacted_while_the_stream_writes_newer_batches_beside_it(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in range(1, 7):
        write_batch(tmp_path, batch)
    written = ledger_rows(tmp_path)  # (click, batch) of every bill, each read from its own folder
    assert len(written) == 12 and open_periods(layout, []) == [P0] and open_periods(layout, [P0]) == []
    untouched = files_above(tmp_path, 3)
    clicks_before = len(live_files(layout.archive_of("click"), 2))

    # The stream commits batch 6 and Redis applies it: batches up to 3 are cold. Batch 7 lands mid-pass, after
    # the journal is written (the stream does not take the run lock).
    def stream_writes(step: str, target: Path) -> None:
        if step == "journal" and not (layout.ledger / f"period={P0}" / "batch_id=7").exists():
            write_batch(tmp_path, 7)

    compaction.step_hook = stream_writes
    try:
        report = compact_open(layout, open_periods(layout, []), compactable_through(6, 6))
    finally:
        compaction.step_hook = None
    # The ledger and the archive's impressions: one file each for batches 1 to 3; the archive's clicks (a reader
    # of the open periods lists them without `live_files`) as written.
    assert {k.name for k in OPEN_KINDS} == {"ledger", "archive_impression", "unbilled"}
    assert report.through == 3 and report.periods == 2 and report.files_read == 9, report.describe()
    assert report.describe().startswith("compaction of the open periods: 2 period folder(s) up to batch 3")
    assert folders(tmp_path) == {
        "batch_id=3": ["compacted-1-3.parquet"],
        **{f"batch_id={b}": ["part-00000.parquet"] for b in range(4, 8)},
    }
    assert len(live_files(layout.archive_of("click"), 2)) == clicks_before + 2
    impressions = layout.archive_of("impression") / f"period={P0}"
    assert sorted(p.name for p in impressions.iterdir())[:1] == ["batch_id=3"]
    assert [p.name for p in (impressions / "batch_id=3").iterdir()] == ["compacted-1-3.parquet"]
    # Nothing after the position was touched: the same files, the same inodes, not rewritten.
    assert {k: v for k, v in files_above(tmp_path, 3).items() if "batch_id=7" not in k} == untouched

    # Every row once: the ledger by its folder's batch (3 for the rows the file holds), each story's row and
    # reconciliation's newer batches by the batch that wrote it.
    rows = written | {("c-7-0", 7), ("c-7-1", 7)}
    assert ledger_rows(tmp_path) == {(i, 3 if b <= 3 else b) for i, b in rows}
    assert len(read_ledger(layout.ledger)) == 14
    assert sources(tmp_path) == rows
    assert sources(tmp_path, "archive_click") == rows
    assert own_batches(tmp_path, 1, 7) == {(i, b) for i, b in rows if b > 1}

    # The stream goes on (batches 8 and 9, and the next period's 10); the second pass merges the first one's file
    # with the batches since, up to its own position, and leaves the newer ones as written.
    for batch in (8, 9):
        write_batch(tmp_path, batch)
    write_batch(tmp_path, 10, T0 + 3_600_000)
    rows |= {(f"c-{b}-{t}", b) for b in (8, 9, 10) for t in (0, 1)}
    untouched = files_above(tmp_path, 6)
    report = compact_open(layout, open_periods(layout, []), compactable_through(10, 9))
    assert report.through == 6 and report.periods == 2 and report.files_read == 11, report.describe()
    assert folders(tmp_path) == {
        "batch_id=6": ["compacted-1-6.parquet"],
        **{f"batch_id={b}": ["part-00000.parquet"] for b in range(7, 10)},
    }
    assert files_above(tmp_path, 6) == untouched
    assert ledger_rows(tmp_path) == {(i, 6 if b <= 6 else b) for i, b in rows}
    assert sources(tmp_path) == rows
    assert own_batches(tmp_path, 2, 10) == {(i, b) for i, b in rows if b > 2}
    # The next period's single batch is nothing to merge; a pass with the position unknown compacts nothing.
    assert folders(tmp_path, P1) == {"batch_id=10": ["part-00000.parquet"]}
    assert compact_open(layout, [P0, P1], None).describe().endswith("(the stream's or Redis's position is unknown)")


def test_an_open_pass_stopped_at_each_step_is_completed_or_rolled_back_by_the_next_holder_of_the_lock(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    for batch in range(1, 8):
        write_batch(template, batch)
    rows = ledger_rows(template)

    for step in STEPS:
        root = tmp_path / step
        shutil.copytree(template, root)
        layout = DataLayout(root)
        hot = files_above(root, 4)

        stopped_at(step, lambda at=layout: compact_open(at, open_periods(at, []), compactable_through(7, 7)))
        assert layout.compaction_journal.exists(), step
        # Until the next holder of the lock, a reader without it reads each row once.
        assert len(read_ledger(layout.ledger)) == len(rows), step
        assert sources(root) == rows, step
        with run_lock(ReconcileConfig(data_dir=root, redis_url="", redis_prefix="")):
            assert not layout.compaction_journal.exists(), step
        # The first kind of the pass (the archive's impressions) was the one stopped; the ledger waits as written.
        renamed = step in ("renamed", "removed")
        impressions = layout.archive_of("impression") / f"period={P0}"
        assert {p.name: sorted(f.name for f in p.iterdir()) for p in impressions.iterdir()} == {
            **({"batch_id=4": ["compacted-1-4.parquet"]} if renamed else {}),
            **{f"batch_id={b}": ["part-00000.parquet", "part-00001.parquet"] for b in range(5 if renamed else 1, 8)},
        }, step
        assert folders(root) == {f"batch_id={b}": ["part-00000.parquet"] for b in range(1, 8)}, step
        assert files_above(root, 4) == hot, step
        assert not [p for p in root.rglob(".*") if p.is_file()], step
        assert sources(root) == rows, step
        assert own_batches(root, 0, 7) == rows, step
        # The next pass does the rest: the ledger, and the impressions where the stopped pass was rolled back.
        compact_open(layout, open_periods(layout, []), compactable_through(7, 7))
        assert folders(root) == {
            "batch_id=4": ["compacted-1-4.parquet"],
            **{f"batch_id={b}": ["part-00000.parquet"] for b in range(5, 8)},
        }, step
        assert sources(root) == rows and files_above(root, 4) == hot, step


class Clock:
    """A monotonic clock that the waits move on."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_reconcile_every_compacts_the_open_periods_every_interval_between_its_runs(tmp_path: Path) -> None:
    config = ReconcileConfig(data_dir=tmp_path, redis_url="", redis_prefix="", compact_interval_s=120)
    said: list[str] = []
    clock = Clock()
    passes = OpenPasses(config, said.append, clock, clock.sleep)
    # No checkpoint: the position is unknown, each pass says so and compacts nothing. The first at once, then one
    # every 120 s, whatever the runs' interval (300 s; then runs of 30 s 20 s apart: a pass in the first wait that
    # begins after it is due, not one in each).
    passes.wait(300)
    assert passes.passes == 3 and clock.slept == [120, 120, 60] and clock.now == 1_300
    unknown = "compaction of the open periods: nothing compacted (the stream's or Redis's position is unknown)"
    assert said == [unknown] * 3
    clock.slept.clear()
    for _ in range(6):
        clock.now += 30  # a run of 30 s
        passes.wait(20)
    assert passes.passes == 5 and clock.now == 1_600 and said == [unknown] * 5  # at 1,380 and 1,530
    assert clock.slept == [20, 20, 20, 20, 20, 20] and passes.due == 1_650

    # The lock held (a run, an audit): the pass says so and is made again an interval later.
    said.clear()
    with run_lock(config):
        OpenPasses(config, said.append, clock, clock.sleep).wait(100)
    assert len(said) == 1 and said[0].startswith("compaction of the open periods waits: another reconciliation run")

    # A pass that fails (here the data folder is not a folder) is said; the wait goes on to the next run.
    said.clear()
    (tmp_path / "file").write_text("")
    broken = ReconcileConfig(data_dir=tmp_path / "file", redis_url="", redis_prefix="", compact_interval_s=120)
    failing = OpenPasses(broken, said.append, clock, clock.sleep)
    failing.wait(200)
    assert failing.passes == 0 and len(said) == 2
    assert all(m.startswith("compaction of the open periods failed, tried again") for m in said)

    # 0: no pass, the plain wait.
    said.clear()
    clock.slept.clear()
    off = ReconcileConfig(data_dir=tmp_path, redis_url="", redis_prefix="", compact_interval_s=0)
    OpenPasses(off, said.append, clock, clock.sleep).wait(300)
    assert said == [] and clock.slept == [300]
