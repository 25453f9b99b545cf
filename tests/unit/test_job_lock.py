"""The streaming job's lock and heartbeat, heard from Spark's listener bus: they follow one run of the query, so the
end of an earlier run of the same query (same query id, another run id) reported late changes nothing; a run that
stops for a schema switch keeps the lock for the next."""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from attribution.job_lock import FileLock, JobLock, JobLockedError
from attribution.progress import Heartbeat

QUERY_ID = "7b0c5a8e-0000-4000-8000-000000000001"
"""Spark keeps a query's id across its restarts from one checkpoint; each start has a run id of its own."""


@dataclass
class Run:
    """One start of the query, as a listener sees it."""

    runId: str  # noqa: N815 - StreamingQuery's name
    isActive: bool = True  # noqa: N815 - StreamingQuery's name
    id: str = QUERY_ID


def terminated(run: Run) -> SimpleNamespace:
    """Spark's QueryTerminatedEvent of `run`."""
    run.isActive = False
    return SimpleNamespace(id=run.id, runId=run.runId, exception=None)


def free(path: Path) -> bool:
    """Whether another process could take the lock now (a lock of another open file, as another process has)."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return True


def test_the_old_runs_termination_heard_after_the_new_run_started_keeps_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "job.lock"
    lock = JobLock(path)
    lock.acquire()
    old = Run("run-1")
    lock.follow(old)
    # A schema switch: the old run stops, the query starts again from its checkpoint (same id, a new run id), and
    # only then does the listener bus report the old run's end.
    old.isActive = False
    new = Run("run-2")
    lock.follow(new)
    lock.onQueryTerminated(terminated(old))
    assert lock.held and not free(path), "the old run's termination, heard late, freed the new run's lock"
    lock.onQueryTerminated(terminated(new))
    assert not lock.held and free(path)


def test_a_run_stopped_for_a_schema_switch_keeps_the_lock_until_the_next_run_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "job.lock"
    lock = JobLock(path)
    lock.acquire()
    switched: list[str] = []
    old = Run("run-1")
    lock.follow(old, switching=lambda: bool(switched))
    # The old run's sink found new versions and stopped; its end is heard before the next run starts.
    switched.append("new schema versions")
    lock.onQueryTerminated(terminated(old))
    assert lock.held and not free(path)
    # Meanwhile a restore of Redis in the same process does not take it over: the job is between two runs.
    assert lock.in_use()
    with pytest.raises(JobLockedError, match="held by the streaming job"):
        FileLock(path, "adbill restore-redis").acquire()
    new = Run("run-2")
    lock.follow(new)
    assert lock.held
    # A run that ended before it was followed (a start that failed at once) lets go at once.
    failed = Run("run-3", isActive=False)
    lock.follow(failed)
    assert not lock.held and free(path)


def test_the_heartbeat_beats_for_the_new_run_after_the_old_runs_termination_is_heard_late() -> None:
    beats: list[str] = []
    heartbeat = Heartbeat("redis://127.0.0.1:1", "test", "billing")
    heartbeat._beat = lambda: beats.append("beat")  # type: ignore[method-assign] # Redis is not the point here
    old, new = Run("run-1"), Run("run-2")
    heartbeat.follow(old)
    heartbeat.follow(new)
    heartbeat.onQueryTerminated(terminated(old))
    beats.clear()
    heartbeat.on_progress({"id": new.id, "runId": new.runId, "batchId": 7})
    heartbeat.onQueryIdle(SimpleNamespace(id=new.id, runId=new.runId))
    assert beats == ["beat", "beat"], "the old run's termination, heard late, silenced the new run's heartbeat"
    # The old run's progress is not the new one's.
    heartbeat.on_progress({"id": old.id, "runId": old.runId, "batchId": 6})
    assert beats == ["beat", "beat"]
