"""What the running job reports about itself: a StreamingQueryListener that keeps each batch's progress in Redis
(for the UI) and in Prometheus metrics (for scrapers), and collectors that read the running counts of billing from
Redis when scraped.

Prometheus names follow its conventions: base units (`_seconds`, `_timestamp_seconds`, `_bytes`), counters for
running counts (`_total`), a histogram of batch durations; rates are the scraper's `rate()` of the counters.

Per batch and query: input rows and rates, batch duration, the query's watermark and each stream's own watermark
(its largest watermark time seen, the earlier of event time and Kafka's receipt time, less its delay), state rows
and memory, rows dropped by the watermark, and each stream's events whose clock was ahead of Kafka's by more than
the tolerance (also a Prometheus counter, `adbill_clock_ahead_events_total`).

Redis keys: `PREFIX:health:query:NAME` (hash, the latest batch), `PREFIX:health:history:NAME` (list of JSON, newest
first, capped at `HISTORY`), `PREFIX:health:heartbeat:NAME` (epoch ms of the query's last batch or idle trigger:
reconciliation closes a period only while the job is alive).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

import redis
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from attribution.listener import ProgressListener
from billing.budgets import OVER_BUDGET
from billing.catalog import Unbillable
from billing.invalid import INVALID_REASONS
from billing.store.budget_days import capped_today
from billing.store.catalog_db import CatalogDatabase
from billing.store.redis_keys import RedisKeys
from billing.store.redis_totals import connect

log = logging.getLogger(__name__)

HISTORY = 720

_RECORDS = Counter("adbill_input_records", "Kafka records the job read", ["query", "topic"])
_BATCHES = Counter("adbill_batches", "Micro-batches completed", ["query"])
_DURATION = Histogram(
    "adbill_batch_duration_seconds",
    "Wall time of a micro-batch",
    ["query"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120),
)
_DROPPED = Counter("adbill_rows_dropped_by_watermark", "Rows the watermark kept out of stateful operators", ["query"])
_WATERMARK = Gauge("adbill_watermark_timestamp_seconds", "Event-time watermark", ["query", "stream"])
_STATE_ROWS = Gauge("adbill_state_rows", "Rows held in state, all operators", ["query"])
_STATE_BYTES = Gauge("adbill_state_memory_bytes", "Memory used by state, all operators", ["query"])
_BATCH = Gauge("adbill_last_batch_id", "Id of the last completed micro-batch", ["query"])
_BATCH_TIME = Gauge("adbill_last_batch_timestamp_seconds", "When the last micro-batch started", ["query"])
_LAG = Gauge(
    "adbill_consumer_lag_records",
    "Records Kafka held beyond what the last micro-batch read, per topic and partition",
    ["query", "topic", "partition"],
)
_CLOCK_AHEAD = Counter(
    "adbill_clock_ahead_events",
    "Valid events whose time was ahead of Kafka's receipt time by more than the tolerance",
    ["query", "stream"],
)


class Heartbeat(ProgressListener):
    """Writes the wall-clock time of every batch and idle trigger of one query to Redis: proof that it is alive.

    Spark reports an idle query every `spark.sql.streaming.noDataProgressEventInterval` (10 s by default). It beats
    for one run of the query, by its run id: a restart from the same checkpoint keeps the query's id, and the end of
    the earlier run, heard late, must not silence the next."""

    def __init__(self, redis_url: str, prefix: str, query_name: str) -> None:
        self.key = RedisKeys(prefix).heartbeat(query_name)
        self.redis_url = redis_url
        self.query_name = query_name
        self.run_id: str | None = None
        self._client: redis.Redis | None = None

    def follow(self, query: Any) -> None:
        """Beat for this run of `query` (another run, or another query of the same name in the session, is not it)."""
        self.run_id = str(query.runId)
        self._beat()

    def on_progress(self, progress: dict[str, Any]) -> None:
        if progress.get("runId") == self.run_id:
            self._beat()

    def onQueryIdle(self, event: Any) -> None:
        if str(event.runId) == self.run_id:
            self._beat()

    def onQueryTerminated(self, event: Any) -> None:
        if str(event.runId) == self.run_id:
            self.run_id = None

    def _beat(self) -> None:
        try:
            if self._client is None:
                self._client = connect(self.redis_url, timeout_s=5.0, retries=0)
            self._client.set(self.key, str(int(time.time() * 1000)))
        except Exception:  # reporting must never take the billing job down
            log.exception("could not record the heartbeat of %s", self.query_name)


def summarize(progress: Mapping[str, Any], delays_ms: Mapping[str, int], seen_max: dict[str, int]) -> dict[str, Any]:
    """The health record of one batch, from Spark's progress JSON. `seen_max` carries each stream's largest
    watermark time across batches (updated here), since a batch only reports its own."""
    state = progress.get("stateOperators") or []
    watermarks: dict[str, int | None] = {}
    clock_ahead: dict[str, int] = {}
    for stream, delay in delays_ms.items():
        observed = (progress.get("observedMetrics") or {}).get(stream) or {}
        latest = observed.get("max_watermark_time")
        if latest is not None:
            seen_max[stream] = max(seen_max.get(stream, latest), int(latest))
        watermarks[stream] = seen_max[stream] - delay if stream in seen_max else None
        clock_ahead[stream] = int(observed.get("clock_ahead") or 0)
    sources = progress.get("sources") or []
    # Records read: the offsets each source advanced. Spark's numInputRows counts a record once per branch of
    # the query that scans its source, and the job reads each topic in two branches (join and intake).
    records = sum(_advanced(s.get("startOffset"), s.get("endOffset")) for s in sources)
    duration_ms = (progress.get("durationMs") or {}).get("triggerExecution", 0)
    return {
        "query": progress.get("name"),
        "query_id": progress.get("id"),
        "run_id": progress.get("runId"),
        "batch_id": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        "input_rows": records,
        "scanned_rows": progress.get("numInputRows", 0),
        "input_rows_per_second": round(float(progress.get("inputRowsPerSecond") or 0.0) * _share(records, progress), 1),
        "processed_rows_per_second": round(records * 1000 / duration_ms, 1) if duration_ms else 0.0,
        "batch_duration_ms": duration_ms,
        "durations_ms": progress.get("durationMs") or {},
        "watermark_ms": _epoch_ms((progress.get("eventTime") or {}).get("watermark")),
        "stream_watermarks_ms": watermarks,
        "state_rows": sum(op.get("numRowsTotal", 0) for op in state),
        "state_memory_bytes": sum(op.get("memoryUsedBytes", 0) for op in state),
        "rows_dropped_by_watermark": sum(op.get("numRowsDroppedByWatermark", 0) for op in state),
        "clock_ahead_events": clock_ahead,
        "sources": [
            {
                "description": s.get("description"),
                "start_offset": _offsets(s.get("startOffset")),
                "end_offset": _offsets(s.get("endOffset")),
                "latest_offset": _offsets(s.get("latestOffset")),
                "input_rows": s.get("numInputRows"),
            }
            for s in sources
        ],
    }


class HealthListener(ProgressListener):
    """Records every batch's health in Redis and Prometheus; never lets a reporting failure stop the job."""

    def __init__(self, redis_url: str, prefix: str, delays_ms: Mapping[str, int]) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.keys = RedisKeys(prefix)
        self.delays_ms = dict(delays_ms)
        self.seen_max: dict[str, int] = {}
        self._client: redis.Redis | None = None

    def onQueryStarted(self, event: Any) -> None:
        log.info("query %s started (id %s)", event.name, event.id)

    def on_progress(self, progress: dict[str, Any]) -> None:
        try:
            record = summarize(progress, self.delays_ms, self.seen_max)
            self._export(record)
            client = self._redis()
            name = record["query"]
            pipe = client.pipeline()
            pipe.hset(
                self.keys.health_query(name),
                mapping={k: json.dumps(v) if isinstance(v, dict | list) else str(v) for k, v in record.items()},
            )
            pipe.lpush(self.keys.health_history(name), json.dumps(record))
            pipe.ltrim(self.keys.health_history(name), 0, HISTORY - 1)
            pipe.execute()
        except Exception:  # reporting must never take the billing job down
            log.exception("could not record query progress")

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            log.error("query %s terminated with: %s", event.id, event.exception)

    def _redis(self) -> redis.Redis:
        if self._client is None:
            # Reporting waits for no one: a Redis that does not answer costs this batch's record, not the job.
            self._client = connect(self.redis_url, timeout_s=5.0, retries=0)
        return self._client

    def _export(self, record: Mapping[str, Any]) -> None:
        export(record)


