"""The join state format of a new checkpoint (`ADBILL_JOIN_STATE_FORMAT`), and the one a checkpoint keeps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from attribution.job import checkpoint_join_state_format
from attribution.session import JOIN_STATE_FORMAT, JOIN_STATE_FORMAT_V4_GATE, join_state_conf
from ops.settings import Settings
from ops.spark import join_state_format


def test_the_default_is_spark_s_format_and_4_is_asked_for_by_name() -> None:
    assert Settings.from_env({}).join_state_format == "default"
    assert join_state_format(Settings.from_env({})) is None
    rocksdb = {"ADBILL_STATE_STORE": "rocksdb"}
    assert join_state_format(Settings.from_env({**rocksdb, "ADBILL_JOIN_STATE_FORMAT": "4"})) == 4


def test_format_4_s_gate_is_open_whatever_the_format_of_a_new_checkpoint() -> None:
    # A checkpoint that started with format 4 keeps it (the offset log), and Spark's gate is not recorded there: a
    # session without the gate would fail that checkpoint's tasks.
    assert join_state_conf(None) == {JOIN_STATE_FORMAT_V4_GATE: "true"}
    assert join_state_conf(4) == {JOIN_STATE_FORMAT_V4_GATE: "true", JOIN_STATE_FORMAT: "4"}


def test_format_4_with_the_in_memory_state_store_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="ADBILL_JOIN_STATE_FORMAT=4 .* ADBILL_STATE_STORE=rocksdb"):
        Settings.from_env({"ADBILL_JOIN_STATE_FORMAT": "4", "ADBILL_STATE_STORE": "hdfs"})
    with pytest.raises(ValueError, match="ADBILL_JOIN_STATE_FORMAT=4 .* ADBILL_STATE_STORE=rocksdb"):
        Settings.from_env({"ADBILL_JOIN_STATE_FORMAT": "4"})  # the in-memory store is the default on one machine
    assert Settings.from_env({"ADBILL_STATE_STORE": "hdfs"}).join_state_format == "default"


def test_the_state_is_in_memory_on_one_machine_and_in_rocksdb_on_the_cluster() -> None:
    assert (Settings.from_env({}).new_state_store, Settings.from_env({}).driver_memory) == ("hdfs", "4g")
    assert Settings.from_env({"ADBILL_CLUSTER": "1"}).new_state_store == "rocksdb"
    assert Settings.from_env({"ADBILL_CLUSTER": "1", "ADBILL_STATE_STORE": "hdfs"}).new_state_store == "hdfs"
    assert Settings.from_env({"ADBILL_STATE_STORE": "rocksdb"}).new_state_store == "rocksdb"


def test_a_job_on_a_spark_master_keeps_its_state_in_rocksdb_without_being_told() -> None:
    # The executors of a cluster have ADBILL_EXECUTOR_MEMORY (1g): the join's state in their heap ran them out of
    # memory on a backlog of 400,000 events (`make bench-cluster` with one worker), where RocksDB keeps it off-heap.
    master = {"ADBILL_SPARK_MASTER": "spark://10.0.0.5:7077"}
    assert Settings.from_env(master).new_state_store == "rocksdb"
    on_a_master = dataclasses.replace(Settings.from_env({}), spark_master="spark://127.0.0.1:7077")
    assert on_a_master.new_state_store == "rocksdb"
    assert Settings.from_env({**master, "ADBILL_STATE_STORE": "hdfs"}).new_state_store == "hdfs"
    assert join_state_format(Settings.from_env({**master, "ADBILL_JOIN_STATE_FORMAT": "4"})) == 4


def test_an_unknown_state_store_is_refused() -> None:
    with pytest.raises(ValueError, match="ADBILL_STATE_STORE must be auto, hdfs or rocksdb"):
        Settings.from_env({"ADBILL_STATE_STORE": "memory"})


@pytest.mark.parametrize("value", ["3", "v4", ""])
def test_another_value_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="ADBILL_JOIN_STATE_FORMAT must be default or 4"):
        Settings.from_env({"ADBILL_JOIN_STATE_FORMAT": value})


def _plan_batch(checkpoint: Path, batch_id: int, conf: dict[str, str]) -> None:
    """An offset log entry as Spark writes it: the version, the batch's metadata, then each source's offsets."""
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": conf}
    (offsets / str(batch_id)).write_text(f'v1\n{json.dumps(metadata)}\n{{"clicks":{{"0":5}}}}')


def test_a_checkpoint_keeps_the_format_its_offset_log_records(tmp_path: Path) -> None:
    checkpoint = tmp_path / "billing"
    assert checkpoint_join_state_format(checkpoint) is None  # new: the setting decides
    _plan_batch(checkpoint, 0, {JOIN_STATE_FORMAT: "2", "spark.sql.shuffle.partitions": "4"})
    assert checkpoint_join_state_format(checkpoint) == 2
    _plan_batch(checkpoint, 1, {JOIN_STATE_FORMAT: "4"})
    (checkpoint / "offsets" / ".1.crc").write_text("")
    assert checkpoint_join_state_format(checkpoint) == 4  # the newest batch's entry
    _plan_batch(tmp_path / "older", 0, {"spark.sql.shuffle.partitions": "4"})
    assert checkpoint_join_state_format(tmp_path / "older") is None
