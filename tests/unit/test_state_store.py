"""Which state store a new checkpoint of the streaming job gets, from the settings (`ADBILL_STATE_STORE`)."""

from __future__ import annotations

import pytest

from ops.settings import Settings


def test_auto_keeps_state_in_memory_in_local_mode_and_in_rocksdb_on_a_cluster() -> None:
    assert Settings.from_env({"ADBILL_SPARK_MASTER": "local[2]"}).state_in_rocksdb is False
    assert Settings.from_env({"ADBILL_SPARK_MASTER": "spark://10.0.0.5:7077"}).state_in_rocksdb is True


def test_a_chosen_store_holds_whatever_the_master() -> None:
    local = {"ADBILL_SPARK_MASTER": "local[2]"}
    assert Settings.from_env({**local, "ADBILL_STATE_STORE": "rocksdb"}).state_in_rocksdb is True
    cluster = {"ADBILL_SPARK_MASTER": "spark://10.0.0.5:7077"}
    assert Settings.from_env({**cluster, "ADBILL_STATE_STORE": "hdfs"}).state_in_rocksdb is False


def test_an_unknown_store_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, hdfs or rocksdb"):
        Settings.from_env({"ADBILL_STATE_STORE": "memory"})
