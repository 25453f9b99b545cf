"""A new checkpoint's epoch (`attribution.epoch`): what it sets aside of the batches it reads again, and which batch
Redis must have applied before each of its batches."""

from __future__ import annotations

import json
from pathlib import Path

from attribution.epoch import EPOCH_FILE, Epoch, prepare_epoch
from billing.layout import DataLayout


def _pin(layout: DataLayout, batch_id: int, catalog_version: int) -> None:
    layout.catalog_versions.mkdir(parents=True, exist_ok=True)
    (layout.catalog_versions / str(batch_id)).write_text(str(catalog_version))
    layout.decisions.mkdir(parents=True, exist_ok=True)
    (layout.decisions / f"{batch_id}.parquet").write_bytes(b"pinned")


def test_a_new_epoch_sets_aside_the_catalog_version_pinned_for_a_batch_that_left_no_file(tmp_path: Path) -> None:
    """The earlier checkpoint pinned batch 5's catalog version (before any file of the batch) and died: the new
    epoch's batch 5 would be priced with that old version. It is set aside; batches up to 4 keep theirs."""
    layout = DataLayout(tmp_path)
    folder = layout.ledger / "period=20260101T0000Z" / "batch_id=4"
    folder.mkdir(parents=True)
    (folder / "part-00000.parquet").write_bytes(b"x")
    _pin(layout, 4, 3)
    (layout.catalog_versions / "5").write_text("3")
    checkpoint = layout.checkpoint("billing")
    epoch = prepare_epoch(checkpoint, tmp_path, lambda: {"clicks": [0]}, 4, new_checkpoint=True)
    assert epoch.batch_id_base == 5 and epoch.applied_before == 4
    assert sorted(p.name for p in layout.catalog_versions.iterdir()) == ["4"]
    assert (layout.uncommitted / layout.catalog_versions.relative_to(tmp_path) / "5").read_text() == "3"
    assert json.loads((checkpoint / EPOCH_FILE).read_text())["applied_before"] == 4


def test_a_new_epoch_after_a_batch_redis_never_applied_sets_aside_its_files_and_both_pins(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    for batch_id in (3, 4):
        folder = layout.ledger / "period=20260101T0000Z" / f"batch_id={batch_id}"
        folder.mkdir(parents=True)
        (folder / "part-00000.parquet").write_bytes(b"x")
        _pin(layout, batch_id, batch_id)
    epoch = prepare_epoch(layout.checkpoint("billing"), tmp_path, lambda: {"clicks": [0]}, 3, new_checkpoint=True)
    assert epoch.batch_id_base == 5 and epoch.applied_before == 3
    assert sorted(p.name for p in layout.catalog_versions.iterdir()) == ["3"]
    assert sorted(p.name for p in layout.decisions.iterdir()) == ["3.parquet"]
    moved = layout.uncommitted / layout.checkpoints.relative_to(tmp_path)
    assert sorted(p.name for p in (moved / "catalog-versions").iterdir()) == ["4"]
    assert sorted(p.name for p in (moved / "decisions").iterdir()) == ["4.parquet"]


def test_each_batch_needs_the_batch_before_it_applied_and_an_epochs_first_the_last_one_redis_had() -> None:
    assert Epoch().needs_applied(0) == -1  # the very first batch needs nothing
    assert Epoch().needs_applied(7) == 6
    epoch = Epoch(batch_id_base=10, applied_before=7)  # batches 8 and 9 were set aside, never applied
    assert (epoch.needs_applied(10), epoch.needs_applied(11)) == (7, 10)
    assert Epoch(batch_id_base=10).needs_applied(10) == 0, "not recorded: any record of a batch applied"
