"""The health record of a micro-batch, from Spark's progress JSON."""

from __future__ import annotations

from typing import Any

from attribution.progress import summarize

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
DELAYS = {"impressions": 30_000, "clicks": 30_000}


def progress(batch_id: int, observed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": "billing", "batchId": batch_id, "observedMetrics": observed, "durationMs": {}}


def test_each_stream_s_watermark_is_its_largest_watermark_time_less_its_delay_across_batches() -> None:
    seen: dict[str, int] = {}
    first = summarize(
        progress(0, {"impressions": {"max_watermark_time": T0, "rows": 3, "clock_ahead": 0}}), DELAYS, seen
    )
    assert first["stream_watermarks_ms"] == {"impressions": T0 - 30_000, "clicks": None}
    # A batch whose largest watermark time is older does not move a stream's watermark back.
    later = summarize(
        progress(1, {"impressions": {"max_watermark_time": T0 - 5_000}, "clicks": {"max_watermark_time": T0}}),
        DELAYS,
        seen,
    )
    assert later["stream_watermarks_ms"] == {"impressions": T0 - 30_000, "clicks": T0 - 30_000}


def test_clock_ahead_events_of_the_batch_per_stream() -> None:
    record = summarize(
        progress(4, {"impressions": {"rows": 10, "clock_ahead": 1}, "clicks": {"rows": 2, "clock_ahead": 2}}),
        DELAYS,
        {},
    )
    assert record["clock_ahead_events"] == {"impressions": 1, "clicks": 2}
    assert summarize(progress(5, {}), DELAYS, {})["clock_ahead_events"] == {"impressions": 0, "clicks": 0}
