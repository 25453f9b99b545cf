"""The streaming job's health as the admin sees it, read from Redis: its heartbeat, what a part waits for, each
query's progress and recent batches, the consumer lag, late, clock-ahead, unbilled and quarantined events, and the
last reconciliation run. Reads only."""

from __future__ import annotations

import json

from billing.intake import QuarantineReason
from billing.store.part_status import read_status
from web.model import (
    COMPACTION_PARTS,
    Billed,
    ClockAheadLine,
    CompactionPass,
    EventCounts,
    Health,
    Period,
    PeriodBill,
    QueryHealth,
    Reconciliation,
    UnbilledLine,
    consumer_lag,
)
from web.readers import (
    SERIES_PERIODS,
    UNBILLED_REASONS,
    CatalogView,
    PeriodReader,
    counts_of,
    int_field,
    json_field,
    unbilled_of,
)

QUERY_NAMES = ("billing",)
"""The streaming job's named queries (`attribution.job`), whose health records the admin sees."""

HEALTH_HISTORY = 60
"""Batches of each query whose durations the health page shows."""

LAG_LOOKBACK = 10
"""How many batches back the health page looks to tell a growing consumer lag."""


class JobHealth:
    """The streaming job's and reconciliation's records in Redis, for the health page, the probes and freshness."""

    def __init__(self, periods: PeriodReader, catalog: CatalogView) -> None:
        self.periods = periods
        self.client = periods.client
        self.keys = periods.keys
        self.catalog = catalog

    def heartbeat_ms(self) -> int | None:
        """When the streaming job last reported a batch or an idle trigger (epoch ms), None if never; raises the
        Redis client's error when Redis does not answer."""
        return int_field(self.client.get(self.keys.heartbeat(QUERY_NAMES[0])))  # type: ignore[arg-type]

    def part_waiting(self, part: str) -> dict[str, str]:
        """What a part (`stream`, `reconcile`) says it waits for: its status record (`state`, `message`,
        `since_ms`), {} when it waits for nothing (`billing.store.part_status`)."""
        return read_status(self.client, self.keys.prefix, part)

    def health(self) -> Health:
        """The job's latest progress per query, recent batch durations, late, clock-ahead and quarantined counts,
        and the last reconciliation."""
        advertisers = self.periods.known_advertisers()
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(self.keys.late_periods(), -SERIES_PERIODS, -1, withscores=True)
        pipe.zrange(self.keys.clock_ahead_periods(), -SERIES_PERIODS, -1, withscores=True)
        pipe.zrange(self.keys.unbilled_periods(), -SERIES_PERIODS, -1, withscores=True)
        late_periods, ahead_periods, unbilled_periods = pipe.execute()
        periods = [Period(key, int(start), False) for key, start in late_periods]
        reasons = [r.value for r in QuarantineReason]
        pipe = self.client.pipeline(transaction=False)
        for name in QUERY_NAMES:
            pipe.hgetall(self.keys.health_query(name))
            pipe.lrange(self.keys.health_history(name), 0, HEALTH_HISTORY - 1)
        for reason in reasons:
            pipe.hgetall(self.keys.quarantine(reason))
        for p in periods:
            for advertiser_id in advertisers:
                pipe.hmget(self.keys.late(p.key, "adv", advertiser_id), "impressions", "clicks")
        for key, _ in ahead_periods:
            pipe.smembers(self.keys.clock_ahead_ads(key))
        for key, _ in unbilled_periods:
            pipe.smembers(self.keys.unbilled_ads(key))
        pipe.hgetall(self.keys.last_reconciliation())
        for part in COMPACTION_PARTS:
            pipe.hgetall(self.keys.compaction(part))
        results = iter(pipe.execute())

        queries = []
        for name in QUERY_NAMES:
            record, history = next(results), next(results)
            if record:
                queries.append(_query_health(name, record, history))
        quarantined = {}
        for reason in reasons:
            topics = next(results)
            if topics:
                quarantined[reason] = {topic: int(n) for topic, n in sorted(topics.items())}
        late = []
        for p in periods:
            total = EventCounts()
            for _ in advertisers:
                total += counts_of(next(results))
            late.append(PeriodBill(p, Billed(), total))
        ahead_ads = [(Period(key, int(start), False), sorted(next(results))) for key, start in ahead_periods]
        unbilled_ads = [(Period(key, int(start), False), sorted(next(results))) for key, start in unbilled_periods]
        last = next(results)
        passes = [(part, next(results)) for part in COMPACTION_PARTS]
        return Health(
            queries,
            quarantined,
            late,
            self._clock_ahead_lines(ahead_ads),
            _reconciliation(last) if last else None,
            self._unbilled_lines(unbilled_ads),
            [_compaction(part, record) for part, record in passes if record],
        )

    def _unbilled_lines(self, ads_by_period: list[tuple[Period, list[str]]]) -> list[UnbilledLine]:
        """Each ad's unbilled clicks in each of the periods, with the ad's advertiser (from the catalog; empty for an
        ad the catalog does not know)."""
        pipe = self.client.pipeline(transaction=False)
        for period, ads in ads_by_period:
            for ad_id in ads:
                pipe.hmget(self.keys.unbilled(period.key, "ad", ad_id), *UNBILLED_REASONS)
        results = iter(pipe.execute())
        catalog = self.catalog.get()
        lines = []
        for period, ads in ads_by_period:
            for ad_id in ads:
                lines.append(
                    UnbilledLine(period, catalog.advertiser_of(ad_id) or "", ad_id, unbilled_of(next(results)))
                )
        return lines

    def _clock_ahead_lines(self, ads_by_period: list[tuple[Period, list[str]]]) -> list[ClockAheadLine]:
        """Each ad's clock-ahead events in each of the periods, with the ad's advertiser (from the catalog)."""
        pipe = self.client.pipeline(transaction=False)
        for period, ads in ads_by_period:
            for ad_id in ads:
                pipe.hmget(self.keys.clock_ahead(period.key, "ad", ad_id), "impressions", "clicks")
        results = iter(pipe.execute())
        catalog = self.catalog.get()
        lines = []
        for period, ads in ads_by_period:
            for ad_id in ads:
                known = catalog.get(ad_id)
                lines.append(
                    ClockAheadLine(period, known.advertiser_id if known else "", ad_id, counts_of(next(results)))
                )
        return lines


