"""Where the CPU goes: Java Flight Recorder profiles of a running job JVM, summarized by area of the code.

A recording is started and stopped on the live JVM with `jcmd PID JFR.start|JFR.stop` (so it covers exactly
one step of a benchmark, and nothing in the job's configuration changes), with the JDK's `profile` settings
(a sample of each running Java thread's stack every 10-20 ms). `jfr print --events jdk.ExecutionSample` prints
the samples; `parse_samples` reads them and `summarize` counts them:

- by area (`AREAS`: Kafka client, Avro decoding, state store, planning, Parquet, Py4J...): each sample charged
  to the first specific area from the top of its stack (`charged_area`; sums to 100 %), and the share of
  samples with an area anywhere in the stack (inclusive: a planning step that calls into code generation counts
  for both);
- the hottest methods (top frame) and the threads the samples came from;
- the driver's stream thread by what it was doing (`stream_phase`): planning the batch, running it, finding the next
  batch's offsets.

A recording keeps `STACK_DEPTH` frames of each stack, not the recorder's default 64: Spark's stacks run to some 340
frames, and the stream thread's planning sits at their bottom, where a cut stack loses it.

Execution samples cover Java code only: time in native code (RocksDB's C++, compression libraries, the kernel)
shows in the per-thread CPU from /proc (`ops.bench.measure.thread_cpu`) and the per-process CPU instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROW_WRITING = "row writing (copying fields into Spark's binary rows)"

AREAS: tuple[tuple[str, str], ...] = (
    ("org.apache.spark.sql.catalyst.expressions.GeneratedClass", "generated code (the batch's own operators)"),
    ("org.codehaus.janino", "code generation (Janino compiling)"),
    ("org.codehaus.commons", "code generation (Janino compiling)"),
    # The codegen package also holds the writers that generated code calls per row: those are running, not compiling.
    ("org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter", ROW_WRITING),
    ("org.apache.spark.sql.catalyst.expressions.codegen.UnsafeWriter", ROW_WRITING),
    ("org.apache.spark.sql.catalyst.expressions.codegen.UnsafeArrayWriter", ROW_WRITING),
    ("org.apache.spark.sql.catalyst.expressions.codegen.BufferHolder", ROW_WRITING),
    ("org.apache.spark.sql.catalyst.expressions.codegen", "code generation (Janino compiling)"),
    ("org.apache.spark.sql.avro", "Avro decoding"),
    ("org.apache.avro", "Avro decoding"),
    ("org.apache.spark.sql.kafka010", "Kafka source and client"),
    ("org.apache.kafka", "Kafka source and client"),
    ("org.rocksdb", "state store"),
    ("org.apache.spark.sql.execution.streaming.state", "state store"),
    ("org.apache.parquet", "Parquet writing"),
    ("org.apache.spark.sql.execution.datasources", "file output (Parquet, commit protocol)"),
    ("org.apache.spark.sql.catalyst.rules", "query planning (analyzer, optimizer rules)"),
    ("org.apache.spark.sql.catalyst.analysis", "query planning (analyzer, optimizer rules)"),
    ("org.apache.spark.sql.catalyst.optimizer", "query planning (analyzer, optimizer rules)"),
    ("org.apache.spark.sql.catalyst.planning", "query planning (analyzer, optimizer rules)"),
    ("org.apache.spark.sql.catalyst.trees", "query planning (analyzer, optimizer rules)"),
    ("org.apache.spark.sql.catalyst.plans", "query planning (analyzer, optimizer rules)"),
    ("org.apache.spark.sql.execution.streaming", "streaming engine (offsets, commit log, watermark)"),
    ("org.apache.spark.sql.execution.joins", "join operators"),
    ("org.apache.spark.sql.execution.aggregate", "aggregation operators"),
    ("org.apache.spark.sql.execution.exchange", "shuffle"),
    ("org.apache.spark.shuffle", "shuffle"),
    ("org.apache.spark.sql.execution", "query execution (physical plan)"),
    ("org.apache.spark.sql.catalyst", "Catalyst (rows, expressions, types)"),
    ("org.apache.spark.scheduler.Task", "Spark core"),
    ("org.apache.spark.scheduler.ResultTask", "Spark core"),
    ("org.apache.spark.scheduler.ShuffleMapTask", "Spark core"),
    ("org.apache.spark.executor", "Spark core"),
    ("org.apache.spark.rdd", "Spark core"),
    ("org.apache.spark.scheduler", "scheduler, RPC, block manager"),
    ("org.apache.spark.rpc", "scheduler, RPC, block manager"),
    ("org.apache.spark.network", "scheduler, RPC, block manager"),
    ("org.apache.spark.storage", "scheduler, RPC, block manager"),
    ("org.apache.spark.serializer", "serialization (closures, results)"),
    ("com.esotericsoftware.kryo", "serialization (closures, results)"),
    ("org.apache.spark.util.ClosureCleaner", "closure cleaning and task serialization"),
    ("org.apache.xbean.asm", "closure cleaning and task serialization"),
    ("java.io.ObjectOutputStream", "closure cleaning and task serialization"),
    ("java.io.ObjectInputStream", "closure cleaning and task serialization"),
    ("org.apache.spark.util", "Spark core"),
    ("org.apache.hadoop", "Hadoop file system (checkpoint, commit)"),
    ("py4j", "Py4J (the JVM calling the Python driver and back: foreachBatch, listener)"),
    ("org.sparkproject.guava", "Spark's Guava (caches: generated code, plans)"),
    ("net.jpountz", "compression"),
    ("com.github.luben.zstd", "compression"),
    ("org.xerial.snappy", "compression"),
    ("java.util.zip.ZipFile", "class loading"),
    ("java.util.jar", "class loading"),
    ("java.lang.ClassLoader", "class loading"),
    ("jdk.internal.loader", "class loading"),
    ("java.util.zip", "compression"),
    ("org.apache.spark", "Spark core"),
    ("scala.", "Scala runtime and collections"),
    ("java.", "Java runtime"),
    ("jdk.", "Java runtime"),
    ("sun.", "Java runtime"),
)
"""Package prefixes to areas; the first prefix that matches a frame's class wins."""

