"""Billing periods on Spark columns (`billing.periods` on DataFrames)."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F


def period_columns(time_ms: Column, period_ms: int) -> list[Column]:
    """`period_start_ms` and `period` (its key, `YYYYMMDDTHHMMZ` in UTC) of an epoch-ms column."""
    start = time_ms - time_ms % F.lit(period_ms)
    key = F.date_format(F.timestamp_millis(start), "yyyyMMdd'T'HHmm'Z'")
    return [start.alias("period_start_ms"), key.alias("period")]
