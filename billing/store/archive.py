"""Adapter: the archive's rows (`ARCHIVE/event_type=T/period=P/batch_id=N/*.parquet`, written by
`attribution.batch_output` for the events the stream received and by `attribution.release` for the records a release
settles out of quarantine): one row per valid event received, with its raw bytes and its optional fields (`period` is
the event time's). `event_type`, `period` and `batch_id` live in the paths (hive style)."""

from __future__ import annotations

from billing.store.columns import schema

ARCHIVE_COLUMNS: tuple[str, ...] = (
    "event_type", "event_id", "ad_id", "user_id", "event_time", "received_ms", "topic", "partition", "offset", "value",
    "user_agent", "ip", "late", "period_start_ms", "period", "batch_id",
)  # fmt: skip

ARCHIVE_SCHEMA = schema(ARCHIVE_COLUMNS)
