"""Child processes the local stack owns: started with a log file and a pid file, waited for, stopped cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class ServiceError(RuntimeError):
    """A service did not start or stop; the message carries the end of its log."""


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does, so that the `finally` blocks of a
    command stop the services and jobs it started. By default SIGTERM ends Python at once and leaves them running
    (a stopped benchmark's broker and job went on using the cores of the next run)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


LOGPIPE = Path(__file__).resolve().with_name("logpipe.py")
LOG_MAX_BYTES = 20_000_000
LOG_BACKUPS = 3


@dataclass
class ManagedProcess:
    """One long-running child: `name` names its pid file (`run_dir/NAME.pid`) and log (`log_dir/NAME.log`). The log
    rolls over at `log_max_bytes`, keeping `log_backups` old files (`NAME.log.1`, ...): the child writes into a pipe
    that `ops/logpipe.py` copies to the file."""

    name: str
    command: list[str]
    run_dir: Path
    log_dir: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = None
    log_max_bytes: int = LOG_MAX_BYTES
    log_backups: int = LOG_BACKUPS
    writer: subprocess.Popen[bytes] | None = None
    own_log: Path | None = None
    """A log the child writes itself (a broker's `server.log`): `log_tail` follows the output's tail with it, from
    its last ERROR line if it has one (where a broker says why it exited), else its last lines."""
    identity: Process | None = None
    """The child this object started, as it was at its start: its pid number alone may name a stranger once it has
    been reaped."""

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def running_pid(self) -> int | None:
        """The pid of a live process recorded in the pid file, whoever started it."""
        return pid_alive(self.pid_file)

    def process(self) -> Process | None:
        """The child to stop: the one started here, else the one recorded in the pid file."""
        return self.identity or recorded_process(self.pid_file)

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} start\n".encode())
        # The log writer reads until every writer of the pipe has ended; a session of its own, like the child's.
        self.writer = subprocess.Popen(
            [sys.executable, str(LOGPIPE), str(self.log_file), "--max-bytes", str(self.log_max_bytes),
             "--backups", str(self.log_backups)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        assert self.writer.stdin is not None
        try:
            # A session of its own: Ctrl-C in the terminal reaches `adbill up`, which stops children in order.
            self.popen = subprocess.Popen(
                self.command,
                stdout=self.writer.stdin,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            self.writer.stdin.close()  # the child holds the pipe now; the writer ends when it (and its own) do
        # Not reaped yet, so /proc still shows it even if it has already ended.
        self.identity = Process(self.popen.pid, started_ticks(self.popen.pid) or 0)
        self.pid_file.write_text(f"{self.identity.pid} {self.identity.started}")

    def exited(self) -> int | None:
        """The exit code if the child started here has ended, else None."""
        return None if self.popen is None else self.popen.poll()

    def wait_ready(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll `check` until it is true; fail early, with the log's tail, when the child dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.exited()
            if code is not None:
                raise ServiceError(f"{self.name} exited with code {code} before {what}:\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.2)
        raise ServiceError(f"{self.name}: {what} not reached within {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; removes the pid file."""
        process = self.process()
        if process is not None:
            stop_processes([process], timeout_s)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)
        self._drain()
        self.pid_file.unlink(missing_ok=True)

    def _drain(self) -> None:
        """Once the child has ended, give its log writer a moment to copy the last lines (and reap it): it ends when
        it has copied them, which on a loaded machine took more than the 2 s once allowed."""
        if self.writer is not None and self.exited() is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.writer.wait(timeout=15)

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` of the child's output, then of its own log, if any."""
        self._drain()
        tail = _tail(self.log_file, lines)
        if self.own_log is not None:
            tail += f"\n--- {self.own_log}:\n{_tail(self.own_log, lines, from_last=' ERROR ')}"
        return tail


def _tail(path: Path, lines: int, from_last: str | None = None) -> str:
    """The last `lines` lines of `path`; or, when given and found, `lines` lines from the last that holds
    `from_last`."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    marked = [n for n, line in enumerate(text) if from_last and from_last in line]
    return "\n".join(text[marked[-1] : marked[-1] + lines] if marked else text[-lines:])


@dataclass(frozen=True)
class Process:
    """A process as it was when seen: its pid and when it started (clock ticks since boot, `/proc/PID/stat`'s 22nd
    field). Linux gives a pid number to a new process or thread once the old one is reaped, and kill(2) on a
    thread's id signals the whole process it belongs to: on a machine whose JVMs run hundreds of threads, a stale
    pid signalled late lands on a stranger, most likely a JVM (a test process's Spark driver, say). Every signal
    here goes to a process whose start time still matches."""

    pid: int
    started: int


def started_ticks(pid: int) -> int | None:
    """When process `pid` started, or None when no process leads a thread group under that number (none, or a
    thread of another process). A zombie still answers: it holds its number until it is reaped."""
    seen = _stat(pid)
    return seen[0] if seen is not None else None


def _stat(pid: int) -> tuple[int, str] | None:
    """The start time and state (`R`, `S`, ... `Z` for a zombie) of the thread-group leader `pid`, else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if f"\nTgid:\t{pid}\n" not in status:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]), fields[0]


def recorded_process(pid_file: Path) -> Process | None:
    """The live process a pid file names (`PID STARTED`; a file with a pid alone is trusted on the pid)."""
    try:
        fields = pid_file.read_text().split()
        pid = int(fields[0])
        started = int(fields[1]) if len(fields) > 1 else started_ticks(pid)
    except (OSError, ValueError, IndexError):
        return None
    if started is None:
        return None
    process = Process(pid, started)
    return process if _alive(process) else None


def pid_alive(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is alive, else None."""
    process = recorded_process(pid_file)
    return process.pid if process is not None else None


def stop_child(popen: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Stop a child started here and its process group, SIGTERM first; nothing is sent once it has been reaped."""
    if popen.poll() is None:
        ticks = started_ticks(popen.pid)
        if ticks is not None:
            stop_processes([Process(popen.pid, ticks)], timeout_s)


def stop_processes(processes: list[Process], timeout_s: float = 20.0) -> None:
    """Stop several process groups together: SIGTERM to all, then SIGKILL to those still alive after `timeout_s`
    (the nodes of a quorum stop faster together than one by one, the last waiting for a quorum that is gone)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            _signal_group(process, sig)
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(_alive(p) for p in processes):
            time.sleep(0.1)
        processes = [p for p in processes if _alive(p)]
        if not processes:
            return


def interrupt(process: Process, sig: int, timeout_s: float) -> None:
    """Send `sig` to `process` alone if it is still the process it was (a server that ends its own children:
    PostgreSQL's fast shutdown is SIGINT) and wait up to `timeout_s` for it to end."""
    if not _alive(process):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(process):
        time.sleep(0.1)


def _signal_group(process: Process, sig: int) -> None:
    """The group `process` leads, or the process alone when it leads none. Once the leader has ended, what is left
    of its group (a JVM its launcher started) is signalled only while no other process has taken its number: a
    group's number is not given out again while the group has members."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if _alive(process):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                os.kill(process.pid, sig)
        elif not Path(f"/proc/{process.pid}").exists():
            os.killpg(process.pid, sig)


def _alive(process: Process) -> bool:
    """Whether `process` still runs: the same start time under its pid, not a zombie (our own child's is reaped)."""
    seen = _stat(process.pid)
    if seen is None or seen[0] != process.started:
        return False
    if seen[1] != "Z":
        return True
    with contextlib.suppress(ChildProcessError):
        os.waitpid(process.pid, os.WNOHANG)
    return False


PORT_MEMORY_S = 600.0
"""How long a port this process handed out stays its own: no later call of `free_ports`, `free_port` or
`consecutive_free_port` in this process hands it out again meanwhile. A port is chosen free and given to a service
that binds it later; until then the kernel hands it to the next asker as readily as any other (a local cluster's
Spark master was once given a broker's port by two calls a moment apart)."""
_handed_out: dict[int, float] = {}
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, and not handed out by this process lately."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` different ports nobody listens on right now, none handed out by this process in the last
    `PORT_MEMORY_S` (each held until all are chosen, so that two services started together never get the same one)."""
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    with _handed_out_lock:
        now = time.monotonic()
        for port, at in list(_handed_out.items()):
            if now - at > PORT_MEMORY_S:
                del _handed_out[port]
        try:
            while len(chosen) < count:
                if len(sockets) > count + 1_000:
                    raise RuntimeError(f"no {count} free ports that this process has not handed out lately")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)  # held: the kernel gives the next bind another port
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
                if port not in _handed_out:
                    chosen.append(port)
        finally:
            for sock in sockets:
                sock.close()
        for port in chosen:
            _handed_out[port] = now
    return chosen


def consecutive_free_port(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports nobody listens on right now and that this process has not handed out
    lately (a cluster's controllers)."""
    for _ in range(50):
        (first,) = free_ports(1, host)
        wanted = range(first + 1, first + count)
        with _handed_out_lock:
            if any(port in _handed_out for port in wanted):
                continue
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in wanted]
        try:
            for port, sock in zip(wanted, sockets, strict=True):
                sock.bind((host, port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        with _handed_out_lock:
            for port in wanted:
                _handed_out[port] = time.monotonic()
        return first
    raise RuntimeError(f"no {count} consecutive free ports")


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0
