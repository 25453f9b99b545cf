"""The billing query's lag as Kafka and its checkpoint say it: the committed offsets read from a checkpoint as Spark
writes it, the records behind per topic, and a broker out of reach told at once."""

from __future__ import annotations

import time
from pathlib import Path

from billing.store.stream_offsets import KafkaLag, committed_offsets, records_behind
from ops.process import free_port
from web.freshness import AMBER, OK, RED, UNKNOWN, Freshness, kafka_status


def test_the_newest_committed_batch_gives_the_offsets(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    header = 'v1\n{"batchWatermarkMs":0}\n'
    (tmp_path / "offsets" / "4").write_text(header + '{"clicks":{"0":10,"1":20},"impressions":{"0":5}}\n')
    (tmp_path / "offsets" / "5").write_text(header + '{"clicks":{"0":99}}\n')  # planned, not committed
    (tmp_path / "commits" / "4").write_text("v1\n{}\n")
    assert committed_offsets(tmp_path) == {"clicks": {0: 10, 1: 20}, "impressions": {0: 5}}
    assert committed_offsets(tmp_path / "none") is None


def test_records_behind_count_every_partition_and_a_topic_never_read_from_zero() -> None:
    committed = {"clicks": {0: 10, 1: 20}}
    end = {"clicks": {0: 15, 1: 20, 2: 3}, "impressions": {0: 7}}
    assert records_behind(committed, end) == {"clicks": 8, "impressions": 7}
    assert records_behind(None, {"clicks": {0: 4}}) == {"clicks": 4}


def test_a_broker_that_is_down_is_told_at_once(tmp_path: Path) -> None:
    lag = KafkaLag(tmp_path, f"127.0.0.1:{free_port()}", ["clicks"], timeout_s=5)
    started = time.monotonic()
    reading = lag.read()
    assert time.monotonic() - started < 2
    assert reading.lag is None and reading.error and "does not answer" in reading.error
    assert lag.read() is reading, "kept a few seconds"


def fresh(level: str, age_ms: int) -> Freshness:
    return Freshness(level, 0, age_ms, "")


def test_kafka_s_status_from_its_own_figures() -> None:
    assert kafka_status(None, None, "Kafka at x does not answer").level == RED
    assert kafka_status({"clicks": 0}, None, None, fresh(OK, 1_000)).text == "0 records waiting to be read."
    stuck = kafka_status({"clicks": 23_000}, {"clicks": 0}, None, fresh(RED, 115_000))
    assert stuck.level == AMBER and stuck.text.startswith("23,000 records waiting, and the job last billed 115 s")
    assert kafka_status({"clicks": 20_000}, {"clicks": 10_000}, None, fresh(OK, 1_000)).level == AMBER  # growing
    assert kafka_status({"clicks": 20_000}, {"clicks": 30_000}, None, fresh(OK, 1_000)).level == OK  # catching up
    assert kafka_status({"clicks": 5}, None, None, None, committed=False).level == UNKNOWN
