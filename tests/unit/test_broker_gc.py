"""The broker's collector: G1 as Kafka's own start script gives it, unless the JVM options from the environment
choose one (a JVM given two collectors refuses to start)."""

from __future__ import annotations

from ops.kafka_service import BROKER_GC_OPTIONS, gc_options


def test_a_broker_collects_with_g1_by_default() -> None:
    assert gc_options({}) == BROKER_GC_OPTIONS
    assert gc_options({"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}) == BROKER_GC_OPTIONS


def test_a_collector_chosen_in_the_environment_wins() -> None:
    assert gc_options({"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}) == ()
    assert gc_options({"JDK_JAVA_OPTIONS": "-XX:+UseParallelGC"}) == ()


def test_turning_a_collector_off_is_not_choosing_one() -> None:
    assert gc_options({"JAVA_TOOL_OPTIONS": "-XX:-UseG1GC"}) == BROKER_GC_OPTIONS