GENERIC_AREAS = frozenset(
    {"Java runtime", "Scala runtime and collections", "Spark core", "Catalyst (rows, expressions, types)"}
)
"""Areas every stack passes through (thread pools, collections, rows): left out of the inclusive shares."""
CHARGED_TO_CALLER = GENERIC_AREAS | {"class loading"}
"""A sample is charged to the first area from the top of its stack that is not one of these: a class looked
up in the jars is charged to whoever looked it up (Py4J resolving a name, Janino compiling)."""

STACK_DEPTH = 1_024
"""Frames kept of each sampled stack (`JFR.configure stackdepth`, and `jfr print --stack-depth`). With the default 64,
the driver's stream thread's samples lost the frames that say whether they were planning or running the sink."""

STREAM_THREAD = "stream execution thread"
"""How the name of a streaming query's driver thread begins."""

RUNNING = ("Sink.addBatch", "SparkPlan.execute", "SparkPlan.executeCollect", "SparkContext.runJob")
"""Frames of a stream thread running its batch rather than planning it."""

_FRAME = re.compile(r"^\s+(?P<method>[\w$.<>\-]+)\(")
_THREAD = re.compile(r'^\s+sampledThread = "(?P<name>.*)" \(')


def area_of(method: str) -> str:
    """The area of a frame `package.Class.method`."""
    for prefix, area in AREAS:
        if method.startswith(prefix):
            return area
    return "other: " + ".".join(method.split(".")[:3])


