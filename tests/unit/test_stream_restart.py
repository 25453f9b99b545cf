"""Which failure of the streaming query the job answers by starting it again (`ops.streaming.run_stream`)."""

from __future__ import annotations

from attribution.job import replay_progress_failure

NPE = (
    'java.lang.NullPointerException: Cannot invoke "scala.collection.IterableOps.map(scala.Function1)" because the '
    'return value of "scala.Option.get()" is null'
)
FRAMES = [
    "org.apache.spark.sql.kafka010.KafkaMicroBatchStream$.metrics(KafkaMicroBatchStream.scala:520)",
    "org.apache.spark.sql.kafka010.KafkaMicroBatchStream.metrics(KafkaMicroBatchStream.scala:363)",
    "org.apache.spark.sql.execution.streaming.runtime.ProgressContext.extractSourceProgress(ProgressReporter.scala:379)",
]


def test_the_kafka_sources_replay_progress_failure_is_taken_for_it() -> None:
    assert replay_progress_failure(NPE, FRAMES)


def test_any_other_failure_is_not() -> None:
    assert not replay_progress_failure("", [])
    # The same exception elsewhere, or another one in the same place, stops the job as before.
    assert not replay_progress_failure(NPE, ["org.apache.spark.sql.execution.SparkPlan.execute(SparkPlan.scala:1)"])
    assert not replay_progress_failure("java.io.IOException: No space left on device", FRAMES)
    assert not replay_progress_failure(NPE, [f.replace(".metrics(", ".planInputPartitions(") for f in FRAMES])
