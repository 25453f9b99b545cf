"""Faults that overlap, on real Kafka, Spark and Redis: Redis lost (SIGKILL, its data folder removed) while a
reconciliation runs, between the run's correction file and its Redis update. The operator restores Redis and runs
the job and reconciliation again: every correction is booked once, in the files and in Redis, and the books
balance."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from attribution.audit import audit
from attribution.job import start
from attribution.restore import restore_redis
from billing.periods import Periods
from billing.store.export_files import read_manifest
from ops.process import free_port, port_open
from ops.reconcile import reconcile, reconcile_config
from ops.redis_service import LocalRedis
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.simulator import SimulationConfig
from tests.integration.test_closing_follows_stream import P0, P1, T0, H, pairs, publish
from tests.integration.test_reconcile import corrections
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration


def lose(own_redis: LocalRedis, data_dir: Path) -> None:
    """SIGKILL Redis and remove its data folder (its append-only file with it)."""
    pid = own_redis.process.running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    if own_redis.process.popen is not None:
        own_redis.process.popen.wait(timeout=30)
    # A child Redis forked to rewrite its append-only file holds the port until it ends: kill it too.
    subprocess.run(["pkill", "-KILL", "-f", f"redis-.*127\\.0\\.0\\.1:{own_redis.port}"], check=False)
    deadline = time.monotonic() + 60
    while port_open("127.0.0.1", own_redis.port) and time.monotonic() < deadline:
        time.sleep(0.2)
    shutil.rmtree(data_dir)


def test_redis_lost_while_a_reconciliation_runs_books_each_correction_once_after_the_restore(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    own_redis = LocalRedis(data_dir=tmp_path / "redis", port=free_port(), run_dir=tmp_path / "redis-run")
    own_redis.start()
    settings = dataclasses.replace(settings, redis_url=own_redis.url, redis_timeout_ms=1_000)
    catalog = SimulationConfig(events=10, seed=12).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    queries: list = []
    try:
        publish(settings, pairs("o0", T0 + 30 * 60_000, 40, catalog) + pairs("o1", T0 + H + 30 * 60_000, 40, catalog))
        queries = start(spark, stream_config(settings))
        queries[0].processAllAvailable()
        # Behind the watermark: the stream archives them, reconciliation books them as corrections.
        publish(
            settings, pairs("late", T0 + 20 * 60_000, 10, catalog) + pairs("late1", T0 + H + 5 * 60_000, 6, catalog)
        )
        queries[0].processAllAvailable()
        queries[0].stop()

        # Redis dies in the middle of the run: after the first period's corrections are on disk, before Redis has
        # them. The run fails (its Redis calls give up), having closed nothing that Redis does not know.
        rc = reconcile_config(settings)
        lost: list[str] = []

        def progress(message: str) -> None:
            if message.endswith("new correction(s) written") and not lost:
                lost.append(message)
                lose(own_redis, tmp_path / "redis")

        with pytest.raises(redis.RedisError):
            reconcile(spark, rc, catalog, progress=progress)
        assert lost, "Redis was lost during the run"
        written = corrections(settings)
        assert written, "the run wrote corrections before Redis went"

        # The operator: Redis back, empty; restore it from the data folder; start the job; reconcile again.
        own_redis.start()
        totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
        restored = restore_redis(settings.root, totals, catalog, Periods(), "billing")
        assert restored.corrections == len(written)
        queries = start(spark, stream_config(settings))
        queries[0].processAllAvailable()  # the job's heartbeat again: reconciliation may close
        queries[0].stop()
        again = reconcile(spark, rc, catalog)
        assert again.closed == [P0, P1], again
    finally:
        for query in queries:
            if query.isActive:
                query.stop()

    every = corrections(settings)
    assert len(every) == len({c.correction_id for c in every}), "one copy of each correction, across both runs"
    assert {c.click_id for c in every} >= {c.click_id for c in written}
    # Redis: each closed period's figures are its export's, corrections counted once.
    figures = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    currency_of = {ad.ad_id: ad.currency for ad in catalog}
    for period in (P0, P1):
        manifest = read_manifest(settings.root / "exports" / period)
        micros: dict[str, int] = {}  # per currency: the export's figures are never added across two
        for (p, ad_id), t in figures.all_ad_totals().items():
            if p == period:
                micros[currency_of[ad_id]] = micros.get(currency_of[ad_id], 0) + t.micros
        for ad in catalog:
            applied = int(figures.client.hget(figures.keys.corrections(period, "ad", ad.ad_id), "micros") or 0)
            micros[ad.currency] = micros.get(ad.currency, 0) + applied
        exported = manifest.total_micros_by_currency
        assert {c: m for c, m in micros.items() if m} == {c: m for c, m in exported.items() if m}, (period, micros)
    assert all(a.balanced for a in audit(spark, rc, catalog)), "the books balance, to the click and the micro"
    own_redis.stop()
