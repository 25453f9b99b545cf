"""What operators do to a running system, on real Kafka, Spark and Redis: a new checkpoint, two reconciliations
at once, a lost Redis. Each must neither lose nor double a bill."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

from attribution.epoch import EPOCH_FILE, CheckpointRefusedError, newest_batch_id
from attribution.job import start
from billing.events import Click
from billing.schemas import schema_text, subject_of
from billing.store.parquet_ledger import read_ledger
from billing.store.schema_registry import open_registry
from ops.settings import Settings
from ops.stack import ensure_schemas
from ops.streaming import stream_config
from producers.publisher import EventPublisher
from producers.simulator import SimulationConfig
from producers.wire import EventSerializer, encode_body, frame, parse_avro_schema
from tests import oracle
from tests.conftest import child_env
from tests.integration.test_closing_follows_stream import T0, H, pairs, publish
from tests.integration.test_reconcile import read_back
from tests.redis_figures import RedisFigures
from tests.web_support import login

pytestmark = pytest.mark.integration


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*.parquet")}


def test_a_new_checkpoint_is_refused_unless_asked_and_then_continues_without_overwriting_or_billing_twice(
    spark: SparkSession, settings: Settings
) -> None:
    catalog = SimulationConfig(events=10, seed=7).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    first = pairs("e1", T0 + 30 * 60_000, 80, catalog)
    publish(settings, first)
    config = stream_config(settings)
    queries = start(spark, config)
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
        start(spark, config)

    queries = start(spark, config, new_checkpoint=True)
    try:
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
    assert (settings.root / "checkpoints" / "billing" / EPOCH_FILE).exists()
    # Asking again on the checkpoint that now exists is refused: it is not new.
    with pytest.raises(CheckpointRefusedError, match="is not new"):
        start(spark, config, new_checkpoint=True)

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
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    redis_micros = sum(t.micros for t in totals.all_ad_totals().values())
    assert redis_micros == sum(expected.values())
    # (a batch that read nothing, such as the one Spark runs to move the watermark on, writes no file)
    assert (totals.last_applied("billing") or -1) >= (newest_batch_id(settings.root) or 0)


def api_figures(settings: Settings, catalog, periods: list[str], at_ms: int) -> dict:  # type: ignore[no-untyped-def]
    """Every figure the API shows an admin: each advertiser's dashboard and corrections in each period, finance,
    the exports and the health page's counts (not the job's own progress records, which it writes anew)."""
    from web.access import Role
    from web.app import create_app

    accounts = settings.accounts_store()
    if accounts.get("root") is None:
        accounts.add("root", Role.ADMIN, PASSWORD)
    # the app's clock held at `at_ms`: the dashboards' default range (the month to date) ends on its day, and two reads
    # on either side of a UTC midnight would differ by a day that holds no data
    client = create_app(settings, clock=lambda: at_ms, cache_s=0).test_client()
    assert login(client, "root", PASSWORD).status_code == 302
    out: dict = {"finance": {}, "dashboards": {}, "corrections": {}}
    for period in periods:
        out["finance"][period] = client.get(f"/api/v1/finance?period={period}").json
        for adv in catalog.advertiser_ids:
            out["dashboards"][(adv, period)] = client.get(f"/api/v1/advertisers/{adv}/dashboard?period={period}").json
    for adv in catalog.advertiser_ids:
        out["corrections"][adv] = client.get(f"/api/v1/advertisers/{adv}/corrections?limit=500").json
    out["exports"] = client.get("/api/v1/exports").json
    health = client.get("/api/v1/health").json
    health.pop("queries")
    health.pop("compaction")  # the upkeep's own record of its last passes: lost with Redis, kept again by the next
    out["health"] = health
    out["periods"] = client.get("/api/v1/periods").json
    return _without_wall_clock(out)


def _without_wall_clock(doc):  # type: ignore[no-untyped-def]
    """`doc` without the figures that follow the wall clock (how long ago data was billed, a run finished, what Kafka
    holds now)."""
    if isinstance(doc, dict):
        return {k: _without_wall_clock(v) for k, v in doc.items() if k not in ("freshness", "status", "kafka")}
    if isinstance(doc, list):
        return [_without_wall_clock(v) for v in doc]
    return doc


def _failure_of(query, deadline_s: float = 30.0):  # type: ignore[no-untyped-def]
    """The failure that stopped `query`: the job's query says it a moment after it stops being active."""
    import time

    deadline = time.monotonic() + deadline_s
    while query.exception() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return query.exception()


