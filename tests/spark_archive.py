"""A class-data-sharing archive of Spark's classes for the JVMs the tests start (`make test` builds it first).

A Spark driver loads and verifies some 15,000 classes from pyspark's jars before it runs anything: on the 2-core
machine a session's start and one small query take 7.3 s and 9 s of CPU, and 3.8 s and 5 s with the classes mapped
from an archive the JVM dumped at the end of an earlier run (JDK 17's dynamic archive, `-XX:ArchiveClassesAtExit`).
The tests start a driver for every job they run, so the archive is dumped once per machine, from a run that does
what a job does (a session with the connectors, Avro, a stream-stream join with watermarks, `foreachBatch`), and
kept under `.deps/` by the Java build, pyspark's version and pyspark's jars: a new JDK or pyspark dumps a new one.

`java_options()` adds it to the tests' `JAVA_TOOL_OPTIONS` when it exists. A JVM whose class path is not the one
dumped with (a Kafka broker) maps no archive and runs as before; the archive's own warnings
are turned off so that no tool's output changes. The product's own runs do not use it.

    python -m tests.spark_archive    # dump it if missing; prints where it is
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ops import deps
from ops.settings import PROJECT_ROOT

ARCHIVES_DIR = PROJECT_ROOT / ".deps" / "class-archives"
QUIET = "-Xlog:cds*=off"
"""The archive's log lines (a JVM that cannot map it says so on every start) stay out of every process's output."""


def archive_path() -> Path:
    """Where the archive of this JDK and pyspark is (whether or not it exists yet)."""
    import pyspark

    plain = {name: value for name, value in os.environ.items() if name != "JAVA_TOOL_OPTIONS"}
    java = subprocess.run([deps.java_binary(), "-version"], capture_output=True, text=True, check=True, env=plain)
    pyspark_jars = sorted(path.name for path in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    key = "\n".join([java.stderr, pyspark.__version__, *pyspark_jars])
    return ARCHIVES_DIR / f"spark-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def java_options(base: str) -> str:
    """`base` and, where the archive exists, the options that map it (nothing is dumped here)."""
    archive = archive_path()
    if not archive.exists():
        return base
    return f"{base} -XX:SharedArchiveFile={archive} {QUIET}"


def ensure(base: str) -> Path:
    """The archive, dumped first if missing: `_warm_up` run with `base` options, its driver writing the classes it
    loaded when it exits, to a staging name renamed into place (an older archive is removed)."""
    archive = archive_path()
    if archive.exists():
        return archive
    ARCHIVES_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ARCHIVES_DIR) as staging_dir:
        staging = Path(staging_dir) / archive.name
        print(f"dumping Spark's classes for the tests' JVMs into {archive} ...", file=sys.stderr, flush=True)
        warm_up = [sys.executable, "-m", "tests.spark_archive", "--warm-up", str(staging)]
        done = subprocess.run(
            warm_up, env={**os.environ, "JAVA_TOOL_OPTIONS": base}, cwd=PROJECT_ROOT, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"the warm-up run failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
        if not staging.exists():
            raise RuntimeError(f"the driver wrote no archive at {staging}")
        with staging.open("rb") as written:
            os.fsync(written.fileno())  # a JVM maps what the header promises: never a file cut short
        for old in ARCHIVES_DIR.glob("*.jsa"):
            old.unlink()
        staging.rename(archive)
    return archive


def _warm_up(staging: Path) -> None:
    """What a job's driver does, small: the session, Avro both ways, a batch aggregate, and a stream-stream join of
    two rate sources with watermarks written through `foreachBatch`. Only the driver dumps (not spark-submit's
    launcher JVM before it), and this waits for it to exit, which is when it writes `staging`."""
    from pyspark import SparkContext
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    from attribution.session import JAVA_OPTIONS, build_spark

    jars = deps.ensure_spark_connector_jars(PROJECT_ROOT / ".deps")
    dump = {"spark.driver.extraJavaOptions": f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={staging} {QUIET}"}
    with tempfile.TemporaryDirectory() as scratch:
        spark = build_spark(
            "class-archive", "local[2]", jars, 4, local_dir=Path(scratch), rocksdb_state=False, extra_conf=dump
        )
        schema = '{"type":"record","name":"E","fields":[{"name":"id","type":"long"}]}'
        events = spark.range(1000).select(from_avro(to_avro(F.struct("id")), schema).alias("e"))
        events.groupBy(F.col("e.id") % 7).count().collect()

        def rate(value: str, time: str) -> DataFrame:
            stream = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
            return stream.select(F.col("value").alias(value), F.col("timestamp").alias(time)).withWatermark(
                time, "10 seconds"
            )

        left, right = rate("a", "at"), rate("b", "bt")
        joined = left.join(right, F.expr("a = b AND bt BETWEEN at AND at + interval 10 seconds"))
        query = (
            joined.writeStream.foreachBatch(lambda frame, _batch: frame.count())
            .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
            .trigger(processingTime="3 seconds")
            .start()
        )
        while query.lastProgress is None or query.lastProgress["batchId"] < 1:
            query.awaitTermination(1)
        query.stop()
        driver = SparkContext._gateway.proc  # type: ignore[attr-defined]
        spark.stop()
        driver.stdin.close()  # the gateway exits when its input closes
        driver.wait(timeout=120)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--warm-up"]:
        _warm_up(Path(sys.argv[2]))
    else:
        from tests.conftest import TEST_JAVA_OPTIONS

        try:
            print(ensure(TEST_JAVA_OPTIONS))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            # Without it the tests' JVMs load the classes from the jars, as the product's do: slower, not different.
            print(f"no class archive for the tests' JVMs, they run without one: {error}", file=sys.stderr)
