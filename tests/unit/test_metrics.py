"""The job's Prometheus metrics follow Prometheus's conventions: counters of records, a histogram of batch durations
in seconds, watermarks as timestamps in seconds, and consumer lag per topic and partition; from Spark's progress
JSON, as the health listener gets it."""

from __future__ import annotations

import json

from prometheus_client import REGISTRY

from attribution.progress import consumer_lag, export, records_by_topic, summarize

T0_ISO = "2026-01-01T00:00:00.000Z"


def progress(name: str, start: dict | None, end: dict, latest: dict, duration_ms: int = 1500) -> dict:
    """A progress JSON of one query reading the impressions topic in two branches (join and intake), as Spark
    reports it: offsets as JSON text, each source with its own numInputRows."""
    source = {
        "description": "KafkaV2[Subscribe[impressions]]",
        "startOffset": json.dumps(start) if start else None,
        "endOffset": json.dumps(end),
        "latestOffset": json.dumps(latest),
        "numInputRows": 0,
    }
    return {
        "name": name,
        "batchId": 7,
        "timestamp": T0_ISO,
        "numInputRows": 0,
        "durationMs": {"triggerExecution": duration_ms},
        "eventTime": {"watermark": "2026-01-01T00:00:30.000Z"},
        "stateOperators": [{"numRowsTotal": 12, "memoryUsedBytes": 4096, "numRowsDroppedByWatermark": 3}],
        "sources": [source, dict(source)],
        "observedMetrics": {"impressions": {"max_watermark_time": 1_767_225_660_000}},
    }


def test_records_count_once_per_partition_even_when_two_branches_read_the_topic() -> None:
    record = summarize(
        progress("q", {"impressions": {"0": 10, "1": 5}}, {"impressions": {"0": 25, "1": 5}}, {}), {}, {}
    )
    assert records_by_topic(record["sources"]) == {"impressions": 15}
    first = summarize(progress("q", None, {"impressions": {"0": 4}}, {}), {}, {})
    assert records_by_topic(first["sources"]) == {"impressions": 4}, "a first batch starts from offset 0"


def test_consumer_lag_is_what_kafka_held_past_the_batchs_end_per_partition() -> None:
    record = summarize(
        progress("q", None, {"impressions": {"0": 25, "1": 5}}, {"impressions": {"0": 40, "1": 5}}), {}, {}
    )
    assert consumer_lag(record["sources"]) == {("impressions", "0"): 15, ("impressions", "1"): 0}


def test_a_batch_becomes_counters_a_histogram_in_seconds_and_timestamps_in_seconds() -> None:
    name = "metrics-test"
    seen: dict[str, int] = {}
    for start, end, duration in [(None, 10, 1500), (10, 25, 250)]:
        raw = progress(
            name,
            {"impressions": {"0": start}} if start else None,
            {"impressions": {"0": end}},
            {"impressions": {"0": 40}},
            duration,
        )
        export(summarize(raw, {"impressions": 30_000}, seen))

    def value(metric: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(metric, {"query": name, **labels})

    assert value("adbill_input_records_total", topic="impressions") == 25
    assert value("adbill_batches_total") == 2
    assert value("adbill_batch_duration_seconds_count") == 2
    assert value("adbill_batch_duration_seconds_sum") == 1.75
    assert value("adbill_batch_duration_seconds_bucket", le="0.25") == 1
    assert value("adbill_rows_dropped_by_watermark_total") == 6
    assert value("adbill_watermark_timestamp_seconds", stream="query") == 1_767_225_630
    assert value("adbill_watermark_timestamp_seconds", stream="impressions") == 1_767_225_630  # 60 s seen less 30 s
    assert value("adbill_last_batch_timestamp_seconds") == 1_767_225_600
    assert value("adbill_last_batch_id") == 7
    assert value("adbill_consumer_lag_records", topic="impressions", partition="0") == 15
    assert value("adbill_state_memory_bytes") == 4096
    names = {metric.name for metric in REGISTRY.collect()}
    assert not any(n.endswith("_ms") or "_ms_" in n for n in names if n.startswith("adbill_")), names


def test_reconciliation_counts_runs_by_outcome_closed_periods_and_corrections_by_kind() -> None:
    from prometheus_client import CollectorRegistry

    from billing.reconcile_run import RunReport
    from ops.reconcile import ReconcileMetrics

    registry = CollectorRegistry()
    metrics = ReconcileMetrics(registry)
    report = RunReport("r1", 0, periods=["p1", "p2"], closed=["p1"], additions=3, retractions=2, finished_at_ms=1)
    metrics.done(report, 12.5)
    metrics.outcome("busy", 0.01)
    assert registry.get_sample_value("adbill_reconcile_runs_total", {"outcome": "done"}) == 1
    assert registry.get_sample_value("adbill_reconcile_runs_total", {"outcome": "busy"}) == 1
    assert registry.get_sample_value("adbill_reconcile_runs_total", {"outcome": "refused"}) == 0
    assert registry.get_sample_value("adbill_reconcile_periods_closed_total") == 1
    assert registry.get_sample_value("adbill_reconcile_corrections_total", {"kind": "retraction"}) == 2
    assert registry.get_sample_value("adbill_reconcile_run_duration_seconds_sum") == 12.51


def test_spark_ui_on_its_port_and_an_event_log_folder_from_the_settings(tmp_path) -> None:
    from ops.settings import Settings
    from ops.spark import observability_conf

    conf = observability_conf(Settings.from_env({}, home=tmp_path))
    assert conf["spark.ui.enabled"] == "true" and conf["spark.ui.port"] == "4040"
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == (tmp_path.resolve() / "spark-events").as_uri()
    assert conf["spark.eventLog.rolling.enabled"] == "true"
    off = observability_conf(Settings.from_env({"ADBILL_SPARK_UI_PORT": "0"}, home=tmp_path))
    assert "spark.ui.enabled" not in off, "0: the session's own default, off"


def test_old_event_logs_are_trimmed_oldest_application_first(tmp_path) -> None:
    import os

    from ops.spark import trim_event_logs

    for n, name in enumerate(["eventlog_v2_app-1", "eventlog_v2_app-2", "app-3.zstd"]):
        entry = tmp_path / name
        if name.startswith("eventlog_v2_"):
            entry.mkdir()
            (entry / f"events_1_{name}").write_bytes(b"x" * 400)
            (entry / f"appstatus_{name}").write_bytes(b"")
        else:
            entry.write_bytes(b"x" * 400)
        os.utime(entry, (1_000 + n, 1_000 + n))
    assert trim_event_logs(tmp_path, 1_000) == [tmp_path / "eventlog_v2_app-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app-3.zstd", "eventlog_v2_app-2"]
    assert trim_event_logs(tmp_path, 1_000) == []
