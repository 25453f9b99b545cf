"""Adapter: the archive's rows (`ARCHIVE/event_type=T/period=P/batch_id=N/*.parquet`, written by
`attribution.batch_output` for the events the stream received and by `attribution.release` for the records a release
settles out of quarantine): one row per valid event received, with its raw bytes and its optional fields (`period` is
the event time's). `event_type`, `period` and `batch_id` live in the paths (hive style)."""

from __future__ import annotations

import pyarrow as pa

ARCHIVE_SCHEMA = pa.schema(
    [
        ("event_type", pa.string()),
        ("event_id", pa.string()),
        ("ad_id", pa.string()),
        ("user_id", pa.string()),
        ("event_time", pa.int64()),
        ("received_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("value", pa.binary()),
        ("user_agent", pa.string()),
        ("ip", pa.string()),
        ("late", pa.bool_()),
        ("period_start_ms", pa.int64()),
        ("period", pa.string()),
        ("batch_id", pa.int64()),
    ]
)

ARCHIVE_COLUMNS: tuple[str, ...] = tuple(ARCHIVE_SCHEMA.names)
