"""A new checkpoint for the billing query without losing or doubling a bill: the checkpoint's *epoch*.

Spark numbers micro-batches from 0 in each checkpoint, and a new checkpoint reads its topics from
`startingOffsets`. The job's outputs are keyed by batch id (the ledger's `batch_id=N/` folders, the Redis marker
of the last batch applied, the versions reconciliation compares), so a new checkpoint that restarted at batch 0 from
the earliest offsets would overwrite the old run's files, be skipped by Redis, and bill again what Kafka still holds.

So a checkpoint that starts over the data of an earlier one starts a new epoch, recorded in the checkpoint folder
(`CHECKPOINT/adbill-epoch.json`): its batch ids continue the earlier ones (the job writes batch `base + N`), and it
reads each topic from the offset after the last record the earlier checkpoints handed to the sink (every record read
is archived or quarantined with its offset, so the data folder itself says where they stopped). A batch the earlier
checkpoint had started and not finished (after the last batch Redis applied: its files may be partial, its figures
are nowhere) is set aside first (`DataLayout.uncommitted`), so the new epoch reads its records again and bills and
counts them. The stream's join
state does not carry over: a pair split across the change is billed by reconciliation (`missed_match`).

Starting over the data of an earlier checkpoint happens only when asked (`adbill stream --new-checkpoint`); the job
refuses otherwise and says what to do.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from billing.layout import EPOCH_FILE, DataLayout
from billing.store.compaction import COMPACTED, read_listed
from billing.store.durable import write_whole


class CheckpointRefusedError(RuntimeError):
    """The checkpoint is new, but the data folder or Redis holds the output of an earlier one."""


@dataclass(frozen=True)
class Epoch:
    """Where a checkpoint's batch ids start, and the offsets it starts reading from (None: the earliest)."""

    batch_id_base: int = 0
    starting_offsets: dict[str, dict[int, int]] | None = None
    applied_before: int | None = None
    """The last batch Redis had applied when the epoch started (its first batch needs Redis to hold it); None when
    not recorded (an epoch started by an earlier version, or over a Redis that had lost its data)."""

    def needs_applied(self, batch_id: int) -> int:
        """The batch Redis must have applied before the job decides batch `batch_id` (-1: none): the one before it,
        or, for the epoch's first batch, the last one Redis had applied when the epoch started (the batches between,
        set aside, were never applied; unknown: any record of a batch applied)."""
        if batch_id > self.batch_id_base:
            return batch_id - 1
        if batch_id == 0:
            return -1
        return self.applied_before if self.applied_before is not None else 0

    def spark_starting_offsets(self, topic: str) -> str | None:
        """`startingOffsets` of one topic's source, as Spark's JSON, or None for the default."""
        if self.starting_offsets is None or topic not in self.starting_offsets:
            return None
        parts = self.starting_offsets[topic]
        return json.dumps({topic: {str(p): o for p, o in sorted(parts.items())}})


def checkpoint_started(checkpoint: Path) -> bool:
    """The checkpoint has planned at least one batch (Spark wrote `offsets/N`)."""
    offsets = checkpoint / "offsets"
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def epoch_base(checkpoint: Path) -> int:
    """The first batch id of the checkpoint's epoch (0 without an epoch file)."""
    epoch_file = checkpoint / EPOCH_FILE
    return int(json.loads(epoch_file.read_text())["batch_id_base"]) if epoch_file.exists() else 0


def last_committed_batch(checkpoint: Path) -> int | None:
    """The batch id (as the outputs carry it: the epoch's base + Spark's) of the newest batch the checkpoint
    committed; for a new epoch that has committed none yet, the last batch of the earlier checkpoints (base - 1).
    None when no batch was ever committed. The files of a newer batch may be partial: the job is replaying it."""
    base = epoch_base(checkpoint)
    commits = checkpoint / "commits"
    committed = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    if committed:
        return base + max(committed)
    return base - 1 if base > 0 else None