def export(record: Mapping[str, Any]) -> None:
    """One batch's health record (`summarize`) into the job's Prometheus metrics."""
    name = record["query"] or "unnamed"
    _BATCHES.labels(name).inc()
    for topic, count in records_by_topic(record["sources"]).items():
        _RECORDS.labels(name, topic).inc(count)
    _DURATION.labels(name).observe(record["batch_duration_ms"] / 1000)
    _DROPPED.labels(name).inc(record["rows_dropped_by_watermark"])
    _STATE_ROWS.labels(name).set(record["state_rows"])
    _STATE_BYTES.labels(name).set(record["state_memory_bytes"])
    _BATCH.labels(name).set(record["batch_id"] or 0)
    started_ms = _epoch_ms(record.get("timestamp"))
    if started_ms is not None:
        _BATCH_TIME.labels(name).set(started_ms / 1000)
    if record["watermark_ms"] is not None:
        _WATERMARK.labels(name, "query").set(record["watermark_ms"] / 1000)
    for stream, value in record["stream_watermarks_ms"].items():
        if value is not None:
            _WATERMARK.labels(name, stream).set(value / 1000)
    for (topic, partition), lag in consumer_lag(record["sources"]).items():
        _LAG.labels(name, topic, partition).set(lag)
    for stream, events in record["clock_ahead_events"].items():
        _CLOCK_AHEAD.labels(name, stream).inc(events)


