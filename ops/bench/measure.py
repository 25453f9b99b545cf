"""What the benchmark samples while systems run: CPU and memory from /proc, and the health records in Redis.

- `Sampler`: every second, the CPU seconds and resident memory of named process trees (the job, Kafka, Redis,
  the producer) and the busy CPU seconds of the whole machine, so that a report can say how much of the machine
  other programs took;
- `thread_cpu`: CPU seconds of each thread of a process, by thread name (a JVM names its threads: executor
  tasks, the stream execution thread, GC, JIT compilers), for "where the CPU goes";
- `HealthRecorder`: every health record a streaming query writes to Redis (`attribution.progress`), kept by
  batch id, since Redis keeps only the newest ones.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessStat:
    """One process as /proc/PID/stat shows it."""

    pid: int
    ppid: int
    command: str
    cpu_s: float
    """User plus system CPU seconds so far."""
    rss_bytes: int
    layout: tuple[int, int, int] = (0, 0, 0)
    """Start and end of the code and start of the stack: a child forked and not yet exec'd has its parent's."""


def read_processes() -> dict[int, ProcessStat]:
    """Every process of the machine that can be read."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read_stat(entry / "stat")
        if stat is not None:
            found[stat.pid] = stat
    return found


def _read_stat(path: Path) -> ProcessStat | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    try:
        pid, command = int(head.split(" (", 1)[0]), head.split(" (", 1)[1]
        return ProcessStat(
            pid=pid,
            ppid=int(fields[1]),
            command=command,
            cpu_s=(int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
            rss_bytes=int(fields[21]) * PAGE_SIZE,
            layout=(int(fields[23]), int(fields[24]), int(fields[25])),
        )
    except (IndexError, ValueError):
        return None


def _forked_copy(child: ProcessStat, parent: ProcessStat) -> bool:
    return child.layout == parent.layout and child.layout != (0, 0, 0)


def descendants(processes: dict[int, ProcessStat], root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in processes.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in processes:
            out.append(pid)
        todo += children.get(pid, [])
    return out


def find_in_tree(root: int, command: str) -> int | None:
    """The pid of the first process named `command` (such as `java`) in the tree of `root`."""
    processes = read_processes()
    return next((pid for pid in descendants(processes, root) if processes[pid].command == command), None)


def machine_busy_cpu_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all of /proc/stat's first line but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLOCK_TICKS


@dataclass(frozen=True)
class Sample:
    """One sampling instant: per named tree its CPU seconds and resident bytes, in all and by command."""

    time: float
    machine_cpu_s: float
    trees: dict[str, tuple[float, int]]
    commands: dict[str, dict[str, tuple[float, int]]]


@dataclass
class Sampler:
    """CPU and memory of named process trees and of the machine, sampled every `interval_s` in a thread."""

    interval_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    roots: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self, name: str, pid: int) -> None:
        """Sample the tree of `pid` under `name` from now on (a new pid replaces the old one)."""
        with self._lock:
            self.roots[name] = pid

    def start(self) -> None:
        threading.Thread(target=self._run, name="bench-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> Sample:
        processes = read_processes()
        trees: dict[str, tuple[float, int]] = {}
        commands: dict[str, dict[str, tuple[float, int]]] = {}
        with self._lock:
            roots = dict(self.roots)
        for name, root in roots.items():
            members = [processes[pid] for pid in descendants(processes, root)]
            if not members:
                continue
            # A child forked and not yet exec'd (the JVM starting chmod, say) shares its parent's pages: counting
            # its resident memory would count the parent's twice.
            resident = {p.pid for p in members if p.pid == root or not _forked_copy(p, processes[p.ppid])}
            trees[name] = (sum(p.cpu_s for p in members), sum(p.rss_bytes for p in members if p.pid in resident))
            by_command: dict[str, tuple[float, int]] = {}
            for p in members:
                cpu, rss = by_command.get(p.command, (0.0, 0))
                by_command[p.command] = (cpu + p.cpu_s, rss + (p.rss_bytes if p.pid in resident else 0))
            commands[name] = by_command
        return Sample(time.time(), machine_busy_cpu_s(), trees, commands)

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop.wait(self.interval_s):
                return

    def _inside(self, name: str | None, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.time <= end and (name is None or name in s.trees)]

    def cores(self, name: str, start: float, end: float) -> float:
        """Mean CPU cores the tree `name` used between two instants (epoch s)."""
        inside = self._inside(name, start, end)
        if len(inside) < 2:
            return 0.0
        return (inside[-1].trees[name][0] - inside[0].trees[name][0]) / (inside[-1].time - inside[0].time)

    def command_cores(self, name: str, start: float, end: float) -> dict[str, float]:
        """Mean cores of each command (`java`, `python`...) of the tree `name` between two instants."""
        inside = self._inside(name, start, end)
        if len(inside) < 2:
            return {}
        first, last = inside[0].commands[name], inside[-1].commands[name]
        span = inside[-1].time - inside[0].time
        cores = {c: round((last[c][0] - first.get(c, (0.0, 0))[0]) / span, 2) for c in sorted(last)}
        return {c: value for c, value in cores.items() if value > 0}

    def machine_cores(self, start: float, end: float) -> float:
        """Mean cores the whole machine was busy between two instants: ours and everybody else's."""
        inside = self._inside(None, start, end)
        if len(inside) < 2:
            return 0.0
        return (inside[-1].machine_cpu_s - inside[0].machine_cpu_s) / (inside[-1].time - inside[0].time)

    def peak_rss(self, name: str, start: float = 0.0, end: float = float("inf")) -> int:
        """The largest resident memory of the tree `name` seen between two instants, in bytes."""
        return max((s.trees[name][1] for s in self._inside(name, start, end)), default=0)

    def rss_by_command(self, name: str) -> dict[str, list[tuple[float, int]]]:
        """(time, resident bytes) of each command (`java`, `python`) of the tree `name` at every sample."""
        out: dict[str, list[tuple[float, int]]] = {}
        for s in self.samples:
            for command, (_, rss) in (s.commands.get(name) or {}).items():
                out.setdefault(command, []).append((s.time, rss))
        return out

    def series(self, name: str) -> list[tuple[float, float, int]]:
        """(time, CPU seconds, resident bytes) of the tree `name` at every sample."""
        return [(s.time, *s.trees[name]) for s in self.samples if name in s.trees]


_THREAD_NUMBER = re.compile(r"[-#\s]*\d+$")


def thread_group(name: str) -> str:
    """A thread's name without its trailing number: `GC Thread#1` and `GC Thread#0` are one group."""
    return _THREAD_NUMBER.sub("", name).strip() or name


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the threads of `pid` so far, summed by thread group (Linux keeps 15 characters of a name)."""
    groups: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return groups
    for task in tasks:
        stat = _read_stat(task / "stat")
        if stat is not None:
            group = thread_group(stat.command)
            groups[group] = groups.get(group, 0.0) + stat.cpu_s
    return groups


def thread_cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Mean cores of each thread group between two `thread_cpu` snapshots, busiest first."""
    if seconds <= 0:
        return {}
    cores = {name: (after[name] - before.get(name, 0.0)) / seconds for name in after}
    return {name: round(value, 3) for name, value in sorted(cores.items(), key=lambda kv: -kv[1]) if value >= 0.005}


@dataclass
class HealthRecorder:
    """Every health record (`attribution.progress`) the query `query` writes under `prefix`, by batch id.

    Redis keeps the newest `HISTORY` records of a query; this polls the newest few every `interval_s` and keeps
    them all, so a long run loses none."""

    redis_url: str
    prefix: str
    query: str
    interval_s: float = 1.0
    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"health-{self.query}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.poll()

    def poll(self, newest: int = 50) -> None:
        import redis

        from billing.store.redis_keys import RedisKeys

        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            for text in client.lrange(RedisKeys(self.prefix).health_history(self.query), 0, newest - 1):
                record = json.loads(text)
                self.records[int(record["batch_id"])] = record
        finally:
            client.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # a missed poll is made up by the next; the recorder must not die  # nosec B112
                continue

    def history(self) -> list[dict[str, Any]]:
        """Every record seen, by batch id."""
        return [self.records[k] for k in sorted(self.records)]

    def rows_read(self) -> int:
        """Records the query has read so far."""
        return sum(int(r["input_rows"]) for r in list(self.records.values()))


def wait_for(
    check: Callable[[], bool], timeout_s: float, what: str, process: subprocess.Popen[bytes] | None = None
) -> bool:
    """Poll `check` every half second until it is true (True) or `timeout_s` passes (False); raise if `process`
    ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the process exited with code {process.returncode} while waiting for {what}")
        if check():
            return True
        time.sleep(0.5)
    return False
