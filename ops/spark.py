"""The SparkSession of each command, from the settings: master, connector jars, partitions, memory, state store,
and on a Spark cluster the cores and memory the application may take."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ops import deps
from ops.settings import Settings, spark_conf_pairs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session(settings: Settings, app_name: str, local_dir: Path, *, stateful: bool) -> SparkSession:
    """A session for `app_name` built from `settings`; `stateful` jobs use the configured state store and join state
    format, batch jobs the default ones. The streaming job is the stateful one: it takes ADBILL_STREAM_CORES on a
    cluster, the others ADBILL_BATCH_CORES, so that the job and reconciliation always both run."""
    from attribution.session import build_spark

    if settings.spark_in_process:
        # Spark's UI binds to SPARK_LOCAL_IP (else every interface): on one machine, loopback only.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings.spark_event_log_dir.mkdir(parents=True, exist_ok=True)
    trim_event_logs(settings.spark_event_log_dir, settings.spark_event_log_max_mb * 1_000_000)
    return build_spark(
        app_name=app_name,
        master=settings.spark_master,
        jars=deps.ensure_spark_connector_jars(settings.deps_dir),
        shuffle_partitions=settings.shuffle_partitions,
        local_dir=local_dir,
        driver_memory=settings.driver_memory,
        rocksdb_state=stateful and settings.new_state_store == "rocksdb",
        join_state_format=join_state_format(settings) if stateful else None,
        extra_conf={
            **observability_conf(settings),
            **application_conf(settings, settings.stream_cores if stateful else settings.batch_cores),
            **spark_conf_pairs(settings.spark_conf),
        },
    )


def join_state_format(settings: Settings) -> int | None:
    """The join state format a new checkpoint of the job gets (`ADBILL_JOIN_STATE_FORMAT`); None: Spark's default."""
    return None if settings.join_state_format == "default" else int(settings.join_state_format)


def observability_conf(settings: Settings) -> dict[str, str]:
    """Spark's UI on `ADBILL_SPARK_UI_PORT` (off at 0) and its event log, rolled, in `ADBILL_SPARK_EVENT_LOG_DIR`."""
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": settings.spark_event_log_dir.as_uri(),
        "spark.eventLog.compress": "true",
        "spark.eventLog.rolling.enabled": "true",
        "spark.eventLog.rolling.maxFileSize": "64m",
    }
    if settings.spark_ui_port:
        conf.update({"spark.ui.enabled": "true", "spark.ui.port": str(settings.spark_ui_port)})
    return conf


def trim_event_logs(folder: Path, max_bytes: int) -> list[Path]:
    """Delete whole applications' event logs (a file, or a rolled `eventlog_v2_*` folder), oldest first, until the
    folder holds at most `max_bytes`; returns what was deleted. Runs before a session starts, so never its own."""
    import shutil

    def size(entry: Path) -> int:
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        return sum(p.stat().st_size for p in files)

    entries = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime)
    sizes = {entry: size(entry) for entry in entries}
    total = sum(sizes.values())
    deleted = []
    for entry in entries:
        if total <= max_bytes:
            break
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        total -= sizes[entry]
        deleted.append(entry)
    return deleted


def application_conf(settings: Settings, cores: int) -> dict[str, str]:
    """Spark settings of one application: on a standalone master, at most `cores` cores in executors of one core
    and ADBILL_EXECUTOR_MEMORY each (without `spark.cores.max` the first application takes every core and the
    next waits forever); on this machine's loopback, the driver listens there only."""
    conf: dict[str, str] = {}
    if settings.spark_master.startswith("spark://"):
        conf.update(
            {
                "spark.cores.max": str(cores),
                "spark.executor.cores": "1",
                "spark.executor.memory": settings.executor_memory,
                # A task lost with its executor (a worker killed) runs again elsewhere.
                "spark.task.maxFailures": "8",
            }
        )
    if settings.spark_in_process or settings.spark_is_local_cluster:
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    return conf
