"""Wiring of the streaming job: settings -> StreamConfig, SparkSession, listener, metrics; run until stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from ops.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from attribution.job import StreamConfig
    from billing.store.catalog_db import CatalogDatabase


def stream_config(settings: Settings) -> StreamConfig:
    """The job's sources and sinks, with every registered version of each event schema."""
    from attribution.job import StreamConfig
    from billing.schemas import subject_of

    registry = settings.schema_registry_store()

    def versions(event_type: str) -> dict[int, str]:
        return {schema_id: registry.schema_by_id(schema_id) for schema_id in registry.ids(subject_of(event_type))}

    return StreamConfig(
        kafka_bootstrap=settings.kafka_bootstrap,
        topic_impressions=settings.topic_impressions,
        topic_clicks=settings.topic_clicks,
        topic_quarantine=settings.topic_quarantine,
        impression_schemas=versions("impression"),
        click_schemas=versions("click"),
        data_dir=settings.root,
        redis_url=settings.redis_url,
        redis_prefix=settings.redis_prefix,
        impression_watermark_ms=settings.impression_watermark_ms,
        click_watermark_ms=settings.click_watermark_ms,
        clock_tolerance_ms=settings.clock_tolerance_ms,
        trigger_ms=settings.trigger_ms,
        period_ms=settings.period_ms,
        max_offsets_per_trigger=settings.max_offsets_per_trigger,
        redis_timeout_ms=settings.redis_timeout_ms,
        registry_location=settings.registry_location,
        write_on_executors=settings.writes_on_executors,
        catalog_file=settings.catalog_file,
        database_url=settings.database_url,
        ivt_rules=settings.ivt_rules,
        judge_invalid=bool(settings.stream_invalid_traffic),
        hold_budgets=bool(settings.stream_budgets),
    )


def run_stream(settings: Settings, new_checkpoint: bool = False) -> int:
    """Run the streaming job in the foreground until Ctrl-C/SIGTERM or a query fails; 2 when the checkpoint is
    refused (`attribution.epoch`)."""
    from prometheus_client import REGISTRY, start_http_server

    from attribution.epoch import CheckpointRefusedError
    from attribution.job import start
    from attribution.progress import BillingCollector, HealthListener, ReconciliationCollector
    from billing.store.disk_space import probe_room, retry_while_disk_full
    from billing.store.part_status import STREAM_PART, PartStatus
    from ops.spark import spark_session
    from ops.stack import ensure_catalog, ensure_schemas, ensure_stack_topics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Room first: the checkpoint, Spark's scratch and the batches' files are in the data folder.
    status = PartStatus(settings.redis_url, settings.redis_prefix, STREAM_PART)
    retry_while_disk_full(lambda: probe_room(settings.root), "starting the job", settings.root, status)
    ensure_stack_topics(settings)
    ensure_catalog(settings)
    ensure_schemas(settings)
    config = stream_config(settings)
    # One store of the catalog for the job and its metrics (each would otherwise hold the whole catalog: 0.8 GB at a
    # million ads), read while the JVM and the query start (9 s at a million ads). The job's start only checks that
    # the database answers and holds a catalog (one line where not); a read that fails here is made again by the
    # first batch.
    catalog = settings.catalog_store()
    reading = threading.Thread(target=_read_ahead, args=(catalog,), name="catalog-read", daemon=True)
    reading.start()
    # glibc gives each thread that allocates an arena of its own; RocksDB's threads in the JVM then keep freed
    # memory in many arenas and resident memory creeps up. Two arenas (read by the JVM this starts) keep it in
    # check: with this and RocksDB's one memory budget (attribution.session) the 30-minute soak stayed flat.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    spark = spark_session(settings, "adbill-stream", settings.layout.spark_scratch("stream"), stateful=True)
    if settings.metrics_port:
        REGISTRY.register(ReconciliationCollector(settings.redis_url, settings.redis_prefix))
        REGISTRY.register(BillingCollector(settings.redis_url, settings.redis_prefix, catalog))
        # On a cluster Prometheus scrapes the driver from another host: all interfaces on purpose (bandit B104).
        start_http_server(settings.metrics_port, addr="127.0.0.1" if settings.kafka_is_local else "0.0.0.0")  # nosec
    spark.streams.addListener(
        HealthListener(
            settings.redis_url,
            settings.redis_prefix,
            {"impressions": settings.impression_watermark_ms, "clicks": settings.click_watermark_ms},
        )
    )
    try:
        queries = start(spark, config, new_checkpoint=new_checkpoint, catalog=catalog)
    except CheckpointRefusedError as exc:
        print(f"streaming: refused: {exc}", file=sys.stderr, flush=True)
        spark.stop()
        return 2
    print(
        f"streaming: queries {', '.join(q.name for q in queries)} on {settings.spark_master}; "
        f"ledger {config.layout.ledger}; metrics :{settings.metrics_port or 'off'}",
        flush=True,
    )
    try:
        # The query's own wait: it goes on across the restarts new schema versions cause (schema_follow), and
        # across a full disk (below).
        _run_through_full_disks(spark, settings, queries)
    except KeyboardInterrupt:
        print("stopping the streaming queries ...", flush=True)
    finally:
        for query in queries:
            query.stop()
        failed = [q for q in queries if q.exception() is not None]
        for query in failed:
            print(f"query {query.name} failed: {query.exception()}", file=sys.stderr)
        spark.stop()
    return 1 if failed else 0


