"""`ops.bench.eventlog`: a batch's time from Spark's event log, on events written here in Spark's own format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ops.bench.eventlog import PROGRESS, batch_times, breakdowns, mean_breakdown, read_events, render, stage_name

QUERY, OTHER = "query-a", "query-b"
T0 = 1_795_560_600_000
"""2026-11-24T22:50:00Z in epoch ms."""


def progress(query: str, batch_id: int, start_ms: int, rows: int, planning: int, add_batch: int) -> dict[str, Any]:
    stamp = f"2026-11-24T22:{50 + (start_ms - T0) // 60_000:02d}:{(start_ms - T0) // 1000 % 60:02d}.000Z"
    total = planning + add_batch + 10
    return {
        "Event": PROGRESS,
        "progress": {
            "id": query,
            "batchId": batch_id,
            "timestamp": stamp,
            "durationMs": {"triggerExecution": total, "queryPlanning": planning, "addBatch": add_batch},
            # Each topic read by two sources, as the pipeline's join and intake read it.
            "sources": [{"numInputRows": rows // 2}, {"numInputRows": rows - rows // 2}],
        },
    }


def job(job_id: int, query: str, batch_id: int, stages: list[int], start: int, end: int) -> list[dict[str, Any]]:
    props = {"sql.streaming.queryId": query, "streaming.sql.batchId": str(batch_id)}
    return [
        {
            "Event": "SparkListenerJobStart",
            "Job ID": job_id,
            "Submission Time": start,
            "Stage IDs": stages,
            "Properties": props,
        },
        {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": end},
    ]


def stage(stage_id: int, operators: list[str], submitted: int, completed: int) -> dict[str, Any]:
    rdds = [
        {"Name": "MapPartitionsRDD", "Scope": json.dumps({"id": f"plan_{i}", "name": op})}
        for i, op in enumerate(operators)
    ]
    info = {"Stage ID": stage_id, "RDD Info": rdds, "Submission Time": submitted, "Completion Time": completed}
    return {"Event": "SparkListenerStageCompleted", "Stage Info": info}


def task(stage_id: int, run: int, cpu_ms: int, records: int) -> dict[str, Any]:
    metrics = {
        "Executor Run Time": run,
        "Executor CPU Time": cpu_ms * 1_000_000,
        "Executor Deserialize Time": 5,
        "JVM GC Time": 2,
        "Input Metrics": {"Records Read": records},
    }
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage_id, "Task Metrics": metrics}


def run_events() -> list[dict[str, Any]]:
    """Two batches of QUERY with records (two scans side by side, then the join), an empty one, and a batch of
    another query with more progress events of its own left out."""
    events: list[dict[str, Any]] = []
    for batch, start in ((0, T0), (1, T0 + 10_000)):
        first = 10 * batch
        events.append(progress(QUERY, batch, start, 1_000 * (batch + 1), planning=100, add_batch=900))
        events += job(batch, QUERY, batch, [first, first + 1, first + 2], start + 100, start + 700)
        events += [
            task(first, 300, 100, 400),
            task(first, 200, 100, 100),
            stage(first, ["Exchange", "MicroBatchScan"], start + 100, start + 300),
        ]
        events += [task(first + 1, 100, 50, 500), stage(first + 1, ["MicroBatchScan"], start + 100, start + 400)]
        events += [
            task(first + 2, 400, 300, 0),
            stage(first + 2, ["StreamingSymmetricHashJoin", "Exchange"], start + 400, start + 700),
        ]
    events.append(progress(QUERY, 2, T0 + 20_000, 0, planning=50, add_batch=100))
    events += [progress(OTHER, b, T0 + b * 1000, 10, 1, 1) for b in range(1)]
    events += job(7, OTHER, 0, [70], T0, T0 + 50) + [task(70, 999, 999, 9), stage(70, ["MicroBatchScan"], T0, T0 + 50)]
    return events


def test_a_stage_is_named_by_its_operators_in_a_fixed_order() -> None:
    assert stage_name(stage(1, ["Exchange", "MicroBatchScan"], 0, 1)["Stage Info"]) == "scan"
    info = stage(2, ["mapPartitionsInternal", "Union", "StreamingDeduplicateWithinWatermark", "MicroBatchScan"], 0, 1)
    assert stage_name(info["Stage Info"]) == "dedup+scan+union+collect"
    assert stage_name(stage(3, ["Exchange"], 0, 1)["Stage Info"]) == "other"


def test_the_batches_of_the_query_with_the_most_progress_and_their_stages() -> None:
    batches = batch_times(run_events())
    assert [b.batch_id for b in batches] == [0, 1, 2]
    first = batches[0]
    assert (first.input_rows, first.jobs, first.jobs_ms) == (1_000, 1, 600)
    assert first.end_ms == T0 + 1_010
    # The two scans, side by side, count as one row: from the first's submission to the last's completion.
    assert [s.name for s in first.stages] == ["scan", "join"]
    scan = first.stages[0]
    assert (scan.stages, scan.tasks, scan.run_ms, scan.cpu_ms, scan.records_read) == (2, 3, 600, 250, 1_000)
    assert scan.wall_ms == 300
    assert (batches[2].jobs, batches[2].stages) == (0, [])


def test_the_mean_breakdown_splits_add_batch_into_jobs_and_the_drivers_rest() -> None:
    figures = mean_breakdown([b for b in batch_times(run_events()) if b.input_rows > 0])
    assert figures["batches"] == 2
    assert figures["rows"] == 1_500
    assert (figures["addBatch"], figures["jobs_ms"], figures["driver_in_add_batch_ms"]) == (900, 600, 300)
    assert figures["other_phases_ms"] == 10
    join = next(s for s in figures["stages"] if s["name"] == "join")
    assert (join["cpu_ms"], join["tasks"], join["wall_ms"], join["stages"]) == (300, 1, 300, 1)
    assert mean_breakdown([]) == {"batches": 0}


def test_steps_take_the_batches_that_ended_in_their_window_from_a_compressed_log(tmp_path: Path) -> None:
    folder = tmp_path / "pipeline" / "spark-events" / "eventlog_v2_local-1"
    folder.mkdir(parents=True)
    text = "\n".join(json.dumps(e) for e in run_events()).encode()
    with pa.CompressedOutputStream(str(folder / "events_1_local-1.zstd"), "zstd") as out:
        out.write(text)
    (folder / "appstatus_local-1").write_text("")
    assert len(read_events(tmp_path / "pipeline" / "spark-events")) == len(run_events())
    steps = [
        {"offered_rate": 5_000, "sender": {"first_send": T0 / 1000 - 1}},
        {"offered_rate": 10_000, "sender": {"first_send": (T0 + 5_000) / 1000}},
    ]
    found = breakdowns(tmp_path, {"pipeline": {"steps": steps}, "baseline": {"steps": []}})
    assert list(found) == ["pipeline"], "only systems whose event log is kept"
    (label1, first), (label2, second) = found["pipeline"]
    assert (label1, first["batches"], first["rows"]) == ("5,000/s", 1, 1_000)
    assert (label2, second["batches"], second["rows"]) == ("10,000/s", 1, 2_000)
    text_out = "\n".join(render("pipeline", found["pipeline"]))
    assert "| 10,000/s | join | 1.0 | 300 | 1 | 400 | 300 | 5 | 2 | 0 |" in text_out
    assert "| 10,000/s | scan | 2.0 | 300 | 3 | 600 | 250 | 15 | 6 | 1,000 |" in text_out


@pytest.mark.parametrize("name", ["notes.txt", ".events_1.zstd.crc"])
def test_files_that_are_not_event_logs_are_skipped(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("not json")
    assert read_events(tmp_path) == []
