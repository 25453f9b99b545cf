"""The SparkSession of each command, from the settings: master, connector jars, partitions, memory, state store,
and on a Spark cluster the cores and memory the application may take."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ops import deps
from ops.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session(settings: Settings, app_name: str, local_dir: Path, *, stateful: bool) -> SparkSession:
    """A session for `app_name` built from `settings`; `stateful` jobs use the configured state store, batch jobs
    the default one. The streaming job is the stateful one: it takes ADBILL_STREAM_CORES on a cluster, the others
    ADBILL_BATCH_CORES, so that the job and reconciliation always both run."""
    from attribution.session import build_spark

    return build_spark(
        app_name=app_name,
        master=settings.spark_master,
        jars=deps.ensure_spark_connector_jars(settings.deps_dir),
        shuffle_partitions=settings.shuffle_partitions,
        local_dir=local_dir,
        driver_memory=settings.driver_memory,
        rocksdb_state=stateful and settings.state_store == "rocksdb",
        extra_conf=application_conf(settings, settings.stream_cores if stateful else settings.batch_cores),
    )


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
    if settings.spark_master.startswith("local") or settings.spark_is_local_cluster:
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    return conf