def _float_field(value: str | None) -> float:
    try:
        return float(value or 0.0)
    except ValueError:
        return 0.0


def _query_health(name: str, record: dict[str, str], history: list[str]) -> QueryHealth:
    recent = []
    lag_before = None
    for n, line in enumerate(history):
        try:
            older = json.loads(line)
            recent.append(int(older.get("batch_duration_ms") or 0))
            if n < LAG_LOOKBACK:
                sources = older.get("sources")
                lag_before = consumer_lag(json_field(sources, []) if isinstance(sources, str) else sources or [])
        except (ValueError, AttributeError, TypeError):
            continue
    watermarks = json_field(record.get("stream_watermarks_ms"), {})
    return QueryHealth(
        name=name,
        batch_id=int_field(record.get("batch_id")),
        timestamp=record.get("timestamp", ""),
        input_rows=int_field(record.get("input_rows")) or 0,
        input_rows_per_second=_float_field(record.get("input_rows_per_second")),
        processed_rows_per_second=_float_field(record.get("processed_rows_per_second")),
        batch_duration_ms=int_field(record.get("batch_duration_ms")) or 0,
        durations_ms={str(k): int(v) for k, v in json_field(record.get("durations_ms"), {}).items()},
        watermark_ms=int_field(record.get("watermark_ms")),
        stream_watermarks_ms={str(k): None if v is None else int(v) for k, v in watermarks.items()},
        state_rows=int_field(record.get("state_rows")) or 0,
        state_memory_bytes=int_field(record.get("state_memory_bytes")) or 0,
        rows_dropped_by_watermark=int_field(record.get("rows_dropped_by_watermark")) or 0,
        lag=consumer_lag(json_field(record.get("sources"), [])),
        recent_durations_ms=list(reversed(recent)),
        lag_before=lag_before,
    )


def _compaction(part: str, data: dict[str, str]) -> CompactionPass:
    return CompactionPass(
        part=part,
        finished_at_ms=int_field(data.get("finished_at_ms")) or 0,
        summary=data.get("summary", ""),
        failed=[str(f) for f in json_field(data.get("failed"), [])],
        waiting=int_field(data.get("waiting")) or 0,
    )


def _reconciliation(data: dict[str, str]) -> Reconciliation:
    return Reconciliation(
        run_id=data.get("run_id", ""),
        started_at_ms=int_field(data.get("started_at_ms")) or 0,
        finished_at_ms=int_field(data.get("finished_at_ms")) or 0,
        duration_ms=int_field(data.get("duration_ms")) or 0,
        periods=[str(p) for p in json_field(data.get("periods"), [])],
        closed=[str(p) for p in json_field(data.get("closed"), [])],
        additions=int_field(data.get("additions")) or 0,
        retractions=int_field(data.get("retractions")) or 0,
        net_micros_by_currency={
            str(c): int(m)
            for c, m in json_field(data.get("net_micros_by_currency"), {}).items()
            if isinstance(m, int | str) and str(m).lstrip("-").isdigit()
        },
        held={str(p): str(r) for p, r in json_field(data.get("held"), {}).items()},
    )
