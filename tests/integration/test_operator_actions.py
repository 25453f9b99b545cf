"""What operators do to a running system, on real Kafka, Spark and Redis: a new checkpoint, two reconciliations
at once, a lost Redis. Each must neither lose nor double a bill."""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from attribution.epoch import EPOCH_FILE, CheckpointRefusedError, newest_batch_id
from attribution.job import start
from billing.parquet_ledger import read_ledger
from billing.redis_totals import RedisTotals
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.simulator import SimulationConfig
from tests import oracle
from tests.integration.test_closing import T0, H, pairs, publish
from tests.integration.test_reconcile import read_back

pytestmark = pytest.mark.integration


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*.parquet")}


def test_a_new_checkpoint_is_refused_unless_asked_and_then_continues_without_overwriting_or_billing_twice(
    spark: SparkSession, settings: Settings
) -> None:
    catalog = SimulationConfig(events=10, seed=7).catalog()
    catalog.save(settings.catalog_file)
    ensure_schemas(settings)
    first = pairs("e1", T0 + 30 * 60_000, 80, catalog)
    publish(settings, first)
    config = stream_config(settings)
    queries = start(spark, config, catalog)
    try:
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
    before = {name: digests(settings.root / name) for name in ("ledger", "archive")}
    old_batches = set(read_ledger(settings.root / "ledger")["batch_id"].to_pylist())

    # The operator starts a new checkpoint (say, to change the shuffle partitions); more traffic arrives meanwhile.
    shutil.rmtree(settings.root / "checkpoints" / "billing")
    second = pairs("e2", T0 + H + 10 * 60_000, 80, catalog)
    publish(settings, second)
    with pytest.raises(CheckpointRefusedError, match="adbill stream --new-checkpoint"):
        start(spark, config, catalog)

    queries = start(spark, config, catalog, new_checkpoint=True)
    try:
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
    assert (settings.root / "checkpoints" / "billing" / EPOCH_FILE).exists()
    # Asking again on the checkpoint that now exists is refused: it is not new.
    with pytest.raises(CheckpointRefusedError, match="is not new"):
        start(spark, config, catalog, new_checkpoint=True)

    # No file of the earlier checkpoint was overwritten; the new epoch's batches come after its batches.
    for name, files in before.items():
        after = digests(settings.root / name)
        assert {path: after.get(path) for path in files} == files, name
    ledger = read_ledger(settings.root / "ledger").to_pylist()
    new_batches = {r["batch_id"] for r in ledger} - old_batches
    assert new_batches and min(new_batches) > max(old_batches)
    # One bill per click, every billable click billed, and Redis counted each batch once.
    assert max(Counter(r["click_id"] for r in ledger).values()) == 1
    expected = {
        row["click_id"]: row["amount_micros"]
        for row in oracle.billable(read_back(settings, len(first) + len(second)), catalog)
    }
    assert {r["click_id"]: r["amount_micros"] for r in ledger} == expected
    totals = RedisTotals.from_url(settings.redis_url, settings.redis_prefix)
    redis_micros = sum(t.micros for t in totals.all_ad_totals().values())
    assert redis_micros == sum(expected.values())
    # (a batch that read nothing, such as the one Spark runs to move the watermark on, writes no file)
    assert (totals.last_applied("billing") or -1) >= (newest_batch_id(settings.root) or 0)