PASSWORD = "a long operator password 42"


def test_redis_lost_is_restored_by_one_command_to_every_figure_it_showed_and_refused_while_the_job_runs(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    import dataclasses
    import signal
    import subprocess
    import time

    from attribution.audit import audit
    from attribution.restore import JobRunningError, restore_redis
    from billing.events import Impression
    from billing.periods import Periods
    from ops.process import free_port, port_open
    from ops.reconcile import reconcile, reconcile_config, record_audit
    from ops.redis_service import LocalRedis

    port = free_port()
    own_redis = LocalRedis(data_dir=tmp_path / "redis", port=port, run_dir=tmp_path / "redis-run")
    own_redis.start()
    settings = dataclasses.replace(settings, redis_url=own_redis.url)
    queries: list = []
    try:
        catalog = SimulationConfig(events=10, seed=8).catalog()
        settings.catalog_store().start(catalog)
        ensure_schemas(settings)
        publish(settings, pairs("r0", T0 + 30 * 60_000, 40, catalog) + pairs("r1", T0 + H + 30 * 60_000, 40, catalog))
        queries = start(spark, stream_config(settings))
        queries[0].processAllAvailable()
        publish(settings, pairs("late", T0 + 20 * 60_000, 10, catalog))  # behind the watermark: corrections
        queries[0].processAllAvailable()
        rc = reconcile_config(settings)
        report = reconcile(spark, rc, catalog)  # both periods are long past their horizon: closed, with corrections
        assert report.closed == ["20260101T0000Z", "20260101T0100Z"] and report.additions > 0
        record_audit(rc, audit(spark, rc, catalog))
        periods = ["20260101T0000Z", "20260101T0100Z"]
        read_at = time.time_ns() // 1_000_000
        before = api_figures(settings, catalog, periods, read_at)
        assert before["finance"]["20260101T0000Z"]["period"]["closed"] is True

        # Redis dies and comes back empty: its append-only file is gone.
        pid = own_redis.process.running_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        if own_redis.process.popen is not None:
            own_redis.process.popen.wait(timeout=30)  # reaped, not left a zombie
        # A child Redis forked to rewrite its append-only file holds the port until it ends: kill it too.
        subprocess.run(["pkill", "-KILL", "-f", f"redis-.*127\\.0\\.0\\.1:{port}"], check=False)
        deadline = time.monotonic() + 60
        while port_open("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(tmp_path / "redis")
        own_redis.start()
        totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
        assert totals.periods() == []

        # While the job runs, the restore is refused; the job refuses to count a batch into the empty Redis.
        with pytest.raises(JobRunningError, match="stop it first"):
            restore_redis(settings.root, totals, catalog, Periods(), "billing", wait_s=2)
        publish(settings, [Impression("after-loss", next(iter(catalog)).ad_id, "u-after", T0 + H + 45 * 60_000)])
        deadline = time.monotonic() + 120
        while queries[0].isActive and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "restore-redis" in str(_failure_of(queries[0]))
        restored = restore_redis(settings.root, totals, catalog, Periods(), "billing")
        assert restored.closed_periods == 2 and restored.corrections == report.additions
        # The job comes back, replays the batch Redis refused: counted once (the restore read its files).
        queries = start(spark, stream_config(settings))
        queries[0].processAllAvailable()
        queries[0].stop()
        assert api_figures(settings, catalog, periods, read_at) == before
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
        own_redis.stop()


def test_two_reconciliations_at_once_book_each_correction_once_and_the_second_says_another_holds_the_lock(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from ops.reconcile import reconcile, reconcile_config
    from tests.integration.test_reconcile import corrections

    catalog = SimulationConfig(events=10, seed=9).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    publish(settings, pairs("k0", T0 + 30 * 60_000, 30, catalog))
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        rc = reconcile_config(settings)
        assert reconcile(spark, rc, catalog).closed == ["20260101T0000Z"]
        # More of the closed period arrives, and the stream bills it: the next run books it as an adjustment.
        publish(settings, pairs("k-late", T0 + 35 * 60_000, 1, catalog))
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()

    # A cron entry and a person, at the same moment.
    env = child_env(settings)
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "reconcile"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    codes = sorted(run.returncode for run in runs)
    assert codes == [0, 4], outputs
    loser = outputs[[run.returncode for run in runs].index(4)]
    assert b"another reconciliation run holds" in loser[1]

    every = corrections(settings)
    assert len(every) == len({c.correction_id for c in every}), "one copy per correction id"
    assert [(c.click_id, c.reason) for c in every if c.booked_period != "20260101T0000Z"] == [
        ("k-late-c0", "billed_after_close")
    ]
    again = reconcile(spark, reconcile_config(settings), catalog)  # the next run succeeds, and writes nothing
    assert (again.additions, again.retractions) == (0, 0)


# A crash in the middle of a batch --------------------------------------------------------------------------------
def _billed_per_ad(settings: Settings) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for (_, ad), t in RedisFigures.from_url(settings.redis_url, settings.redis_prefix).all_ad_totals().items():
        out.setdefault(ad, [0, 0])
        out[ad][0] += t.clicks
        out[ad][1] += t.micros
    return {ad: (c, m) for ad, (c, m) in out.items() if c or m}


def _expected_per_ad(settings: Settings, catalog, delivered: int, raw: int = 0) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    out: dict[str, tuple[int, int]] = {}
    for row in oracle.billable(read_back(settings, delivered, undecodable=raw), catalog):
        clicks, micros = out.get(row["ad_id"], (0, 0))
        out[row["ad_id"]] = (clicks + 1, micros + row["amount_micros"])
    return out


class _CrashBeforeRedis(RuntimeError):
    """The driver dies after the batch's files, before Redis hears of the batch."""


def _a_batch_stopped_after_its_files(  # type: ignore[no-untyped-def]
    spark: SparkSession, settings: Settings, catalog, events: list, before_crash: Callable[[], object] = lambda: None
) -> int:
    """Run the job over `events` and a bad record, so that it stops in the middle of the batch that reads them:
    its files written, Redis not told, the checkpoint not committed (the batch fails where it would apply to Redis,
    as a driver that dies there). `before_crash` runs just before `events` are sent. Returns the batch's id; Redis is
    as before the batch."""
    import time

    from billing.store.redis_totals import RedisTotals
    from billing.store.schema_registry import open_registry
    from producers.publisher import EventPublisher
    from producers.wire import EventSerializer

    apply_batch = RedisTotals.apply_batch
    armed: list[bool] = []

    def crash_when_armed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if armed:
            raise _CrashBeforeRedis("the driver died after the batch's files, before Redis")
        return apply_batch(self, *args, **kwargs)

    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        applied = RedisFigures.from_url(settings.redis_url, settings.redis_prefix).last_applied("billing")
        assert applied is not None
        RedisTotals.apply_batch = crash_when_armed  # type: ignore[method-assign]
        armed.append(True)
        before_crash()
        publish(settings, events)
        publisher = EventPublisher(
            settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
        )
        publisher.publish_raw(settings.topic_clicks, b"ad-x", b"not framed avro")
        assert publisher.flush(30) == 0
        deadline = time.monotonic() + 180
        while queries[0].isActive and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "the driver died after the batch's files" in str(_failure_of(queries[0]))
    finally:
        RedisTotals.apply_batch = apply_batch  # type: ignore[method-assign]
        if queries[0].isActive:
            queries[0].stop()
    newest = newest_batch_id(settings.root)
    assert newest is not None and newest > applied
    return newest


def test_restore_after_a_crash_in_the_middle_of_a_batch_restores_up_to_the_committed_batch(
    spark: SparkSession, settings: Settings
) -> None:
    from attribution.restore import restore_redis
    from billing.periods import Periods

    catalog = SimulationConfig(events=10, seed=12).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    first, second = pairs("m0", T0 + 30 * 60_000, 20, catalog), pairs("m1", T0 + 40 * 60_000, 20, catalog)
    publish(settings, first)
    crashed = _a_batch_stopped_after_its_files(spark, settings, catalog, second)
    # The stop came in the middle of writing: the batch's ledger and quarantine files never made it.
    for folder in [*(settings.root / "ledger").glob(f"period=*/batch_id={crashed}"),
                   *(settings.root / "quarantine").glob(f"batch_id={crashed}")]:  # fmt: skip
        shutil.rmtree(folder)
    # Redis is lost; the operator restores it, then starts the job, which replays the batch.
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    totals.wipe_billing()
    restored = restore_redis(settings.root, totals, catalog, Periods(), "billing")
    assert restored.last_batch < crashed
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
    assert _billed_per_ad(settings) == _expected_per_ad(settings, catalog, len(first) + len(second) + 1, raw=1)
    assert sum(n for topics in totals.quarantined().values() for n in topics.values()) == 1, totals.quarantined()


def test_a_new_checkpoint_after_a_crash_in_the_middle_of_a_batch_bills_and_counts_that_batch(
    spark: SparkSession, settings: Settings
) -> None:
    catalog = SimulationConfig(events=10, seed=13).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    first, second = pairs("n0", T0 + 30 * 60_000, 20, catalog), pairs("n1", T0 + 40 * 60_000, 20, catalog)
    publish(settings, first)
    # A click of a version the registry does not know yet: held in quarantine. The version is registered just
    # before `second` is sent, so the batch that stops in the middle is the first of the query started again for
    # it: that batch releases the click (no impression qualifies it: archived, not billed).
    registry = open_registry(settings.registry_location)
    version_2 = json.loads(schema_text("click"))
    version_2["fields"].append({"name": "placement", "type": ["null", "string"], "default": None})
    next_id = 1 + max(registry.ids(subject_of("impression")) + registry.ids(subject_of("click")))
    held = Click("n-held", next(iter(catalog)).ad_id, "n-held-user", T0 + 35 * 60_000)
    value = frame(
        next_id, encode_body(parse_avro_schema(json.dumps(version_2)), {**held.to_record(), "placement": None})
    )
    publisher = EventPublisher(
        settings.kafka_bootstrap, EventSerializer(open_registry(settings.registry_location)), settings.topics
    )
    publisher.publish_raw(settings.topic_clicks, held.ad_id.encode(), value)
    assert publisher.flush(30) == 0
    crashed = _a_batch_stopped_after_its_files(
        spark,
        settings,
        catalog,
        second,
        before_crash=lambda: registry.register(subject_of("click"), json.dumps(version_2)),
    )
    assert (settings.root / "released" / f"batch_id={crashed}").is_dir(), "the batch that stopped released the click"
    # The operator gives up the checkpoint and starts a new one.
    shutil.rmtree(settings.root / "checkpoints" / "billing")
    queries = start(spark, stream_config(settings), new_checkpoint=True)
    try:
        queries[0].processAllAvailable()
    finally:
        queries[0].stop()
    ledger = read_ledger(settings.root / "ledger").to_pylist()
    assert max(Counter(r["click_id"] for r in ledger).values()) == 1, "one bill per click"
    assert crashed not in {r["batch_id"] for r in ledger}, "the uncommitted batch's files are set aside"
    expected = _expected_per_ad(settings, catalog, len(first) + len(second) + 2, raw=1)
    assert _billed_per_ad(settings) == expected
    # The click the set-aside batch released is released again, by the new epoch: archived once, for reconciliation.
    archived = ds.dataset(settings.root / "archive", format="parquet", partitioning="hive").to_table()
    assert archived.filter(pc.equal(archived["event_id"], "n-held"))["batch_id"].to_pylist() == [crashed + 1]
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    assert sum(n for topics in totals.quarantined().values() for n in topics.values()) == 1, totals.quarantined()


def test_restore_right_after_the_job_was_stopped_is_not_refused(spark: SparkSession, settings: Settings) -> None:
    import subprocess
    import sys

    from attribution.restore import restore_redis
    from billing.periods import Periods

    catalog = SimulationConfig(events=10, seed=14).catalog()
    settings.catalog_store().start(catalog)
    ensure_schemas(settings)
    publish(settings, pairs("s0", T0 + 30 * 60_000, 20, catalog))
    queries = start(spark, stream_config(settings))
    try:
        queries[0].processAllAvailable()
        publish(settings, pairs("s1", T0 + 31 * 60_000, 5, catalog))
        queries[0].processAllAvailable()  # the last batch, a moment before the stop
    finally:
        queries[0].stop()  # stopped: the job is gone, its checkpoint changed a moment ago
    # Redis comes back empty (no heartbeat either), and the operator restores it at once, as docs/operations.md says.
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    before = _billed_per_ad(settings)
    totals.wipe_billing()
    totals.client.delete(totals.keys.heartbeat("billing"))
    restored = restore_redis(settings.root, totals, catalog, Periods(), "billing")
    assert _billed_per_ad(settings) == before and restored.billed_clicks > 0
    # And by the command, from another process.
    totals.wipe_billing()
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "restore-redis"],
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert _billed_per_ad(settings) == before
