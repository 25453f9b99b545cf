"""Compaction: a period's batch files, once no one will write those batches again, in one file per kind.

The stream writes a folder per micro-batch and period (`billing.layout`), each a few files: at the 1 s trigger a
closed day leaves about 950,000 of them. Each reconciliation run (`ops.reconcile`, `ADBILL_COMPACT_AFTER_CLOSE`)
compacts the batch folders of every closed period, per kind (`KINDS`: the archive's clicks and impressions, the
ledger, `unbilled/`, `not_charged/`), into one file (`compact_closed`); between runs, `adbill reconcile --every`
compacts the open periods' batches up to the same position every `ADBILL_COMPACT_INTERVAL_S` (`compact_open`, the
kinds of `OPEN_KINDS`: every kind too), each pass merging the batches since the last one's file into a file of
their own
(docs/click-stories-at-scale.md, "What compaction must guarantee"):

- **only batches no one will write again** (`compactable_through`): at or below the lesser of the stream's last
  committed batch and Redis's last applied one, less `HOT_BATCHES`. The stream replays only the batch after its last
  commit, a new epoch sets aside only the batches after Redis's last applied one, and reconciliation releases records
  into the last committed batch; none of those is ever a compacted folder;
- **every row, once, with its batch**: the rows of the folders it reads, unchanged, plus `source_batch_id` (the batch
  that wrote each row), sorted for the story's questions (`Kind.keys`), row groups of `ROW_GROUP_ROWS`. The file
  goes in the folder of the newest batch it holds, `period=P/batch_id=M/compacted-A-M.parquet`, and the folders it
  read are removed: whatever reads the batch from the path reads M for every row, which gives the same rows for any
  `batch_id <= X` with X at or above M (every position anyone holds from then on), and leaves the newest batch of
  every period (`billing.store.data_versions`) and of the data folder (`attribution.epoch.newest_batch_id`) as it was;
- **written whole before anything is removed**: staged under a dot name, flushed, renamed, its folder flushed
  (`billing.store.durable`); then the files it holds are removed and their folders flushed;
- **late data is left where it lands**: a batch folder newer than the position (a late event, a record released from
  quarantine) stays as written until a later pass merges it with the compacted file;
- **under reconciliation's run lock** (`ops.reconcile.run_lock`), which every command that reads the batch folders
  for the books takes too;
- **a crash mid-way is finished before anyone reads**: a journal (`DataLayout.compaction_journal`: the folder, the
  span, the files) is written before the compacted file and removed after the last removal; whoever takes the lock
  next completes or rolls back what it names (`finish_interrupted`);
- **readers that take no lock skip what a compacted file supersedes** (`superseded`): `compacted-A-M` stands for the
  batch folders A to M of its period beside it, should both be listed.

The quarantine and `released/` are kept by batch only (`batch_id=N/`, no period): the closed pass merges their batch
folders in chunks of `QUARANTINE_CHUNK` batch ids, each once its last batch is at or below the same position
(`compact_quarantine`, `BATCH_ONLY_KINDS`), with the same plan, journal and recovery; their readers list through
`read_batch_only`, which takes each row's own batch. The exports, corrections and conflicts are never rewritten. Pure
pyarrow; no Spark, no services.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from billing.layout import DataLayout
from billing.store.durable import fsync_folder, replace_files, write_whole

T = TypeVar("T")

COMPACTED = "compacted-"
"""The name of a compacted file begins so: `compacted-FIRST-LAST.parquet`, FIRST and LAST the batches it holds."""

SOURCE_BATCH = "source_batch_id"
"""A compacted file's column: the batch that wrote each row (its folder's `batch_id` is the newest it holds)."""

HOT_BATCHES = 3
"""Batches this close to the lesser of the stream's last committed batch and Redis's last applied one are left as
written (the stream replays the batch after its last commit; reconciliation releases into the last committed one)."""

ROW_GROUP_ROWS = 65_536
"""Rows per row group of a compacted file: a lookup by id reads one row group (docs/click-stories-at-scale.md)."""

STEPS = ("journal", "staged", "renamed", "removed")
"""The points between a compaction's steps: the journal written, the compacted file written and flushed under its
dot name, renamed into place, the files it holds removed (the journal's removal follows)."""

step_hook: Callable[[str, Path], None] | None = None
"""Called with each of `STEPS` and the compacted file's path, when set: how a test stops a compaction between its
steps."""


@dataclass(frozen=True)
class Kind:
    """A kind of per-batch files that is compacted: where its `period=P/` folders are, how its file is sorted."""

    name: str
    folder: Callable[[DataLayout], Path]
    keys: tuple[str, ...]
    bloom: tuple[str, ...] = ()
    """Columns that get a Parquet Bloom filter (a lookup by id in a file sorted otherwise)."""


KINDS = (
    Kind("archive_click", lambda layout: layout.archive_of("click"), ("event_id",), ("user_id",)),
    Kind("archive_impression", lambda layout: layout.archive_of("impression"), ("user_id", "event_time")),
    Kind("ledger", lambda layout: layout.ledger, ("campaign_id", "click_time"), ("click_id",)),
    Kind("unbilled", lambda layout: layout.unbilled, ("click_id",)),
    Kind("not_charged", lambda layout: layout.not_charged, ("click_id",)),
)
"""The kinds compacted per period, each sorted as docs/click-stories-at-scale.md lays them out."""

OPEN_KINDS = KINDS
"""The kinds compacted while their period is open (`compact_open`): those whose every reader skips what a compacted
file supersedes, which is now every kind (docs/click-stories-at-scale.md, "Who reads the batch folders"): the readers
of the open periods that take no run lock list through `live_files` or `read_listed` (the finder, `restore-redis`,
the stream's recent clicks after a start, `attribution.charging.recent_clicks`, and the not-charged list,
`billing.store.not_charged_clicks`)."""


class CompactionError(RuntimeError):
    """A period's files could not be compacted (their columns do not agree, a file does not read): left as written."""


IO_THREADS = 8
"""Files a compaction reads, and batch folders it removes, side by side."""


def batch_of(name: str) -> int | None:
    """N of a folder named `batch_id=N`; None for any other name."""
    if not name.startswith("batch_id="):
        return None
    number = name.removeprefix("batch_id=")
    return int(number) if number.isdigit() else None


def compacted_span(name: str) -> tuple[int, int] | None:
    """(first, last) batch of a compacted file's name `compacted-FIRST-LAST.parquet`; None for any other name."""
    if not name.startswith(COMPACTED) or not name.endswith(".parquet"):
        return None
    first, _, last = name.removeprefix(COMPACTED).removesuffix(".parquet").partition("-")
    return (int(first), int(last)) if first.isdigit() and last.isdigit() else None


def superseded(paths: Iterable[Path]) -> set[Path]:
    """The files among `paths` that a compacted file among them stands for: in the same period folder, a batch
    file of a batch from its first to its last, or a compacted file whose span lies within its own. A reader that
    lists without the run lock (a compaction may be under way, or stopped mid-way) skips them."""
    spans: dict[Path, list[tuple[Path, int, int]]] = {}
    listed = list(paths)
    for path in listed:
        span = compacted_span(path.name)
        if span is not None and batch_of(path.parent.name) is not None:
            spans.setdefault(path.parent.parent, []).append((path, *span))
    if not spans:
        return set()
    out = set()
    for path in listed:
        batch = batch_of(path.parent.name)
        covering = spans.get(path.parent.parent)
        if batch is None or not covering:
            continue
        first, last = compacted_span(path.name) or (batch, batch)
        if any(other != path and a <= first and last <= m for other, a, m in covering):
            out.add(path)
    return out


def read_listed(root: Path, depth: int, read: Callable[[list[Path]], T], tries: int = 3) -> T:
    """`read(live_files(root, depth))`, listed and read again when a file listed is gone before it is read (a
    compaction removed it: its rows are in the compacted file the next listing finds)."""
    for attempt in range(tries):
        try:
            return read(live_files(root, depth))
        except FileNotFoundError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def live_files(root: Path, depth: int = 2) -> list[Path]:
    """Every Parquet file of the batch folders under `root` (`depth` folder levels down: 2 for `period=P/batch_id=N`,
    3 for the archive's `event_type=T/period=P/batch_id=N`), but for dot files (a write in progress) and the files a
    compacted file supersedes (`superseded`)."""
    found: list[Path] = []

    def walk(folder: str, level: int) -> None:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return  # removed by a compaction while this was listed: its rows are in the compacted file
        for entry in entries:
            if entry.name.startswith((".", "_")):
                continue
            if level < depth and entry.is_dir():
                walk(entry.path, level + 1)
            elif level == depth and entry.name.endswith(".parquet") and entry.is_file():
                found.append(Path(entry.path))

    if root.is_dir():
        walk(str(root), 0)
    gone = superseded(found)
    return sorted(path for path in found if path not in gone)


def own_batch() -> pc.Expression:
    """A row's own batch, in a filter of `read_batch_only`: a compacted file's `source_batch_id`, else its folder's
    `batch_id`."""
    return pc.coalesce(pc.field(SOURCE_BATCH), pc.field("batch_id"))


def read_batch_only(
    root: Path, columns: Sequence[str], where: pc.Expression | None = None, schema: pa.Schema | None = None
) -> pa.Table | None:
    """`columns` of the rows `where` of a table kept by batch only (`root/batch_id=N/*.parquet`: the quarantine,
    `released/`), or None when it has no file. Listed by `read_listed` (a compaction's superseded files skipped, and
    listed again when a file goes), and `batch_id` is each row's own batch (`own_batch`), not its folder's: a
    compacted file gives the same rows and batches as the batch files it holds. `where` names the row's batch as
    `own_batch()` (a filter on the field `batch_id` would take the folder's). `schema`, when given, is the files'
    (with `batch_id`); else the first file's."""
    partitioning = ds.partitioning(pa.schema([("batch_id", pa.int64())]), flavor="hive")

    def read(files: list[Path]) -> pa.Table | None:
        if not files:
            return None
        paths = [str(f) for f in files]
        found = schema
        if found is None:
            found = ds.dataset(paths, format="parquet", partitioning=partitioning, partition_base_dir=str(root)).schema
        if SOURCE_BATCH not in found.names:
            found = found.append(pa.field(SOURCE_BATCH, pa.int64()))
        dataset = ds.dataset(
            paths, schema=found, format="parquet", partitioning=partitioning, partition_base_dir=str(root)
        )
        wanted = {name: own_batch() if name == "batch_id" else pc.field(name) for name in columns}
        return dataset.to_table(columns=wanted, filter=where)

    return read_listed(root, 1, read)


# --- The position ------------------------------------------------------------------------------------------------


def compactable_through(committed: int | None, applied: int | None, hot: int = HOT_BATCHES) -> int | None:
    """The newest batch compaction may take: `hot` below the lesser of the stream checkpoint's last committed batch
    and Redis's last applied one; None when either is unknown (no checkpoint, Redis without the record): nothing is
    compacted then."""
    if committed is None or applied is None:
        return None
    through = min(committed, applied) - hot
    return through if through >= 0 else None


# --- One period's folder -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one compaction of a period's folder reads and writes."""

    folder: Path
    """The period's folder (`.../period=P`)."""
    first: int
    last: int
    sources: tuple[tuple[int, Path], ...]
    """(batch, file) of every file it holds (a compacted file's batch is its last)."""
    folders: tuple[Path, ...]
    """The batch folders it empties and removes (all but the last's)."""

    @property
    def target(self) -> Path:
        return self.folder / f"batch_id={self.last}" / f"{COMPACTED}{self.first}-{self.last}.parquet"

    @property
    def staging(self) -> Path:
        return self.target.with_name(f".{self.target.name}.tmp")


def plan_folder(folder: Path, through: int, since: int | None = None) -> Plan | None:
    """The compaction of a period's folder: every batch folder up to batch `through` (newer ones are left for a
    later pass), from batch `since` on when given (a chunk of the quarantine, `compact_quarantine`); None when they
    are fewer than two (nothing to merge)."""
    batches: dict[int, list[Path]] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return None
    for entry in entries:
        batch = batch_of(entry.name)
        if batch is None or batch > through or (since is not None and batch < since) or not entry.is_dir():
            continue
        batches[batch] = sorted(
            Path(file.path)
            for file in os.scandir(entry.path)
            if file.name.endswith(".parquet") and not file.name.startswith(".") and file.is_file()
        )
    if len(batches) < 2:
        return None
    last = max(batches)
    first = min(batches)
    sources = []
    for batch, files in sorted(batches.items()):
        for path in files:
            span = compacted_span(path.name)
            if span is not None:
                first = min(first, span[0])
            sources.append((batch, path))
    if not sources:
        return None  # empty folders only: nothing to hold
    folders = tuple(folder / f"batch_id={batch}" for batch in sorted(batches) if batch != last)
    return Plan(folder, first, last, tuple(sources), folders)


def compacted_table(plan: Plan, keys: Sequence[str]) -> pa.Table:
    """Every row of the plan's files, each with the batch that wrote it (`SOURCE_BATCH`: a batch file's folder, or
    the column a compacted file holds), sorted by `keys`."""
    with ThreadPoolExecutor(max_workers=IO_THREADS) as pool:  # each read waits on the disk more than the CPU
        tables = list(pool.map(_source_table, plan.sources))
    try:
        table = pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as exc:
        raise CompactionError(f"the files of {plan.folder} do not share their columns: {exc}") from exc
    order = [(key, "ascending") for key in keys if key in table.column_names]
    return table.sort_by([*order, (SOURCE_BATCH, "ascending")]) if table.num_rows else table


def _source_table(source: tuple[int, Path]) -> pa.Table:
    """One file of a plan, each row with the batch that wrote it."""
    batch, path = source
    try:
        table = pq.ParquetFile(path).read()
    except (OSError, pa.ArrowException) as exc:
        raise CompactionError(f"{path} does not read: {exc}") from exc
    if "batch_id" in table.column_names:  # a partition column written into the file: the row's batch
        source_batch = table.column("batch_id").cast(pa.int64())
        table = table.drop_columns(["batch_id"])
        if SOURCE_BATCH not in table.column_names:
            table = table.append_column(SOURCE_BATCH, source_batch)
    if SOURCE_BATCH not in table.column_names:
        table = table.append_column(SOURCE_BATCH, pa.repeat(pa.scalar(batch, pa.int64()), table.num_rows))
    return table


@dataclass(frozen=True)
class Compacted:
    """One period folder compacted."""

    target: Path
    rows: int
    files_read: int
    folders_removed: int


def compact_folder(
    layout: DataLayout, kind: Kind, folder: Path, through: int, since: int | None = None
) -> Compacted | None:
    """Compact one period's folder of `kind` up to batch `through` (from batch `since` on when given: `plan_folder`),
    journalled; the caller holds the run lock and has finished any compaction a crash interrupted
    (`finish_interrupted`). None: nothing to merge."""
    plan = plan_folder(folder, through, since)
    if plan is None:
        return None
    if any(path == plan.target for _, path in plan.sources):
        # Folders older than a compacted file beside it: a finished pass leaves none. Replacing the file would make
        # a crash mid-way look like a finished rename to `finish_interrupted`.
        raise CompactionError(f"{plan.target} would be replaced by a file that holds it")
    table = compacted_table(plan, kind.keys)
    _write_journal(layout, plan)
    _step("journal", plan.target)
    blooms = {c: {"ndv": ROW_GROUP_ROWS, "fpp": 0.01} for c in kind.bloom if c in table.column_names}
    try:
        pq.write_table(
            table,
            plan.staging,
            compression="snappy",
            row_group_size=ROW_GROUP_ROWS,
            write_statistics=True,
            bloom_filter_options=blooms or None,
        )
    except BaseException:  # a full disk: nothing was renamed, nothing removed
        _roll_back(layout, plan.staging)
        raise
    _step("staged", plan.target)
    replace_files([(plan.staging, plan.target)])
    _step("renamed", plan.target)
    _remove_sources(plan.target, [path for _, path in plan.sources], plan.folders)
    _step("removed", plan.target)
    layout.compaction_journal.unlink()
    fsync_folder(layout.compaction_journal.parent)
    return Compacted(plan.target, table.num_rows, len(plan.sources), len(plan.folders))


def _step(name: str, target: Path) -> None:
    if step_hook is not None:
        step_hook(name, target)


def _write_journal(layout: DataLayout, plan: Plan) -> None:
    root = layout.root
    record = {
        "folder": plan.folder.relative_to(root).as_posix(),
        "first": plan.first,
        "last": plan.last,
        "target": plan.target.relative_to(root).as_posix(),
        "staging": plan.staging.relative_to(root).as_posix(),
        "sources": [path.relative_to(root).as_posix() for _, path in plan.sources],
        "folders": [path.relative_to(root).as_posix() for path in plan.folders],
        "started_at_ms": int(time.time() * 1000),
    }
    write_whole(layout.compaction_journal, json.dumps(record, indent=1))


def _roll_back(layout: DataLayout, staging: Path) -> None:
    staging.unlink(missing_ok=True)
    fsync_folder(staging.parent)
    layout.compaction_journal.unlink(missing_ok=True)
    fsync_folder(layout.compaction_journal.parent)


def _remove_sources(target: Path, sources: Sequence[Path], folders: Sequence[Path]) -> None:
    """Remove the files a compacted file holds (not itself), then their emptied batch folders, flushing each folder
    touched."""
    by_folder: dict[Path, list[Path]] = {folder: [] for folder in folders}
    for path in sources:
        if path != target:
            by_folder.setdefault(path.parent, []).append(path)
    removable = set(folders)

    def remove(folder: Path) -> set[Path]:
        """`folder`'s files of the plan removed, and the folder itself when it is one of the batch folders held;
        the folders whose entries changed."""
        changed = set()
        for path in by_folder[folder]:
            try:
                path.unlink()
                changed.add(folder)
            except FileNotFoundError:
                pass  # removed before a crash: `finish_interrupted` removes the rest
        if folder in removable and folder.is_dir():
            for left in os.scandir(folder):  # a dot file of a write that never finished: held by nothing
                if left.name.startswith(".") and left.is_file():
                    os.unlink(left.path)
            try:
                folder.rmdir()
            except OSError:
                return changed  # something newer landed in it: kept, read as a batch folder again
            changed.discard(folder)
            changed.add(folder.parent)
        return changed

    # Each removal waits on the file system's journal more than the CPU: the folders go side by side.
    with ThreadPoolExecutor(max_workers=IO_THREADS) as pool:
        touched = set().union(*pool.map(remove, list(by_folder)))
    for folder in sorted(touched):
        if folder.is_dir():
            fsync_folder(folder)


def finish_interrupted(layout: DataLayout) -> str | None:
    """Complete or roll back the compaction the journal names (a crash, a kill, a full disk stopped it): rolled
    back while its compacted file is not in place (the dot file removed; nothing else was touched), completed once
    it is (the files it holds removed). What was done, in words; None when there was nothing to finish. The
    caller holds the run lock."""
    journal = layout.compaction_journal
    if not journal.exists():
        return None
    root = layout.root
    try:
        record = json.loads(journal.read_text())
        staging, target = root / record["staging"], root / record["target"]
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink()  # written whole or not at all: one that does not read names nothing done
        fsync_folder(journal.parent)
        return None
    what = f"an interrupted compaction of {record['folder']} (batches {record['first']} to {record['last']})"
    if staging.exists() or not target.exists():
        _roll_back(layout, staging)
        return f"rolled back {what}"
    _remove_sources(target, [root / p for p in record["sources"]], [root / p for p in record["folders"]])
    journal.unlink()
    fsync_folder(journal.parent)
    return f"completed {what}"


# --- Every closed period -----------------------------------------------------------------------------------------


@dataclass
class CompactionReport:
    """What one pass did."""

    through: int | None = None
    """The newest batch it could take (None: the positions were unknown, nothing was compacted)."""
    periods: int = 0
    """Period folders compacted."""
    rows: int = 0
    files_read: int = 0
    files_written: int = 0
    folders_removed: int = 0
    seconds: float = 0.0
    finished: str | None = None
    """An interrupted compaction this pass completed or rolled back first."""
    failed: list[str] = field(default_factory=list)
    """Period folders left as written, with why."""
    label: str = "compaction"
    """Which pass: its messages begin so."""
    chunks: int = 0
    """Chunks of the quarantine and `released/` compacted (`compact_quarantine`)."""

    def took(self, done: Compacted) -> None:
        """One folder (a period's, or a chunk of the quarantine) compacted into one file, counted."""
        self.rows += done.rows
        self.files_read += done.files_read
        self.files_written += 1
        self.folders_removed += done.folders_removed

    def add(self, other: CompactionReport) -> CompactionReport:
        """`other`'s work (a pass over other folders at the same position) counted in this one's."""
        self.periods += other.periods
        self.chunks += other.chunks
        self.rows += other.rows
        self.files_read += other.files_read
        self.files_written += other.files_written
        self.folders_removed += other.folders_removed
        self.seconds += other.seconds
        self.finished = self.finished or other.finished
        self.failed += other.failed
        return self

    def describe(self) -> str:
        done = [
            *([f"{self.periods} period folder(s)"] if self.periods else []),
            *([f"{self.chunks} chunk(s) of the quarantine and released/"] if self.chunks else []),
        ]
        if self.through is None:
            head = f"{self.label}: nothing compacted (the stream's or Redis's position is unknown)"
        elif not done:
            head = f"{self.label}: nothing to compact up to batch {self.through}"
        else:
            head = (
                f"{self.label}: {' and '.join(done)} up to batch {self.through} in {self.seconds:.1f} s: "
                f"{self.files_read:,} files into {self.files_written:,}, {self.rows:,} rows, "
                f"{self.folders_removed:,} batch folders removed"
            )
        return "; ".join([head, *([self.finished] if self.finished else []), *self.failed])


def closed_pass(layout: DataLayout, closed: Iterable[str], through: int | None) -> CompactionReport:
    """What a reconciliation run compacts: the closed periods' batch folders (`compact_closed`), then the quarantine's
    and `released/`'s whole chunks (`compact_quarantine`), up to `through`. The caller holds the run lock."""
    return compact_closed(layout, closed, through).add(compact_quarantine(layout, through))


def open_pass(layout: DataLayout, open_periods: Iterable[str], through: int | None) -> CompactionReport:
    """What a pass of `adbill reconcile --every` compacts: the open periods' batches since their last pass
    (`compact_open`), then the quarantine's and `released/`'s chunk under way (`compact_quarantine(partial=True)`),
    up to `through`. The caller holds the run lock."""
    return compact_open(layout, open_periods, through).add(compact_quarantine(layout, through, partial=True))


def after_compacted(folder: Path) -> int | None:
    """The batch after the last one a compacted file of `folder`'s batch folders holds; None when it holds none."""
    last = None
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return None
    for entry in entries:
        if batch_of(entry.name) is None or not entry.is_dir():
            continue
        for file in os.scandir(entry.path):
            span = compacted_span(file.name)
            if span is not None and (last is None or span[1] > last):
                last = span[1]
    return None if last is None else last + 1


def compact_closed(
    layout: DataLayout, closed: Iterable[str], through: int | None, kinds: Sequence[Kind] = KINDS
) -> CompactionReport:
    """Compact the batch folders of every `closed` period of every kind up to batch `through`
    (`compactable_through`), after finishing an interrupted compaction; the caller holds the run lock. A period
    folder that fails (`CompactionError`) is left as written and said; the others go on."""
    return compact_periods(layout, closed, through, kinds)


def compact_open(
    layout: DataLayout, open_periods: Iterable[str], through: int | None, kinds: Sequence[Kind] = OPEN_KINDS
) -> CompactionReport:
    """The pass over the open periods (`OPEN_KINDS`, every kind: each reader skips what a compacted file
    supersedes): their batch folders up to batch `through` (`compactable_through`; the stream's newer batches are
    left as written, and merged by the next pass), with the same plan, journal and recovery as `compact_closed`.
    The caller holds the run lock.

    Each pass merges only the batches since the last pass's file (`after_compacted`), into a file of their own: a
    period open for an hour holds one file a pass (30 at a pass every 2 minutes) and the hot batches, and each row is
    written once while its period is open, not once a pass; the closed pass merges them into one."""
    return compact_periods(layout, open_periods, through, kinds, "compaction of the open periods", layered=True)


def open_periods(layout: DataLayout, closed: Iterable[str], kinds: Sequence[Kind] = OPEN_KINDS) -> list[str]:
    """The periods that hold batch folders of `kinds` and are not `closed`."""
    shut = set(closed)
    found: set[str] = set()
    for kind in kinds:
        root = kind.folder(layout)
        for entry in os.scandir(root) if root.is_dir() else ():
            period = entry.name.removeprefix("period=")
            if entry.name.startswith("period=") and period not in shut:
                found.add(period)
    return sorted(found)


def compact_periods(
    layout: DataLayout,
    periods: Iterable[str],
    through: int | None,
    kinds: Sequence[Kind],
    label: str = "compaction",
    layered: bool = False,
) -> CompactionReport:
    """Compact the batch folders of `periods` of `kinds` up to batch `through`, after finishing an interrupted
    compaction (`compact_closed`, `compact_open`); `layered`: only the batches after the folder's newest compacted
    file (`after_compacted`)."""
    began = time.monotonic()
    report = CompactionReport(through=through, finished=finish_interrupted(layout), label=label)
    if through is None:
        return report
    wanted = set(periods)

    def due() -> Iterator[_Due]:
        for kind in kinds:
            root = kind.folder(layout)
            if not root.is_dir():
                continue
            for entry in sorted(os.scandir(root), key=lambda e: e.name):
                if entry.name.startswith("period=") and entry.name.removeprefix("period=") in wanted:
                    folder = Path(entry.path)
                    yield _Due(kind, folder, through, after_compacted(folder) if layered else None, entry.name)

    report.periods = _compact_each(layout, due(), report)
    report.seconds = time.monotonic() - began
    return report


@dataclass(frozen=True)
class _Due:
    """One compaction to make: `folder`'s batches of `kind` after `since` up to `through`; `name` for a failure."""

    kind: Kind
    folder: Path
    through: int
    since: int | None
    name: str


def _compact_each(layout: DataLayout, due: Iterable[_Due], report: CompactionReport) -> int:
    """Make each compaction, in order: one that fails (`CompactionError`) is left as written and said in `report`,
    the others go on. How many compacted files were written."""
    compacted = 0
    for one in due:
        try:
            done = compact_folder(layout, one.kind, one.folder, one.through, since=one.since)
        except CompactionError as exc:
            report.failed.append(f"{one.kind.name} {one.name} left as written: {exc}")
            continue
        if done is not None:
            compacted += 1
            report.took(done)
    return compacted


# --- The quarantine and `released/` -----------------------------------------------------------------------------


QUARANTINE_CHUNK = 3_600
"""Batch ids a compacted file of the quarantine or `released/` holds at most: an hour at the 1 s trigger. Fixed
chunks (`first // QUARANTINE_CHUNK`), so a chunk compacted once is not rewritten by later passes."""

BATCH_ONLY_KINDS = (
    Kind("quarantine", lambda layout: layout.quarantine, ("event_id",)),
    Kind("released", lambda layout: layout.released, ("event_id",)),
)
"""The kinds kept by batch only (`batch_id=N/`, no period), compacted by chunks of batch ids (`compact_quarantine`);
their readers list through `read_batch_only`."""


def chunks_due(
    folder: Path, through: int, chunk: int = QUARANTINE_CHUNK, partial: bool = False
) -> list[tuple[int, int]]:
    """(first, last) batch id of every whole chunk of `folder`'s batch folders (`chunk` ids each, from 0) whose last
    id is at or below `through` and that holds two batch folders or more (a chunk compacted once holds one, until a
    batch folder of its ids appears), oldest first; with `partial`, then the chunk `through` falls in, up to
    `through` (the open pass: its batches so far, merged again with the next ones by each pass)."""
    held: dict[int, int] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in entries:
        batch = batch_of(entry.name)
        if batch is not None and entry.is_dir():
            held[batch // chunk] = held.get(batch // chunk, 0) + 1
    spans = [(n * chunk, (n + 1) * chunk - 1) for n, folders in sorted(held.items()) if folders >= 2]
    due = [(first, last) for first, last in spans if last <= through]
    if partial and held.get(through // chunk, 0) >= 2 and (through + 1) % chunk:
        due.append(((through // chunk) * chunk, through))  # `compact_folder` merges none when fewer than two are due
    return due


def compact_quarantine(
    layout: DataLayout,
    through: int | None,
    kinds: Sequence[Kind] = BATCH_ONLY_KINDS,
    chunk: int = QUARANTINE_CHUNK,
    partial: bool = False,
) -> CompactionReport:
    """Compact the quarantine's and `released/`'s batch folders, each whole chunk of `chunk` batch ids whose last is
    at or below `through` (`compactable_through`, `chunks_due`) into one file in the folder of the newest batch it
    holds (`batch_id=M/compacted-A-M.parquet`), with the plan, journal and recovery of `compact_folder`, after
    finishing an interrupted compaction; with `partial` (the open periods' pass), the chunk under way too, up to
    `through`. The caller holds the run lock. A chunk that fails (`CompactionError`) is left as written and said; the
    others go on."""
    began = time.monotonic()
    finished = finish_interrupted(layout)
    report = CompactionReport(through=through, finished=finished, label="compaction of the quarantine")
    if through is None:
        return report
    due = (
        _Due(kind, kind.folder(layout), last, first, f"batches {first} to {last}")
        for kind in kinds
        for first, last in chunks_due(kind.folder(layout), through, chunk, partial)
    )
    report.chunks = _compact_each(layout, due, report)
    report.seconds = time.monotonic() - began
    return report