class CommittedBatch:
    """The last batch the stream's checkpoint committed (`last_committed_batch`), read once, at the first question;
    None (no limit) without a checkpoint (a data folder closed by a back-fill). Reconciliation and the audit read
    the archive and the ledger up to it."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self._asked = False
        self._batch: int | None = None

    def batch(self) -> int | None:
        if not self._asked:
            if checkpoint_started(self.checkpoint) or (self.checkpoint / EPOCH_FILE).exists():
                committed = last_committed_batch(self.checkpoint)
                self._batch = -1 if committed is None else committed
            self._asked = True
        return self._batch


def batch_folders(data_dir: Path) -> list[tuple[int, Path]]:
    """Every `batch_id=N` folder of the ledger, archive, quarantine, unbilled clicks and released records, with its
    N."""
    layout = DataLayout(data_dir)
    batches = (
        (layout.ledger, "period=*/batch_id=*"),
        (layout.archive, "*/period=*/batch_id=*"),
        (layout.quarantine, "batch_id=*"),
        (layout.unbilled, "period=*/batch_id=*"),
        (layout.not_charged, "period=*/batch_id=*"),
        # A batch that released quarantined records (`attribution.release`): left here, its records would count as
        # released while their archive rows are set aside, and no later batch would release them again.
        (layout.released, "batch_id=*"),
    )
    return [
        (int(folder.name.removeprefix("batch_id=")), folder)
        for base, pattern in batches
        for folder in base.glob(pattern)
        if folder.name.removeprefix("batch_id=").isdigit()
    ]


def set_aside_batches_after(data_dir: Path, last_complete: int) -> list[Path]:
    """Move the folders of every batch after `last_complete` out of the data (to `DataLayout.uncommitted`, in the
    same tree): a batch no checkpoint committed and Redis never applied, whose files may be partial. The new
    epoch reads their records again from Kafka. Returns where they went. CheckpointRefusedError, moving nothing, when
    one of them holds a compacted file (`billing.store.compaction`: rows of earlier batches too)."""
    layout = DataLayout(data_dir)
    doomed = [(batch, folder) for batch, folder in batch_folders(data_dir) if batch > last_complete]
    compacted = [folder for _, folder in doomed if any(folder.glob(f"{COMPACTED}*.parquet"))]
    if compacted:
        # A compacted folder holds rows of committed batches too (`billing.store.compaction`): moving it would lose
        # them. Compaction never takes a batch this recent; a folder that holds one means the positions went back.
        raise CheckpointRefusedError(
            f"the batch folders after batch {last_complete} that a new epoch would set aside hold compacted files of "
            f"earlier batches, which it must not move: {', '.join(str(f) for f in compacted[:3])}. The checkpoint "
            "or Redis is older than the data folder: restore them, or Redis with `adbill restore-redis`"
        )
    moved = []
    for batch, folder in doomed:
        if batch > last_complete:
            target = layout.uncommitted / folder.relative_to(layout.root)
            if target.exists():  # set aside by an earlier try: the newer copy replaces it
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            folder.rename(target)
            moved.append(target)
    return moved + set_aside_pins_after(data_dir, last_complete)


def set_aside_pins_after(data_dir: Path, last_complete: int) -> list[Path]:
    """Move what the stream pinned for each batch after `last_complete` (the outcome of each bill, and the catalog
    version it priced the batch with, `DataLayout.decisions` and `.catalog_versions`) out of the way, to
    `DataLayout.uncommitted`: a new epoch's batch of that id holds other bills, read later, to be priced and decided
    with the catalog and the totals of its own time. A batch's catalog version is pinned before any of its files is
    written, so a pin may stand for a batch that left no folder."""
    layout = DataLayout(data_dir)
    pins = [
        *(sorted(layout.decisions.glob("*.parquet")) if layout.decisions.is_dir() else []),
        *(sorted(layout.catalog_versions.iterdir()) if layout.catalog_versions.is_dir() else []),
    ]
    moved = []
    for pin in pins:
        name = pin.name.removesuffix(".parquet")
        if name.isdigit() and int(name) > last_complete:
            target = layout.uncommitted / pin.relative_to(layout.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            pin.replace(target)
            moved.append(target)
    return moved


def newest_batch_id(data_dir: Path) -> int | None:
    """The largest batch id of the ledger, archive and quarantine folders (None: no batch written yet)."""
    return max((batch for batch, _ in batch_folders(data_dir)), default=None)


def offsets_read(data_dir: Path, topics: list[str]) -> dict[str, dict[int, int]]:
    """Per topic and partition, the offset after the last record the data folder holds (archived or quarantined).

    The archive's batch files are listed by `read_listed` (`billing.store.compaction`: the open periods' are
    compacted while a start reads them, no lock here): a file a compaction removes between the listing and the
    reading makes it list again."""
    out: dict[str, dict[int, int]] = {topic: {} for topic in topics}
    layout = DataLayout(data_dir)
    for folder, depth in ((layout.archive, 3), (layout.quarantine, 1)):

        def read(files: list[Path], base: Path = folder) -> pa.Table | None:
            if not files:
                return None
            dataset = ds.dataset(
                [str(f) for f in files], format="parquet", partitioning="hive", partition_base_dir=str(base)
            )
            return dataset.to_table(columns=["topic", "partition", "offset"], filter=pc.field("topic").isin(topics))

        table = read_listed(folder, depth, read)
        if table is None:
            continue
        grouped = table.group_by(["topic", "partition"]).aggregate([("offset", "max")])
        for row in grouped.to_pylist():
            parts = out[row["topic"]]
            parts[row["partition"]] = max(parts.get(row["partition"], 0), row["offset_max"] + 1)
    return out


def prepare_epoch(
    checkpoint: Path,
    data_dir: Path,
    partitions: Callable[[], dict[str, list[int]]],
    redis_last_applied: int | None,
    new_checkpoint: bool,
) -> Epoch:
    """The epoch of the checkpoint the job is about to start (see the module's docstring).

    `partitions()` maps each topic the query reads to its partitions (a new epoch names a starting offset for
    each; a partition never read starts from its earliest); it is asked only when a new epoch starts.
    CheckpointRefusedError when the checkpoint is new over earlier output and `new_checkpoint` is not set, or
    when `new_checkpoint` is set on a checkpoint that has already started."""
    epoch_file = checkpoint / EPOCH_FILE
    if new_checkpoint and checkpoint_started(checkpoint):
        raise CheckpointRefusedError(
            f"--new-checkpoint: {checkpoint} is not new (it has planned batches); the job continues it as it is. "
            "Move it aside first if a new checkpoint is what you want."
        )
    if epoch_file.exists():
        data = json.loads(epoch_file.read_text())
        offsets = data.get("starting_offsets")
        return Epoch(
            batch_id_base=int(data["batch_id_base"]),
            starting_offsets=None
            if offsets is None
            else {t: {int(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()},
            applied_before=None if data.get("applied_before") is None else int(data["applied_before"]),
        )
    if checkpoint_started(checkpoint):
        return Epoch()
    newest = max(newest_batch_id(data_dir) or -1, redis_last_applied if redis_last_applied is not None else -1)
    if newest < 0:
        return Epoch()  # the first start over an empty data folder
    if not new_checkpoint:
        raise CheckpointRefusedError(
            f"the checkpoint {checkpoint} is new, but {data_dir} and Redis hold batches up to {newest} of an earlier "
            "checkpoint: starting over would overwrite their files and bill again what Kafka still holds. Restore "
            "the earlier checkpoint folder, or start a new epoch with `adbill stream --new-checkpoint`: its batches "
            f"continue from {newest + 1} and it reads each topic from where the earlier checkpoint stopped."
        )
    if redis_last_applied is not None and newest > redis_last_applied:
        # The earlier checkpoint stopped in the middle of a batch: written in part or whole, never applied to Redis
        # nor committed. Its records are read again by this epoch; its files would otherwise stand for them.
        set_aside_batches_after(data_dir, redis_last_applied)
    else:
        set_aside_pins_after(data_dir, newest)
    topics = partitions()
    read = offsets_read(data_dir, list(topics))
    starting = {t: {p: read[t].get(p, -2) for p in sorted(parts)} for t, parts in topics.items()}
    epoch = Epoch(batch_id_base=newest + 1, starting_offsets=starting, applied_before=redis_last_applied)
    write_whole(
        epoch_file,
        json.dumps(
            {
                "batch_id_base": epoch.batch_id_base,
                "starting_offsets": {t: {str(p): o for p, o in parts.items()} for t, parts in starting.items()},
                "applied_before": redis_last_applied,
                "created_at_ms": int(time.time() * 1000),
            },
            indent=1,
        ),
    )
    return epoch
