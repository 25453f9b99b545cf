"""The SparkSession the jobs run in: master, connector jars and state store come from the caller's settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

FILE_SYSTEM_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"

JOIN_STATE_FORMAT = "spark.sql.streaming.join.stateFormatVersion"
"""The format of a stream-stream join's state in a new checkpoint (Spark's default: 2). Spark records it in the
checkpoint's offset log when the query first starts, and a restart takes it from there, whatever the session says:
a checkpoint keeps the format it started with."""

JOIN_STATE_FORMAT_V4_GATE = "spark.sql.streaming.join.stateFormatV4.enabled"
"""Spark 4.2's gate of join state format 4 (under development there, SPARK-55144): without it, a task of a join
whose checkpoint has format 4 fails with `requirement failed: State format version 4 is under development`. Spark
does not record the gate in the offset log, so it is open in every session (`join_state_conf`)."""

AVRO_LENGTH_LIMIT = 16 * 1024 * 1024
"""The longest string or bytes field, and the most items of an array or map, that the Avro decoder accepts. Avro
allocates what a length prefix says before it reads a field: a record of a few bytes claiming a 2 GB string would
take the JVM down (OutOfMemoryError), and the same record again after every restart. No field can be longer than
its Kafka record (1 MiB by default), so a larger length is junk: Avro refuses it, and the decoder quarantines the
record as undecodable."""

JAVA_OPTIONS = " ".join(
    [
        "-Duser.timezone=UTC",
        *(
            f"-Dorg.apache.avro.limits.{name}.maxLength={AVRO_LENGTH_LIMIT}"
            for name in ("string", "bytes", "collectionItems")
        ),
    ]
)


def build_spark(
    app_name: str,
    master: str,
    jars: Sequence[Path],
    shuffle_partitions: int,
    local_dir: Path | None = None,
    driver_memory: str = "2g",
    rocksdb_state: bool = True,
    join_state_format: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """A session with the Kafka and Avro connectors on the classpath, UTC everywhere and Avro's length limits
    (`AVRO_LENGTH_LIMIT`); `join_state_format` is that of a new checkpoint's join (None: Spark's default)."""
    # The executors' Python workers run the sink's writers (`attribution.batch_output.PartitionWriter`): they need
    # the driver's interpreter and its packages (pyarrow), not whatever `python3` is first on the PATH. pyspark
    # reads the variable when the context starts (`SparkContext.pythonExec`); a deployment may set its own.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.jars", ",".join(str(jar) for jar in jars))
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", JAVA_OPTIONS)
        .config("spark.executor.extraJavaOptions", JAVA_OPTIONS)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.streaming.stateStore.stateSchemaCheck", "true")
        # The default manager renames through Hadoop's FileContext, which on a local file system runs a
        # `readlink` process per rename (RawLocalFileSystem.getFileLinkStatus): one per state store and log file,
        # every batch. FileSystem.rename is a plain rename there, and as atomic on HDFS.
        .config("spark.sql.streaming.checkpointFileManagerClass", FILE_SYSTEM_CHECKPOINTS)
    )
    # RocksDB's own settings hold whichever store a new checkpoint gets: a checkpoint keeps the store it started
    # with (Spark records the provider in its offset log), so a job may run RocksDB state under a session set up
    # for Spark's in-memory store.
    builder = builder.config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true").config(
        # One memory budget for the memtables and block caches of every RocksDB instance (one per state store and
        # partition, 20 in the job), instead of RocksDB's defaults per instance.
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage",
        "true",
    )
    if rocksdb_state:
        builder = builder.config(STATE_STORE_PROVIDER, ROCKSDB_PROVIDER)
    for key, value in join_state_conf(join_state_format).items():
        builder = builder.config(key, value)
    if local_dir is not None:
        builder = builder.config("spark.local.dir", str(local_dir))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def join_state_conf(join_state_format: int | None) -> dict[str, str]:
    """The Spark settings of the join's state format: `join_state_format` for a new checkpoint (None: Spark's
    default), and format 4's gate always open, so that a checkpoint that started with format 4 runs on however the
    setting is changed later (the gate changes nothing for a checkpoint of another format)."""
    conf = {JOIN_STATE_FORMAT_V4_GATE: "true"}
    if join_state_format is not None:
        conf[JOIN_STATE_FORMAT] = str(join_state_format)
    return conf
