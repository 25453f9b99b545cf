"""Compaction of the open periods (`billing.store.compaction.compact_open`), on Parquet files written as the stream
writes them: a pass while the stream writes newer batches beside it, a second pass merging the first one's file with
the batches since, nothing above the position touched, every kind compacted (the readers of the open periods that
take no lock, the stream's recent clicks after a start and the not-charged list among them, read each row once), a
pass stopped at each step completed or rolled back by the next holder of the run lock, the stream's first batch
after a restart judging its clicks by the recent clicks an open pass compacted, and the passes between the runs of
`adbill reconcile --every` (`ops.reconcile.OpenPasses`)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from attribution.charging import Charging
from billing.invalid import IvtRules
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store import compaction
from billing.store.compaction import (
    KINDS,
    OPEN_KINDS,
    STEPS,
    compact_open,
    compactable_through,
    open_periods,
)
from billing.store.parquet_ledger import read_batches, read_ledger
from ops.reconcile import OpenPasses, ReconcileConfig, run_lock
from tests.batch_files import P0, T0, stopped_at, write_batch
from tests.unit.test_batch_output import _a_click, _run_batch
from tests.unit.test_compaction import P1, folders, ledger_rows, sources
from tests.unit.test_open_readers import listed_list, not_charged_rows, recent, write_not_charged


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


def kind_folder(root: Path, kind: str, period: str = P0) -> Path:
    """A kind's folder of `period`."""
    return next(k for k in KINDS if k.name == kind).folder(DataLayout(root)) / f"period={period}"


def kind_folders(root: Path, kind: str, period: str = P0) -> dict[str, list[str]]:
    """A kind's batch folders of `period` and the files each holds."""
    base = kind_folder(root, kind, period)
    return {p.name: sorted(f.name for f in p.iterdir()) for p in sorted(base.iterdir())}


def write_stream_batch(root: Path, batch: int, period_start: int = T0) -> None:
    """A batch's archive, ledger and `not_charged/` files, as the stream writes them."""
    write_batch(root, batch, period_start)
    write_not_charged(root, batch, period_start=period_start)


