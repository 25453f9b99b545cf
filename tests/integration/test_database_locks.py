"""The job's and reconciliation's locks hold across hosts (`billing.store.database_lock`), on the real PostgreSQL:
two data folder paths stand for two hosts sharing one database (their lock files cannot see one another); the second
job, restore or reconciliation is refused, naming the holder; a holder whose session broke takes the lock again, and
one that finds it taken by another is told to stop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from attribution.job_lock import FileLock, JobLock, JobLockedError, stream_lock_name
from billing.reconcile_run import ReconcileBusyError
from billing.store.database_lock import LEASE_CHECK_S, DatabaseLock, DatabaseLockedError
from ops.postgres_service import LocalPostgres
from ops.reconcile import ReconcileConfig, run_lock

pytestmark = pytest.mark.integration


def test_a_second_streaming_job_or_restore_on_another_host_is_refused_by_the_database(
    tmp_path: Path, database: str
) -> None:
    first = JobLock(tmp_path / "host-a" / "job.lock", database, "p1")
    first.acquire()
    try:
        with pytest.raises(JobLockedError, match="the streaming job .* on .*pid .*database lock stream:p1"):
            JobLock(tmp_path / "host-b" / "job.lock", database, "p1").acquire(wait_s=1)
        restore = FileLock(
            tmp_path / "host-b" / "job.lock",
            "adbill restore-redis",
            DatabaseLock(database, stream_lock_name("p1"), "adbill restore-redis"),
        )
        with pytest.raises(JobLockedError, match="database lock"):
            restore.acquire()
        assert not (tmp_path / "host-b" / "job.lock").read_text(), "the refused lock left its file free"
        other = JobLock(tmp_path / "host-b" / "other.lock", database, "p2")  # another deployment's prefix
        other.acquire()
        other.release()  # else its keeper thread outlives the test and says so when the session's server stops
    finally:
        first.release()
    second = JobLock(tmp_path / "host-b" / "job.lock", database, "p1")
    second.acquire()
    second.release()


def test_a_second_reconciliation_on_another_host_does_nothing(tmp_path: Path, database: str) -> None:
    def config(host: str) -> ReconcileConfig:
        return ReconcileConfig(
            data_dir=tmp_path / host, redis_url="redis://unused", redis_prefix="p1", database_url=database
        )

    refused = pytest.raises(ReconcileBusyError, match="database lock reconcile:p1 .*a reconciliation run")
    with run_lock(config("host-a")), refused, run_lock(config("host-b")):
        pass
    with run_lock(config("host-b")):
        pass


def test_a_holder_takes_its_lock_again_after_a_restart_and_stops_when_another_took_it(
    postgres_server: LocalPostgres, database: str
) -> None:
    lost: list[str] = []
    first = DatabaseLock(database, "stream:lease", "job A", on_lost=lost.append)
    first.acquire()
    postgres_server.stop()
    postgres_server.start()
    time.sleep(LEASE_CHECK_S * 2 + 1)
    assert first.held and not lost
    with pytest.raises(DatabaseLockedError, match="job A"):
        DatabaseLock(database, "stream:lease", "job B").acquire()

    # A's watch waits on its mutex while the database restarts and B takes the lock, so B is surely first
    # (without it, A's check could fall between the restart and B's try, and A would hold the lock again)
    with first._mutex:
        postgres_server.stop()
        postgres_server.start()
        second = DatabaseLock(database, "stream:lease", "job B")
        second.acquire()
    deadline = time.monotonic() + LEASE_CHECK_S * 3
    while not lost and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lost and "job B" in lost[0], "A was told another holds the lock, and must stop"
    assert not first.held and second.held
    second.release()