def parse_samples(lines: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
    """(thread name, frames from the top) of each event in `jfr print` output."""
    thread, in_stack = "", False
    frames: list[str] = []
    for line in lines:
        if line.startswith("jdk.ExecutionSample {"):
            thread, frames, in_stack = "", [], False
        elif (match := _THREAD.match(line)) is not None:
            thread = match.group("name")
        elif line.strip() == "stackTrace = [":
            in_stack = True
        elif in_stack and line.strip() == "]":
            in_stack = False
            yield thread, frames
        elif in_stack and (match := _FRAME.match(line)) is not None:
            frames.append(match.group("method"))


def thread_kind(name: str) -> str:
    """A thread's name without task and stage numbers: `Executor task launch worker for task 3.0 in stage ...`
    becomes `Executor task launch worker`."""
    name = re.sub(r" for task .*", "", name)
    name = re.sub(r"\[.*\]", "[...]", name)
    return re.sub(r"[-#\s]*\d+$", "", name).strip() or name


def charged_area(frames: list[str]) -> str:
    """The area a sample is charged to: the first area from the top of the stack that is not generic (a HashMap
    lookup inside the state store is the state store's), else the top frame's."""
    areas = [area_of(frame) for frame in frames]
    return next((area for area in areas if area not in CHARGED_TO_CALLER), areas[0])


def summarize(samples: Iterable[tuple[str, list[str]]], top: int = 15) -> dict[str, Any]:
    """Shares of the samples by area (charged, and anywhere in the stack), hottest methods and threads, and of the
    stream thread's samples by `stream_phase`."""
    total = 0
    charged: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    methods: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    stream: Counter[str] = Counter()
    for thread, frames in samples:
        if not frames:
            continue
        total += 1
        if thread.startswith(STREAM_THREAD):
            stream[stream_phase(frames)] += 1
        charged[charged_area(frames)] += 1
        inclusive.update({area for area in map(area_of, frames) if area not in GENERIC_AREAS})
        methods[frames[0]] += 1
        threads[thread_kind(thread)] += 1

    def shares(counter: Counter[str], n: int | None, of: int = total) -> list[dict[str, Any]]:
        return [{"name": name, "share": round(count / of, 4)} for name, count in counter.most_common(n)]

    return {
        "samples": total,
        "by_area": shares(charged, top) if total else [],
        "inclusive_by_area": shares(inclusive, top) if total else [],
        "top_methods": shares(methods, top) if total else [],
        "threads": shares(threads, 8) if total else [],
        "stream_thread": {"samples": stream.total(), "phases": shares(stream, None, of=stream.total())},
    }


def stream_phase(frames: list[str]) -> str:
    """What a sample of a streaming query's driver thread was doing: `running the batch` (a sink's `addBatch`, with
    the planning of its own queries, or the batch's plan run into a data source), `planning` (the batch's plan:
    Spark's queryPlanning), `next batch` (the sources' offsets, the offset log), else `other`."""
    if any(frame.endswith(RUNNING) for frame in frames):
        return "running the batch"
    if any(frame.endswith("QueryExecution.executedPlan") for frame in frames):
        return "planning"
    if any(frame.endswith("MicroBatchExecution.constructNextBatch") for frame in frames):
        return "next batch"
    return "other"


def start_recording(jvm_pid: int, name: str, path: Path) -> bool:
    """Start a flight recording on a live JVM; False (and no profile) when jcmd is missing or refused."""
    jcmd = shutil.which("jcmd")
    if jcmd is None:
        return False
    # The depth of the stacks the recording keeps is set before it starts; a JVM that refuses keeps its own.
    subprocess.run(
        [jcmd, str(jvm_pid), "JFR.configure", f"stackdepth={STACK_DEPTH}"], capture_output=True, text=True, timeout=60
    )
    done = subprocess.run(
        [jcmd, str(jvm_pid), "JFR.start", f"name={name}", "settings=profile", f"filename={path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode == 0 and "Started recording" in done.stdout


def stop_recording(jvm_pid: int, name: str) -> bool:
    """Stop a recording; the JVM writes it to the file given at its start."""
    jcmd = shutil.which("jcmd")
    if jcmd is None:
        return False
    done = subprocess.run([jcmd, str(jvm_pid), "JFR.stop", f"name={name}"], capture_output=True, text=True, timeout=120)
    return done.returncode == 0


def summarize_recording(path: Path, top: int = 15) -> dict[str, Any] | None:
    """`summarize` of a recording's execution samples, read through `jfr print`; None without `jfr` or a file."""
    jfr = shutil.which("jfr")
    if jfr is None or not path.exists():
        return None
    with subprocess.Popen(
        [jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth", str(STACK_DEPTH), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as printer:
        assert printer.stdout is not None
        summary = summarize(parse_samples(printer.stdout), top)
    summary["file"] = str(path)
    return summary