def test_an_open_period_is_compacted_while_the_stream_writes_newer_batches_beside_it(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch in range(1, 7):
        write_stream_batch(tmp_path, batch)
    written = ledger_rows(tmp_path)  # (click, batch) of every bill, each read from its own folder
    assert len(written) == 12 and open_periods(layout, []) == [P0] and open_periods(layout, [P0]) == []
    untouched = files_above(tmp_path, 3)
    recent_before, not_charged_before, listed_before = recent(tmp_path), not_charged_rows(layout), listed_list(layout)

    # The stream commits batch 6 and Redis applies it: batches up to 3 are cold. Batch 7 lands mid-pass, after
    # the journal is written (the stream does not take the run lock).
    def stream_writes(step: str, target: Path) -> None:
        if step == "journal" and not (layout.ledger / f"period={P0}" / "batch_id=7").exists():
            write_stream_batch(tmp_path, 7)

    compaction.step_hook = stream_writes
    try:
        report = compact_open(layout, open_periods(layout, []), compactable_through(6, 6))
    finally:
        compaction.step_hook = None
    # Every kind (`unbilled/` has no file here): the archive's clicks and impressions, the ledger and `not_charged/`
    # in one file each for batches 1 to 3 (6 files of clicks, 6 of impressions, 3 of the ledger, 3 of not_charged/).
    assert {k.name for k in OPEN_KINDS} == {"archive_click", "archive_impression", "ledger", "unbilled", "not_charged"}
    assert report.through == 3 and report.periods == 4 and report.files_read == 18, report.describe()
    assert report.describe().startswith("compaction of the open periods: 4 period folder(s) up to batch 3")
    assert folders(tmp_path) == {
        "batch_id=3": ["compacted-1-3.parquet"],
        **{f"batch_id={b}": ["part-00000.parquet"] for b in range(4, 8)},
    }
    assert kind_folders(tmp_path, "not_charged") == folders(tmp_path)
    for kind in ("archive_click", "archive_impression"):
        assert kind_folders(tmp_path, kind) == {
            "batch_id=3": ["compacted-1-3.parquet"],
            **{f"batch_id={b}": ["part-00000.parquet", "part-00001.parquet"] for b in range(4, 8)},
        }, kind
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
    # The stream's recent clicks after a start and the not-charged list: each row once, batch 7's too.
    assert recent(tmp_path) == recent_before + recent(tmp_path, 100, 7)
    assert recent(tmp_path, 4) == recent(tmp_path, 100, None) - recent(tmp_path, 100, 4) and recent(tmp_path, 4)
    batch_7 = Counter([("n-7-0", "duplicate_click"), ("n-7-1", "over_budget")])
    assert not_charged_rows(layout) == not_charged_before + batch_7
    assert listed_list(layout)[1:] == listed_before and listed_list(layout)[0].click_id == "n-7-0"

    # The stream goes on (batches 8 and 9, and the next period's 10); the second pass merges the batches since the
    # first one's file into a file of their own (the first one's is not written again), up to its own position, and
    # leaves the newer ones as written.
    for batch in (8, 9):
        write_stream_batch(tmp_path, batch)
    write_stream_batch(tmp_path, 10, T0 + 3_600_000)
    rows |= {(f"c-{b}-{t}", b) for b in (8, 9, 10) for t in (0, 1)}
    untouched = files_above(tmp_path, 6)
    recent_before, not_charged_before = recent(tmp_path), not_charged_rows(layout)
    first_pass = {kind: (kind_folder(tmp_path, kind) / "batch_id=3" / "compacted-1-3.parquet").stat().st_ino
                  for kind in ("ledger", "archive_click")}  # fmt: skip
    report = compact_open(layout, open_periods(layout, []), compactable_through(10, 9))
    # Batches 4 to 6 only: 3 files of the ledger and of not_charged/, 6 of each archive kind.
    assert report.through == 6 and report.periods == 4 and report.files_read == 18, report.describe()
    assert folders(tmp_path) == {
        "batch_id=3": ["compacted-1-3.parquet"],
        "batch_id=6": ["compacted-4-6.parquet"],
        **{f"batch_id={b}": ["part-00000.parquet"] for b in range(7, 10)},
    }
    assert kind_folders(tmp_path, "not_charged") == folders(tmp_path)
    assert kind_folders(tmp_path, "archive_click") == {
        "batch_id=3": ["compacted-1-3.parquet"],
        "batch_id=6": ["compacted-4-6.parquet"],
        **{f"batch_id={b}": ["part-00000.parquet", "part-00001.parquet"] for b in range(7, 10)},
    }
    for kind, inode in first_pass.items():  # the first pass's file, not written again
        assert (kind_folder(tmp_path, kind) / "batch_id=3" / "compacted-1-3.parquet").stat().st_ino == inode, kind
    assert recent(tmp_path) == recent_before and not_charged_rows(layout) == not_charged_before
    assert files_above(tmp_path, 6) == untouched
    assert ledger_rows(tmp_path) == {(i, 3 if b <= 3 else 6 if b <= 6 else b) for i, b in rows}
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
        write_stream_batch(template, batch)
    rows = ledger_rows(template)
    recent_rows, not_charged = recent(template), not_charged_rows(DataLayout(template))

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
        assert recent(root) == recent_rows and not_charged_rows(layout) == not_charged, step
        with run_lock(ReconcileConfig(data_dir=root, redis_url="", redis_prefix="")):
            assert not layout.compaction_journal.exists(), step
        # The first kind of the pass (the archive's clicks) was the one stopped; the others wait as written.
        renamed = step in ("renamed", "removed")
        assert kind_folders(root, "archive_click") == {
            **({"batch_id=4": ["compacted-1-4.parquet"]} if renamed else {}),
            **{f"batch_id={b}": ["part-00000.parquet", "part-00001.parquet"] for b in range(5 if renamed else 1, 8)},
        }, step
        assert kind_folders(root, "archive_impression") == {
            f"batch_id={b}": ["part-00000.parquet", "part-00001.parquet"] for b in range(1, 8)
        }, step
        assert folders(root) == {f"batch_id={b}": ["part-00000.parquet"] for b in range(1, 8)}, step
        assert recent(root) == recent_rows and not_charged_rows(layout) == not_charged, step
        assert files_above(root, 4) == hot, step
        assert not [p for p in root.rglob(".*") if p.is_file()], step
        assert sources(root) == rows, step
        assert own_batches(root, 0, 7) == rows, step
        # The next pass does the rest: the other kinds, and the clicks where the stopped pass was rolled back.
        compact_open(layout, open_periods(layout, []), compactable_through(7, 7))
        assert folders(root) == {
            "batch_id=4": ["compacted-1-4.parquet"],
            **{f"batch_id={b}": ["part-00000.parquet"] for b in range(5, 8)},
        }, step
        assert kind_folders(root, "not_charged") == folders(root), step
        assert kind_folders(root, "archive_click") == {
            "batch_id=4": ["compacted-1-4.parquet"],
            **{f"batch_id={b}": ["part-00000.parquet", "part-00001.parquet"] for b in range(5, 8)},
        }, step
        assert sources(root) == rows and files_above(root, 4) == hot, step
        assert recent(root) == recent_rows and not_charged_rows(layout) == not_charged, step


@pytest.mark.parametrize("pass_left", ["finished", "stopped-after-its-rename"])
def test_the_streams_first_batch_after_a_restart_judges_by_the_recent_clicks_an_open_pass_compacted(
    tmp_path: Path, pass_left: str
) -> None:
    """A click 10 s after its user's click on the same ad is a `duplicate_click` when the driver restarts between
    them, after an open pass compacted the first click's archive file with the batches around it (finished, or
    stopped with the compacted file beside the batch files it holds, as a start may find it)."""
    hour = 3_600_000
    root = tmp_path / "data"
    layout = DataLayout(root)
    watermark = T0 - 30_000
    before = Charging(layout, Periods(hour), IvtRules())
    first = _run_batch(before, root, 0, _a_click("c-1", "u-1", T0 + 10_000, 1), watermark)
    assert first.decisions == {"c-1": "charged"}
    for batch in range(1, 7):
        _run_batch(before, root, batch, _a_click(f"c-other-{batch}", "u-2", T0 + 11_000 + batch, 1 + batch), watermark)
    # The stream committed batch 6 and Redis applied it: an open pass takes batches 0 to 3.
    assert compactable_through(6, 6) == 3

    def open_pass() -> None:
        compact_open(layout, open_periods(layout, []), compactable_through(6, 6))

    if pass_left == "finished":
        open_pass()
    else:
        stopped_at("renamed", open_pass)
    clicks = layout.archive_of("click") / f"period={P0}"
    assert (clicks / "batch_id=3" / "compacted-0-3.parquet").is_file()
    assert (clicks / "batch_id=0").exists() == (pass_left != "finished")

    after = Charging(layout, Periods(hour), IvtRules())  # the restarted driver's
    again = _run_batch(after, root, 7, _a_click("c-2", "u-1", T0 + 20_000, 9), watermark)
    assert again.decisions == {"c-2": "duplicate_click"}
    assert sorted(after.recent.ids) == sorted(["c-1", "c-2", *(f"c-other-{b}" for b in range(1, 7))])


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
