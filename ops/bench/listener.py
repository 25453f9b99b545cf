"""A micro-benchmark of what a query listener costs the driver per batch, run by hand:
`python -m ops.bench.listener [seconds]` (default 60).

A local Spark session runs a stream-stream join of two rate sources with watermarks and observed metrics (the shape
of the job's progress: two sources, a join's state, two observed metrics), one batch every 500 ms. For each progress
event the listener times, in turn, pyspark's conversion of the event (`QueryProgressEvent.fromJObject`, what every
plain `StreamingQueryListener` gets, then `.json` of it, as the job's health listener read it) and the job's own path
(`attribution.listener`: `progress().json()`, one call), and the lookup of `PythonSQLUtils` that pyspark's conversion
makes for the observed metrics. It prints the median and mean of each per event, and what
the job's three listeners cost per batch either way: three conversions (health, heartbeat, lock) before, two JSON
reads (health, heartbeat) now.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import QueryProgressEvent

from attribution.listener import ProgressListener, _JsonProgress


class _Timing(_JsonProgress):
    """Times both conversions of every progress event, alternating which goes first."""

    def __init__(self, listener: ProgressListener) -> None:
        super().__init__(listener)
        self.pyspark_ms: list[float] = []
        self.json_ms: list[float] = []
        self.lookup_ms: list[float] = []

    def onQueryProgress(self, jevent: Any) -> None:
        def pyspark() -> None:
            started = time.perf_counter()
            json.loads(QueryProgressEvent.fromJObject(jevent).progress.json)
            self.pyspark_ms.append((time.perf_counter() - started) * 1000)

        def lean() -> None:
            started = time.perf_counter()
            json.loads(jevent.progress().json())
            self.json_ms.append((time.perf_counter() - started) * 1000)

        def lookup() -> None:
            from pyspark import SparkContext

            started = time.perf_counter()
            SparkContext._jvm.PythonSQLUtils  # type: ignore[union-attr]  # noqa: B018 (the lookup is what is timed)
            self.lookup_ms.append((time.perf_counter() - started) * 1000)

        for measure in (pyspark, lean, lookup) if len(self.json_ms) % 2 else (lookup, lean, pyspark):
            measure()


class _Listener(ProgressListener):
    def __init__(self) -> None:
        self.timing: _Timing | None = None

    def _java_events(self) -> _Timing:
        self.timing = _Timing(self)
        return self.timing


def _summary(label: str, values: list[float]) -> str:
    return f"{label:<48} median {statistics.median(values):7.2f} ms, mean {statistics.fmean(values):7.2f} ms"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    seconds = float(args[0]) if args else 60.0
    with tempfile.TemporaryDirectory() as folder:
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("adbill-listener-bench")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        listener = _Listener()
        spark.streams.addListener(listener)

        def side(name: str) -> Any:
            rows = spark.readStream.format("rate").option("rowsPerSecond", 2_000).load()
            rows = rows.select((F.col("value") % 5_000).alias(f"{name}_user"), F.col("timestamp").alias(f"{name}_time"))
            rows = rows.observe(
                name,
                F.max(F.col(f"{name}_time").cast("long")).alias("max_watermark_time"),
                F.count(F.lit(1)).alias("clock_ahead"),
            )
            return rows.withWatermark(f"{name}_time", "30 seconds")

        joined = side("impressions").join(
            side("clicks"),
            F.expr(
                "impressions_user = clicks_user AND clicks_time BETWEEN impressions_time "
                "AND impressions_time + interval 10 seconds"
            ),
        )
        query = (
            joined.writeStream.format("noop")
            .option("checkpointLocation", f"{folder}/checkpoint")
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        time.sleep(seconds)
        query.stop()
        spark.stop()
    timing = listener.timing
    assert timing is not None and timing.json_ms, "no progress event reached the listener"
    print(f"{len(timing.json_ms)} progress events over {seconds:.0f} s")
    print(_summary("pyspark's conversion (fromJObject), then .json", timing.pyspark_ms))
    print(_summary("progress().json() (attribution.listener)", timing.json_ms))
    print(_summary("of the conversion: looking up PythonSQLUtils", timing.lookup_ms))
    before = 3 * statistics.fmean(timing.pyspark_ms)
    after = 2 * statistics.fmean(timing.json_ms)
    print(f"the job's three listeners per batch: {before:.1f} ms before, {after:.1f} ms now")


if __name__ == "__main__":
    main()