def records_by_topic(sources: list[Mapping[str, Any]]) -> dict[str, int]:
    """Records a batch read per topic: the offsets each partition advanced (a topic read by two branches of the
    query counts once)."""
    advanced: dict[tuple[str, str], int] = {}
    for source in sources:
        start, end = source.get("start_offset") or {}, source.get("end_offset") or {}
        for topic, parts in end.items():
            for partition, offset in parts.items():
                step = max(0, offset - start.get(topic, {}).get(partition, 0))
                advanced[(topic, partition)] = max(advanced.get((topic, partition), 0), step)
    out: dict[str, int] = {}
    for (topic, _), count in advanced.items():
        out[topic] = out.get(topic, 0) + count
    return out


def consumer_lag(sources: list[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(topic, partition) -> records Kafka held past the batch's end offset when the batch was planned."""
    lag: dict[tuple[str, str], int] = {}
    for source in sources:
        end, latest = source.get("end_offset") or {}, source.get("latest_offset") or {}
        for topic, parts in latest.items():
            for partition, offset in parts.items():
                behind = max(0, offset - end.get(topic, {}).get(partition, offset))
                lag[(topic, partition)] = max(lag.get((topic, partition), 0), behind)
    return lag


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """A Kafka source's offsets, {topic: {partition: offset}}, whether Spark reports them as JSON text or not."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in value.items() if isinstance(parts, dict)}


def _advanced(start: Any, end: Any) -> int:
    """Records between two offsets of a Kafka source (a first batch starts from nothing, so from 0)."""
    before, after = _offsets(start) or {}, _offsets(end) or {}
    return sum(
        max(0, offset - before.get(topic, {}).get(partition, 0))
        for topic, parts in after.items()
        for partition, offset in parts.items()
    )


def _share(records: int, progress: Mapping[str, Any]) -> float:
    """The fraction of Spark's scanned rows that are distinct records, to correct its per-scan rates."""
    scanned = progress.get("numInputRows") or 0
    return records / scanned if scanned else 1.0


def _epoch_ms(iso: str | None) -> int | None:
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


class ReconciliationCollector:
    """Prometheus figures of the last reconciliation run, read from Redis when scraped (reconciliation runs as a
    separate process, now and then; the job's `/metrics` is the one place an operator scrapes)."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.key = RedisKeys(prefix).last_reconciliation()
        self.audit_key = RedisKeys(prefix).last_audit()
        self.heartbeat_key = RedisKeys(prefix).heartbeat("billing")
        self.redis_url = redis_url

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            client = connect(self.redis_url, timeout_s=2.0, retries=0)
            record = client.hgetall(self.key)
            audit = client.hgetall(self.audit_key)
            heartbeat = client.get(self.heartbeat_key)
        except redis.RedisError:
            return
        if heartbeat:
            # Read from Redis at each scrape: it stops moving when the job stalls, even while this process answers.
            beat = GaugeMetricFamily(
                "adbill_heartbeat_timestamp_seconds",
                "When the streaming job last finished a batch or an idle trigger",
                labels=["query"],
            )
            beat.add_metric(["billing"], int(heartbeat) / 1000)
            yield beat
        if audit:
            differing = GaugeMetricFamily(
                "adbill_audit_periods_differing", "Periods whose books differed from the rule in the last audit"
            )
            differing.add_metric([], len(json.loads(audit.get("differences") or "[]")))
            yield differing
        if not record:
            return
        held = json.loads(record.get("held") or "{}")
        count = GaugeMetricFamily(
            "adbill_reconcile_periods_held", "Periods past their lateness horizon that the job has not passed"
        )
        count.add_metric([], len(held))
        yield count
        per_period = GaugeMetricFamily(
            "adbill_reconcile_period_held", "1 for each held period, with the reason", labels=["period", "reason"]
        )
        for period, reason in sorted(held.items()):
            per_period.add_metric([period, reason], 1)
        yield per_period
        finished = GaugeMetricFamily(
            "adbill_reconcile_last_run_timestamp_seconds", "When the last reconciliation run finished"
        )
        finished.add_metric([], int(record.get("finished_at_ms") or 0) / 1000)
        yield finished
        took = GaugeMetricFamily(
            "adbill_reconcile_last_run_duration_seconds", "How long the last reconciliation run took"
        )
        took.add_metric([], int(record.get("duration_ms") or 0) / 1000)
        yield took


class BillingCollector:
    """Running counts of billing, read from Redis when scraped: clicks billed by the stream, late events, matched
    clicks without a price, invalid clicks per rule and clicks over budget (not charged), quarantined records and
    corrections. The stream adds to them in the same script that applies each batch, so they count every batch once;
    they start again from 0 when Redis is restored (`adbill restore-redis`), which Prometheus reads as a counter
    reset. With the catalog's store, also the campaigns capped today (`billing.budget_days`), a gauge read from each
    campaign's UTC day at the scrape's time."""

    def __init__(
        self,
        redis_url: str,
        prefix: str,
        catalog: CatalogDatabase | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.prefix = prefix
        self.redis_url = redis_url
        self.catalog = catalog
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        capped: int | None = None
        try:
            client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=2)
            try:
                counters, quarantined, corrections = _billing_counts(client, RedisKeys(self.prefix))
                if self.catalog is not None:
                    try:
                        catalog = self.catalog.current()
                    except ValueError:
                        catalog = None  # no catalog yet: no campaign has a budget
                    if catalog is not None:
                        capped = len(capped_today(client, RedisKeys(self.prefix), catalog, self.clock()))
            finally:
                client.close()
        except redis.RedisError:
            return
        billed = CounterMetricFamily("adbill_billed_clicks", "Clicks the stream billed (provisional)")
        billed.add_metric([], counters.get("billed_clicks", 0))
        yield billed
        late = CounterMetricFamily("adbill_late_events", "Events the watermark kept out of the join", labels=["type"])
        for kind in ("impression", "click"):
            late.add_metric([kind], counters.get(f"late_{kind}s", 0))
        yield late
        unbilled = CounterMetricFamily(
            "adbill_unbilled_clicks",
            "Matched clicks the stream could not price: their ad paused or unknown at their time",
            labels=["reason"],
        )
        for why in Unbillable:
            unbilled.add_metric([why.value], counters.get(f"unbilled_{why.value}", 0))
        yield unbilled
        invalid = CounterMetricFamily(
            "adbill_invalid_clicks",
            "Priced clicks the stream did not charge because an invalid traffic rule applied, per rule",
            labels=["reason"],
        )
        for reason in INVALID_REASONS:
            invalid.add_metric([reason], counters.get(f"not_charged_{reason}", 0))
        yield invalid
        over = CounterMetricFamily(
            "adbill_over_budget_clicks",
            "Valid priced clicks the stream did not charge: past their campaign's daily budget",
        )
        over.add_metric([], counters.get(f"not_charged_{OVER_BUDGET}", 0))
        yield over
        if capped is not None:
            gauge = GaugeMetricFamily(
                "adbill_campaigns_capped_today",
                "Campaigns whose charged total today (UTC) has reached their daily budget in force now",
            )
            gauge.add_metric([], capped)
            yield gauge
        quarantine = CounterMetricFamily(
            "adbill_quarantined_records", "Records sent to the quarantine", labels=["reason", "topic"]
        )
        for (reason, topic), count in sorted(quarantined.items()):
            quarantine.add_metric([reason, topic], count)
        yield quarantine
        applied = CounterMetricFamily(
            "adbill_corrections", "Corrections reconciliation booked (additions and retractions)"
        )
        applied.add_metric([], corrections)
        yield applied


def _billing_counts(client: redis.Redis, keys: RedisKeys) -> tuple[dict[str, int], dict[tuple[str, str], int], int]:
    counters = {str(k): int(v) for k, v in client.hgetall(keys.counters()).items()}  # type: ignore[union-attr]
    quarantined: dict[tuple[str, str], int] = {}
    for key in client.scan_iter(match=keys.quarantine("*"), count=100):
        reason = str(key).rsplit(":", 1)[1]
        for topic, n in client.hgetall(key).items():  # type: ignore[union-attr]
            quarantined[(reason, str(topic))] = int(n)
    corrections = int(client.scard(keys.corrections_applied()))  # type: ignore[arg-type]
    return counters, quarantined, corrections
