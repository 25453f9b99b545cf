"""Reconciliation's closed pass compacts the quarantine and `released/` by whole chunks of batch ids, at the position
of the stream's checkpoint and Redis (real Redis): `ops.reconcile.compact_closed_periods`."""

from __future__ import annotations

import pytest

from attribution.stream_position import BILLING_QUERY
from billing.store.compaction import QUARANTINE_CHUNK, read_batch_only
from billing.store.redis_totals import RedisTotals
from ops.reconcile import compact_closed_periods, reconcile_config, run_lock
from ops.settings import Settings
from tests.unit.test_quarantine_readers import names, write_quarantine

pytestmark = pytest.mark.integration


def test_the_closed_pass_compacts_the_quarantine_chunks_at_or_below_the_position(redis_settings: Settings) -> None:
    layout = redis_settings.layout
    last = QUARANTINE_CHUNK - 1
    for batch in (1, 2, last, last + 1, last + 2):
        write_quarantine(layout.root, batch)
    table = read_batch_only(layout.quarantine, ["offset", "batch_id"])
    assert table is not None
    rows = sorted(zip(table["offset"].to_pylist(), table["batch_id"].to_pylist(), strict=True))
    config = reconcile_config(redis_settings)
    with run_lock(config):
        unknown = compact_closed_periods(config)
    assert unknown.chunks == 0 and "position is unknown" in unknown.describe(), "no checkpoint: nothing"

    # The stream committed batch `last + 4` and Redis applied it: batches up to `last + 1` may be compacted, so the
    # first chunk (0 to `last`) is, and the second (from `last + 1`) waits for its end.
    checkpoint = layout.checkpoint(BILLING_QUERY)
    for folder in ("offsets", "commits"):
        (checkpoint / folder).mkdir(parents=True)
        (checkpoint / folder / str(last + 4)).write_text("v1\n{}\n")
    RedisTotals.from_url(redis_settings.redis_url, redis_settings.redis_prefix).apply_batch(BILLING_QUERY, last + 4, [])
    with run_lock(config):
        report = compact_closed_periods(config)
    assert report.through == last + 1 and report.chunks == 1 and report.periods == 0, report.describe()
    assert "1 chunk(s) of the quarantine and released/" in report.describe()
    assert names(layout.quarantine) == {
        f"batch_id={last}": [f"compacted-1-{last}.parquet"],
        f"batch_id={last + 1}": ["part-00000.parquet", "part-00001.parquet"],
        f"batch_id={last + 2}": ["part-00000.parquet", "part-00001.parquet"],
    }
    table = read_batch_only(layout.quarantine, ["offset", "batch_id"])
    assert table is not None
    assert sorted(zip(table["offset"].to_pylist(), table["batch_id"].to_pylist(), strict=True)) == rows
