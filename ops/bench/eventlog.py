"""Where a micro-batch's time goes, from Spark's event log of a benchmark run, run by hand:
`python -m ops.bench.eventlog var/bench/<time> [--systems pipeline,pipeline-v4]`.

Every system of a `make bench` run keeps Spark's event log in `<report>/<system>/spark-events/` (the job's own
setting; compressed with zstd, rolled at 64 MB). For each system and each step of offered traffic, over the batches
of its streaming query that read records, this prints (and writes to `<report>/batch-time.md`) the mean per batch
of:

- Spark's phases of the batch (`durationMs`: queryPlanning, addBatch, the rest), and within addBatch the time its
  Spark jobs ran (submission to end) and the rest, which is the driver's: planning the sink's own Dataset, the
  sink's Python (splitting, pricing and writing the files when the batch is collected to the driver), Redis;
- each stage of the batch's jobs, named by the operators it runs (the Kafka scan and decode of one topic, the
  join, the de-duplication and the intake): its wall time, tasks, and its tasks' run time, CPU time, time
  deserializing the task, GC time and records read from Kafka.

A step's batches are those that ended after its first send and before the next step's (`report.json`: the
senders' `first_send`); the steady state of a rate, not the catch-up on the backlog or the burst.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

OPERATORS = (
    ("StreamingSymmetricHashJoin", "join"),
    ("StreamingDeduplicateWithinWatermark", "dedup"),
    ("StreamingDeduplicate", "dedup"),
    ("StateStoreSave", "aggregate"),
    ("MicroBatchScan", "scan"),
    ("Union", "union"),
    ("mapPartitionsInternal", "collect"),
    ("MapInArrow", "python"),
    ("PythonMapInArrow", "python"),
)
"""Operators a stage is named by (from its RDDs' scopes), in this order."""

PROGRESS = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"


def read_events(folder: Path) -> list[dict[str, Any]]:
    """The events of every application log under `folder` (Spark's rolled `eventlog_v2_*` folders or single
    files; zstd-compressed or plain), in file order."""
    events: list[dict[str, Any]] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "appstatus"))):
        if path.suffix == ".zstd":
            with pa.CompressedInputStream(pa.OSFile(str(path)), "zstd") as stream:
                text = stream.read().decode()
        elif path.suffix in ("", ".inprogress"):
            text = path.read_text()
        else:
            continue
        events += [json.loads(line) for line in text.splitlines() if line.strip()]
    return events


@dataclass
class StageTime:
    """A batch's stages of one name, such as the two topics' scans, which run side by side: their tasks' figures
    summed, their wall time from the first one's submission to the last one's completion."""

    name: str
    stages: int = 0
    submitted_ms: int = 0
    completed_ms: int = 0
    tasks: int = 0
    run_ms: int = 0
    cpu_ms: float = 0.0
    deserialize_ms: int = 0
    gc_ms: int = 0
    records_read: int = 0

    @property
    def wall_ms(self) -> int:
        return self.completed_ms - self.submitted_ms

    def add(self, other: StageTime) -> None:
        """Count `other`, a stage of the same name in the same batch, in this one."""
        self.submitted_ms = min(self.submitted_ms, other.submitted_ms) if self.stages else other.submitted_ms
        self.completed_ms = max(self.completed_ms, other.completed_ms)
        self.stages += other.stages
        for name in SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))


SUMMED = ("tasks", "run_ms", "cpu_ms", "deserialize_ms", "gc_ms", "records_read")
"""The figures of `StageTime` that add up over stages and batches."""


@dataclass
class BatchTime:
    """One micro-batch of the query: Spark's phases, its jobs' wall time, its stages."""

    batch_id: int
    end_ms: int
    input_rows: int
    phases: dict[str, int]
    jobs: int = 0
    jobs_ms: int = 0
    stages: list[StageTime] = field(default_factory=list)


def stage_name(stage_info: Mapping[str, Any]) -> str:
    """A stage named by the operators its RDDs come from (`OPERATORS`), such as `scan` or `dedup+scan+union`."""
    scopes = " ".join(str(rdd.get("Scope", "")) + " " + str(rdd.get("Name", "")) for rdd in stage_info["RDD Info"])
    names: list[str] = []
    for operator, short in OPERATORS:
        if f'"{operator}"' in scopes or f" {operator} " in f" {scopes} ":
            scopes = scopes.replace(f'"{operator}"', "")
            if short not in names:
                names.append(short)
    return "+".join(names) or "other"


