"""Which failure of the streaming query the job answers by starting it again (`ops.streaming.run_stream`)."""

from __future__ import annotations

from attribution.job import replay_progress_failure


class _Captured(Exception):
    """What pyspark hands over for a failed query: the JVM's message and stack trace as text."""

    def __init__(self, desc: str, stack: str) -> None:
        super().__init__(desc)
        self._desc, self._stackTrace = desc, stack


def test_only_the_kafka_sources_replay_progress_failure_is_taken_for_it() -> None:
    npe = 'java.lang.NullPointerException: Cannot invoke "scala.collection.IterableOps.map(scala.Function1)"'
    stack = "at org.apache.spark.sql.kafka010.KafkaMicroBatchStream$.metrics(KafkaMicroBatchStream.scala:520)"
    assert replay_progress_failure(_Captured(npe, stack))
    assert not replay_progress_failure(None)
    assert not replay_progress_failure(_Captured(npe, "at org.apache.spark.sql.execution.SomethingElse.run"))
    assert not replay_progress_failure(
        _Captured("Redis did not answer", stack.replace("metrics", "planInputPartitions"))
    )