def _read_ahead(catalog: CatalogDatabase) -> None:
    """The whole catalog read into `catalog`, or nothing: the job's start reads it again, and says why it cannot."""
    with contextlib.suppress(Exception):
        catalog.current(fresh=True)


def _run_through_full_disks(spark: SparkSession, settings: Settings, queries: list[StreamingQuery]) -> None:
    """Wait for the queries to end; a query that failed because the data folder's disk is full is started again
    from its checkpoint once there is room (`billing.store.disk_space`: a log line each minute, the wait in the
    job's status record), and the batch it failed in is replayed in place. `queries` holds the running ones."""
    from attribution.job import start
    from billing.store.disk_space import probe_room, retry_while_disk_full
    from billing.store.part_status import STREAM_PART, PartStatus

    status = PartStatus(settings.redis_url, settings.redis_prefix, STREAM_PART)
    while True:
        # A failed query is said by the caller (exit 1); a restart for new schema versions that failed too.
        with contextlib.suppress(Exception):
            queries[0].awaitTermination()
        if queries[0].isActive:
            continue
        failed = [q for q in queries if q.exception() is not None]
        if not failed or not all(stopped_by_full_disk(q) for q in failed):
            return
        message = f"query billing stopped: the disk of {settings.root} is full; it starts again once there is room"
        logging.getLogger(__name__).warning(message)
        status(message)
        spark.streams.resetTerminated()

        def start_again() -> list[StreamingQuery]:
            probe_room(settings.root)
            return start(spark, stream_config(settings))

        queries[:] = retry_while_disk_full(start_again, "starting the billing query again", settings.root, status)
        status(None)


def stopped_by_full_disk(query: StreamingQuery) -> bool:
    """Whether `query` failed because a write found the disk (or a quota) full: its failure, or a cause of it, says
    so (the JVM's IOException, or the Python sink's OSError as text)."""
    from billing.store.disk_space import is_disk_full

    if is_disk_full(query.exception()) or is_disk_full(str(query.exception())):
        return True
    try:
        failure: Any = query._jsq.exception()  # type: ignore[attr-defined]
    except Exception:  # no run of the query in the JVM to ask
        return False
    cause = None if failure.isEmpty() else failure.get()
    for _ in range(20):  # the chain of causes, as far as it goes
        if cause is None:
            return False
        if is_disk_full(str(cause.toString())):
            return True
        cause = cause.getCause()
    return False


RESTORE_TIMEOUT_S = 300.0
"""Deadline of one Redis call of `adbill restore-redis`."""


def restore_redis(settings: Settings) -> int:
    """`adbill restore-redis`: every billing figure in Redis from the data folder, with the job stopped."""
    from attribution.restore import JobRunningError, restore_redis
    from attribution.stream_position import BILLING_QUERY
    from billing.periods import Periods
    from billing.store.redis_totals import RedisTotals
    from ops.reconcile import net_by_currency

    # The whole ledger's totals go to Redis in one script: on a long history that takes longer than one live batch
    # may, and the job is stopped, so the deadline is a generous one.
    totals = RedisTotals.from_url(
        settings.redis_url, settings.redis_prefix, timeout_s=max(settings.redis_timeout_ms / 1000, RESTORE_TIMEOUT_S)
    )
    print("restore-redis: taking the streaming job's lock (the job must be stopped; waits up to 60 s) ...", flush=True)
    try:
        done = restore_redis(
            settings.root,
            totals,
            settings.catalog_store().current(fresh=True),
            Periods(settings.period_ms),
            BILLING_QUERY,
            database_url=settings.database_url,
            clock_tolerance_ms=settings.clock_tolerance_ms,
        )
    except JobRunningError as exc:
        print(f"restore-redis: refused: {exc}", file=sys.stderr)
        return 1
    print(
        f"restore-redis: up to batch {done.last_batch}: {done.billed_clicks:,} billed clicks "
        f"({net_by_currency(done.billed_micros_by_currency)}), {done.corrections:,} corrections, "
        f"{done.closed_periods} closed period(s), {done.late_events:,} late and {done.clock_ahead_events:,} "
        f"clock-ahead events, {done.quarantined:,} quarantined records; start the job again"
    )
    return 0
