"""The readers of the quarantine and `released/` (kept by batch only: `batch_id=N/`), whose folders compaction merges
(`billing.store.compaction`): a release's held records (`attribution.release.held_records`, `settled_keys`), the
settled records (`billing.store.released.released_table`, which `data_versions` reads), `restore-redis`' quarantine
(`attribution.restore._quarantine`, with `settled_quarantine`), a new epoch's `offsets_read`, `newest_batch_id` and
set-aside guard, and the click finder (`ClickFiles.rows_of`). On files written as the stream writes them: the same
answers, each row with its own batch, before a compaction, with a compaction stopped after each of its steps (the
compacted file beside the batch files it holds), once the next holder of the run lock finished it, and after."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from attribution.batch_output import write_batch_files
from attribution.decode import QUARANTINE_COLUMNS
from attribution.epoch import CheckpointRefusedError, newest_batch_id, offsets_read, set_aside_batches_after
from attribution.release import held_records, release_quarantined, settled_keys, settled_quarantine
from attribution.restore import _quarantine
from billing.layout import DataLayout
from billing.periods import Periods
from billing.schemas import schema_text
from billing.store import compaction
from billing.store.click_files import ClickFiles, read_located
from billing.store.compaction import STEPS, Kind, compact_folder
from billing.store.data_versions import data_versions
from billing.store.released import released_table
from ops.reconcile import ReconcileConfig, run_lock
from tests.batch_files import T0, stopped_at

QUARANTINE_SCHEMA = pa.schema(
    [
        ("reason", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
        ("received_ms", pa.int64()), ("value", pa.binary()), ("value_size", pa.int32()),
        ("value_sha256", pa.string()), ("event_id", pa.string()), ("ad_id", pa.string()),
        ("event_time", pa.int64()), ("batch_id", pa.int64()),
    ]
)  # fmt: skip
assert tuple(QUARANTINE_SCHEMA.names[:-1]) == QUARANTINE_COLUMNS
CLICK = json.loads(schema_text("click"))
CLICK["fields"].append({"name": "placement", "type": ["null", "string"], "default": None})
KNOWN_LATER = {7: json.dumps(CLICK), 8: json.dumps(CLICK)}
"""The schema ids the registry learns after the records arrived: 7 before batch 8's release, 8 before batch 10's."""


def framed(schema_id: int, click_id: str) -> bytes:
    body = io.BytesIO()
    record = {"click_id": click_id, "ad_id": "ad-1", "user_id": "u1", "event_time": T0 + 1_000, "placement": "feed"}
    fastavro.schemaless_writer(body, fastavro.parse_schema(CLICK), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


def write_quarantine(root: Path, batch: int) -> None:
    """Batch `batch`'s quarantine as the stream writes it (two tasks' files, `batch_id` in the path): a record of a
    schema id the registry learns later (7 in odd batches, 8 in even ones), a body that does not decode, and a bad
    copy of the click `c-bad` in batch 3."""
    rows: list[dict[str, Any]] = []
    for task in (0, 1):
        offset = batch * 10 + task * 5
        common = {"topic": "clicks", "partition": task, "received_ms": T0 + batch * 1_000, "batch_id": batch}
        value = framed(7 if batch % 2 else 8, f"c-held-{batch}-{task}")
        rows.append({**common, "reason": "unknown_schema", "offset": offset, "value": value, "ad_id": None})
        rows.append({**common, "reason": "undecodable", "offset": offset + 1, "value": b"junk", "ad_id": None})
        if batch == 3 and task == 1:
            rows.append(
                {**common, "reason": "missing_field", "offset": offset + 2, "value": b"{}", "event_id": "c-bad"}
                | {"ad_id": "ad-1", "event_time": T0 + 2_000}
            )
        table = pa.Table.from_pylist(rows[-3 if batch == 3 and task == 1 else -2 :], schema=QUARANTINE_SCHEMA)
        write_batch_files(table, DataLayout(root).quarantine, ("batch_id",), f"part-{task:05d}.parquet", prune=False)


def release(root: Path, batch: int, known: dict[int, str]) -> int:
    """The stream's release in batch `batch` of the held records of the schema ids `known`; how many it settled."""
    layout = DataLayout(root)
    return release_quarantined(layout, batch, {"click": known}, {"clicks": "click"}, Periods(), {"ad-1": "adv-1"}).count


def write_folder(root: Path) -> None:
    """Batches 1 to 6 of bad input, the releases of batches 8 (schema id 7) and 10 (id 8), and batch 11's bad input."""
    for batch in range(1, 7):
        write_quarantine(root, batch)
    assert release(root, 8, {7: KNOWN_LATER[7]}) == 6
    assert release(root, 10, KNOWN_LATER) == 6
    write_quarantine(root, 11)


QUARANTINE = Kind("quarantine", lambda layout: layout.quarantine, ("event_id",))
RELEASED = Kind("released", lambda layout: layout.released, ("event_id",))


def compact(root: Path, through: int) -> list[compaction.Compacted | None]:
    """The quarantine's and `released/`'s batch folders up to batch `through` merged, each into one file."""
    layout = DataLayout(root)
    return [compact_folder(layout, kind, kind.folder(layout), through) for kind in (QUARANTINE, RELEASED)]


