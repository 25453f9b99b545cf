"""The SparkSession of each command, from the settings: master, connector jars, partitions, memory, state store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ops import deps
from ops.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session(settings: Settings, app_name: str, local_dir: Path, *, stateful: bool) -> SparkSession:
    """A session for `app_name` built from `settings`; `stateful` jobs use the configured state store, batch jobs
    the default one."""
    from attribution.session import build_spark

    return build_spark(
        app_name=app_name,
        master=settings.spark_master,
        jars=deps.ensure_spark_connector_jars(settings.deps_dir),
        shuffle_partitions=settings.shuffle_partitions,
        local_dir=local_dir,
        driver_memory=settings.driver_memory,
        rocksdb_state=stateful and settings.state_store == "rocksdb",
    )
