"""`ops.process`: a signal goes only to the process that was started, never to a stranger holding its old pid number
or to a thread whose id equals it (kill(2) on a thread's id signals its whole process)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ops.process import (
    ManagedProcess,
    Process,
    _stat,
    pid_alive,
    recorded_process,
    started_ticks,
    stop_child,
    stop_processes,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def process_alive(pid: int) -> bool:
    """Whether a process leads a thread group under `pid` and is not a zombie."""
    seen = _stat(pid)
    return seen is not None and seen[1] != "Z"


def _stranger() -> subprocess.Popen[bytes]:
    return subprocess.Popen(SLEEPER, start_new_session=True)


def _wait_ended(popen: subprocess.Popen[bytes], timeout_s: float = 10) -> int | None:
    try:
        return popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def test_a_stale_identity_is_not_signalled_even_when_its_number_is_taken() -> None:
    stranger = _stranger()
    try:
        ticks = started_ticks(stranger.pid)
        assert ticks is not None
        # What a pid file of a process long gone looks like once the number has been given to another.
        stale = Process(stranger.pid, ticks - 1)
        stop_processes([stale], timeout_s=1)
        assert _wait_ended(stranger, 1) is None, "the stranger was signalled"
        stop_processes([Process(stranger.pid, ticks)], timeout_s=5)
        assert _wait_ended(stranger) is not None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_threads_id_in_a_pid_file_names_no_process(tmp_path: Path) -> None:
    program = "import threading, time\nt = threading.Thread(target=time.sleep, args=(120,))\nt.start()\n"
    program += "print(t.native_id, flush=True)\nt.join()\n"
    holder = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert holder.stdout is not None
        tid = int(holder.stdout.readline())
        assert tid != holder.pid and Path(f"/proc/{tid}").exists()
        assert started_ticks(tid) is None and not process_alive(tid)
        pid_file = tmp_path / "stream.pid"
        pid_file.write_text(str(tid))  # the format of before, a pid alone
        assert recorded_process(pid_file) is None and pid_alive(pid_file) is None
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


def test_a_pid_file_names_its_process_by_number_and_start(tmp_path: Path) -> None:
    child = ManagedProcess(name="sleeper", command=SLEEPER, run_dir=tmp_path / "run", log_dir=tmp_path / "logs")
    child.start()
    assert child.popen is not None and child.identity is not None
    number, started = child.pid_file.read_text().split()
    assert (int(number), int(started)) == (child.popen.pid, started_ticks(child.popen.pid))
    assert recorded_process(child.pid_file) == child.identity and child.running_pid() == child.popen.pid
    child.pid_file.write_text(f"{number} {int(started) + 1}")  # another process under the same number
    assert recorded_process(child.pid_file) is None
    child.stop(timeout_s=5)
    assert child.popen.poll() is not None and not child.pid_file.exists()


def test_a_stop_after_the_child_was_reaped_sends_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait()
    stranger = _stranger()  # whatever holds the number now, the reaped child is not stopped again
    try:
        stop_child(child, timeout_s=1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_what_is_left_of_a_group_whose_leader_ended_is_stopped(tmp_path: Path) -> None:
    marker = tmp_path / "left.pid"
    # The leader starts a member of its group and ends at once, as a launcher does with the JVM it starts.
    leader = subprocess.Popen(
        ["sh", "-c", f"sleep 120 & echo $! > {marker}; exit 0"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    ticks = started_ticks(leader.pid)
    assert ticks is not None
    leader.wait()
    member = int(marker.read_text())
    assert process_alive(member)
    stop_processes([Process(leader.pid, ticks)], timeout_s=5)
    deadline = time.monotonic() + 10
    while process_alive(member) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(member), "the group's member outlived the stop"