def batch_times(events: Iterable[Mapping[str, Any]]) -> list[BatchTime]:
    """The batches of the streaming query with the most progress events, with their jobs and stages."""
    events = list(events)
    progress = [e["progress"] for e in events if e["Event"] == PROGRESS]
    if not progress:
        return []
    counts: dict[str, int] = defaultdict(int)
    for p in progress:
        counts[p["id"]] += 1
    query = max(counts, key=lambda q: counts[q])
    batches: dict[int, BatchTime] = {}
    for p in progress:
        if p["id"] != query:
            continue
        start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
        phases = {k: int(v) for k, v in p["durationMs"].items()}
        batches[p["batchId"]] = BatchTime(
            batch_id=p["batchId"],
            end_ms=int(start.timestamp() * 1000) + phases.get("triggerExecution", 0),
            input_rows=sum(int(s.get("numInputRows", 0)) for s in p.get("sources", [])),
            phases=phases,
        )
    job_batch: dict[int, int] = {}
    job_start: dict[int, int] = {}
    stage_job: dict[int, int] = {}
    stages: dict[int, StageTime] = {}
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            if props.get("sql.streaming.queryId") != query or props.get("streaming.sql.batchId") is None:
                continue
            job_batch[e["Job ID"]] = int(props["streaming.sql.batchId"])
            job_start[e["Job ID"]] = e["Submission Time"]
            for stage in e["Stage IDs"]:
                stage_job[stage] = e["Job ID"]
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in job_batch:
            batch = batches.get(job_batch[e["Job ID"]])
            if batch is not None:
                batch.jobs += 1
                batch.jobs_ms += e["Completion Time"] - job_start[e["Job ID"]]
        elif kind == "SparkListenerTaskEnd" and e["Stage ID"] in stage_job:
            stage = stages.setdefault(e["Stage ID"], StageTime(""))
            metrics = e.get("Task Metrics") or {}
            stage.tasks += 1
            stage.run_ms += metrics.get("Executor Run Time", 0)
            stage.cpu_ms += metrics.get("Executor CPU Time", 0) / 1e6
            stage.deserialize_ms += metrics.get("Executor Deserialize Time", 0)
            stage.gc_ms += metrics.get("JVM GC Time", 0)
            stage.records_read += (metrics.get("Input Metrics") or {}).get("Records Read", 0)
        elif kind == "SparkListenerStageCompleted" and e["Stage Info"]["Stage ID"] in stage_job:
            info = e["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], StageTime(""))
            stage.name, stage.stages = stage_name(info), 1
            stage.submitted_ms, stage.completed_ms = info.get("Submission Time", 0), info.get("Completion Time", 0)
            batch = batches.get(job_batch[stage_job[info["Stage ID"]]])
            if batch is not None:
                same = next((other for other in batch.stages if other.name == stage.name), None)
                if same is None:
                    batch.stages.append(StageTime(stage.name))
                    same = batch.stages[-1]
                same.add(stage)
    return [batches[b] for b in sorted(batches)]


def step_windows(result: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """(label, from ms, to ms) of each step of a system's result in `report.json`: from its first send to the
    next step's."""
    starts = [(f"{s['offered_rate']:,}/s", s["sender"]["first_send"] * 1000) for s in result.get("steps", [])]
    return [
        (label, start, starts[i + 1][1] if i + 1 < len(starts) else float("inf"))
        for i, (label, start) in enumerate(starts)
    ]


def mean_breakdown(batches: Sequence[BatchTime]) -> dict[str, Any]:
    """Means per batch of the phases, jobs and stages (by name, in order of first appearance) of `batches`."""
    n = len(batches)
    if n == 0:
        return {"batches": 0}
    phase_names = ("triggerExecution", "queryPlanning", "addBatch")

    def mean(values: Iterable[float]) -> float:
        return sum(values) / n

    figures: dict[str, Any] = {
        "batches": n,
        "rows": mean(b.input_rows for b in batches),
        **{name: mean(b.phases.get(name, 0) for b in batches) for name in phase_names},
        "jobs": mean(b.jobs for b in batches),
        "jobs_ms": mean(b.jobs_ms for b in batches),
    }
    figures["driver_in_add_batch_ms"] = figures["addBatch"] - figures["jobs_ms"]
    figures["other_phases_ms"] = figures["triggerExecution"] - figures["queryPlanning"] - figures["addBatch"]
    stages: dict[str, dict[str, Any]] = {}
    for batch in batches:
        for stage in batch.stages:
            total = stages.setdefault(
                stage.name, {"name": stage.name, "stages": 0, "wall_ms": 0, **dict.fromkeys(SUMMED, 0)}
            )
            for name in ("stages", "wall_ms", *SUMMED):
                total[name] += getattr(stage, name)
    figures["stages"] = [
        {name: value / n if name != "name" else value for name, value in total.items()} for total in stages.values()
    ]
    return figures


def system_breakdown(folder: Path, result: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(step label, mean breakdown) of each step of one system's run, from its event log."""
    batches = [b for b in batch_times(read_events(folder / "spark-events")) if b.input_rows > 0]
    return [
        (label, mean_breakdown([b for b in batches if start < b.end_ms <= end]))
        for label, start, end in step_windows(result)
    ]


INTRO = (
    "Means per batch that read records, at each offered rate, from Spark's event log of each system "
    "(`python -m ops.bench.eventlog`): Spark's phases, and within addBatch the time its Spark jobs ran and the "
    "driver's rest (planning the sink's Dataset, the sink's Python, Redis); then each stage, named by its "
    "operators, with its tasks' time."
)


def render(system: str, steps: Sequence[tuple[str, Mapping[str, Any]]], heading: str = "##") -> list[str]:
    """Markdown of one system's breakdown: a table of phases per step, then one of stages per step."""
    lines = [f"{heading} {system}", ""]
    lines += [
        "| offered | batches | rows read per batch (all sources) | batch ms | queryPlanning | addBatch "
        "| of which Spark jobs | of which the driver's | other phases | jobs per batch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, f in steps:
        if not f.get("batches"):
            lines.append(f"| {label} | 0 | | | | | | | | |")
            continue
        lines.append(
            f"| {label} | {f['batches']} | {f['rows']:,.0f} | {f['triggerExecution']:,.0f} | "
            f"{f['queryPlanning']:,.0f} | {f['addBatch']:,.0f} | {f['jobs_ms']:,.0f} | "
            f"{f['driver_in_add_batch_ms']:,.0f} | {f['other_phases_ms']:,.0f} | {f['jobs']:.1f} |"
        )
    lines += [
        "",
        "| offered | stage (operators) | stages | wall ms | tasks | task run ms | task CPU ms | deserializing ms | "
        "GC ms | Kafka records |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, f in steps:
        for s in f.get("stages", []):
            lines.append(
                f"| {label} | {s['name']} | {s['stages']:.1f} | {s['wall_ms']:,.0f} | {s['tasks']:.0f} | "
                f"{s['run_ms']:,.0f} | "
                f"{s['cpu_ms']:,.0f} | {s['deserialize_ms']:,.0f} | {s['gc_ms']:,.0f} | {s['records_read']:,.0f} |"
            )
    return [*lines, ""]


def breakdowns(report: Path, systems: Mapping[str, Any]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Each system's breakdown (`system_breakdown`) of a benchmark's folder, for those whose event log is kept."""
    return {
        name: system_breakdown(report / name, result)
        for name, result in systems.items()
        if (report / name / "spark-events").is_dir()
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.eventlog", description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a benchmark's folder, var/bench/<time>")
    parser.add_argument("--systems", default="", help="comma-separated; default every system with an event log")
    args = parser.parse_args(argv)
    systems = json.loads((args.report / "report.json").read_text())["systems"]
    wanted = [s for s in args.systems.split(",") if s] or list(systems)
    unknown = sorted(set(wanted) - set(systems))
    if unknown:
        raise SystemExit(f"no system {', '.join(unknown)} in {args.report / 'report.json'}: {', '.join(systems)}")
    found = breakdowns(args.report, {name: systems[name] for name in wanted})
    lines = [f"# Where a batch's time goes: {args.report}", "", INTRO, ""]
    for name in wanted:
        lines += render(name, found[name]) if name in found else [f"## {name}", "", "No event log kept.", ""]
    text = "\n".join(lines)
    (args.report / "batch-time.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