def answers(root: Path) -> dict[str, Any]:
    """What every reader of the quarantine and `released/` answers, each row with the batch it gives it."""
    layout = DataLayout(root)

    def rows(table: pa.Table, *columns: str) -> list[tuple[Any, ...]]:
        return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))

    bad_columns = ["reason", "topic", "partition", "offset", "ad_id"]
    stories = read_located(ClickFiles(layout).rows_of("c-bad"))
    released = released_table(layout)
    return {
        "held": {
            (before, replaying): rows(held_records(layout, before, replaying), "offset", "batch_id")
            for before in (1, 3, 4, 6, 7, 9, 12)
            for replaying in (None, 8, 10)
        },
        "released": rows(released, "offset", "batch_id", "quarantine_batch_id", "released_by", "reason"),
        "settled": {replaying: sorted(settled_keys(layout, replaying)) for replaying in (None, 8, 10)},
        "restore": {
            through: rows(
                settled_quarantine(layout, _quarantine(layout, bad_columns, through), through), "offset", "reason"
            )
            for through in (0, 2, 3, 5, 8, 9, 11)
        },
        "versions": data_versions(layout, Periods()),
        "offsets": offsets_read(root, ["clicks"]),
        "newest": newest_batch_id(root),
        "story": sorted((r["found_in"], r["batch_id"], r["offset"], r["reason"]) for r in stories),
    }


def names(folder: Path) -> dict[str, list[str]]:
    return {p.name: sorted(f.name for f in p.iterdir()) for p in sorted(folder.iterdir())}


def test_each_reader_gives_the_same_rows_and_batches_before_and_after_a_compaction(tmp_path: Path) -> None:
    write_folder(tmp_path)
    layout = DataLayout(tmp_path)
    before = answers(tmp_path)
    assert before["story"] == [("quarantine", 3, 37, "missing_field")]
    assert before["held"][(7, None)] == [] and before["held"][(12, None)] == [(110, 11), (115, 11)]
    # A replay of batch 10 settles its records again: each with the batch that quarantined it.
    assert before["held"][(7, 10)] == [(20, 2), (25, 2), (40, 4), (45, 4), (60, 6), (65, 6)]
    assert before["held"][(4, 10)] == [(20, 2), (25, 2)]
    assert {b for _, b, q, *_ in before["released"] for b in (b, q)} == {1, 2, 3, 4, 5, 6, 8, 10}

    done = compact(tmp_path, 10)  # the quarantine's 1 to 6 (11 is newer), `released/`'s 8 and 10
    assert [(d.target.name, d.rows, d.files_read) for d in done if d] == [
        ("compacted-1-6.parquet", 25, 12),
        ("compacted-8-10.parquet", 12, 2),
    ]
    assert names(layout.quarantine) == {
        "batch_id=11": ["part-00000.parquet", "part-00001.parquet"],
        "batch_id=6": ["compacted-1-6.parquet"],
    }
    assert names(layout.released) == {"batch_id=10": ["compacted-8-10.parquet"]}
    assert answers(tmp_path) == before

    # The next batch releases batch 11's held records only: none of those the compacted files hold again.
    assert release(tmp_path, 12, KNOWN_LATER) == 2
    assert [r[:3] for r in answers(tmp_path)["released"] if r[1] == 12] == [(110, 12, 11), (115, 12, 11)]
    # A new epoch never moves a compacted folder of the quarantine or of `released/`: it refuses, moving nothing.
    with pytest.raises(CheckpointRefusedError, match="compacted"):
        set_aside_batches_after(tmp_path, 5)
    assert "batch_id=6" in names(layout.quarantine) and "batch_id=10" in names(layout.released)


@pytest.mark.parametrize("step", STEPS)
def test_a_compaction_stopped_at_each_step_gives_the_same_answers_and_is_finished_by_the_next_holder_of_the_lock(
    tmp_path: Path, step: str, template: Callable[[], Path]
) -> None:
    root = tmp_path / step
    shutil.copytree(template(), root)
    layout = DataLayout(root)
    before = answers(root)
    for kind in (QUARANTINE, RELEASED):
        stopped_at(step, lambda kind=kind: compact_folder(layout, kind, kind.folder(layout), 10))
        # A reader that takes no lock meets the compacted file beside the batch files it holds, or not yet.
        assert answers(root) == before, (step, kind.name)
        with run_lock(ReconcileConfig(data_dir=root, redis_url="", redis_prefix="")):
            assert not layout.compaction_journal.exists()
        assert answers(root) == before, (step, kind.name)
    renamed = step in ("renamed", "removed")
    assert ("batch_id=1" in names(layout.quarantine)) is not renamed
    assert not [p for p in root.rglob(".*") if p.is_file()], step
    compact(root, 10)
    assert answers(root) == before


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """A data folder written once for the parametrized tests."""
    made: list[Path] = []

    def get() -> Path:
        if not made:
            made.append(tmp_path_factory.mktemp("template"))
            write_folder(made[0])
        return made[0]

    return get
