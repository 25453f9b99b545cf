"""The one wait for disk space (`billing.store.disk_space`): what counts as a full disk, the retries, the messages."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pyarrow as pa
import pytest

import attribution.batch_output as batch_output
from attribution.batch_output import write_batch_files
from billing.store.disk_space import is_disk_full, probe_room, retry_while_disk_full


def full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (full(), True),  # Python's own write
        (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), True),  # a quota reached
        (OSError(errno.EACCES, "Permission denied"), False),
        # What Spark hands the driver as text: the JVM's IOException, a Python worker's OSError.
        (RuntimeError("Job aborted ... java.io.IOException: No space left on device\n\tat ..."), True),
        ("org.apache.spark.SparkException: ... OSError: [Errno 28] No space left on device", True),
        (ValueError("a bad row"), False),
        (None, False),
    ],
)
def test_a_full_disk_is_recognised_by_its_errno_or_its_message(failure: object, expected: bool) -> None:
    assert is_disk_full(failure) is expected  # type: ignore[arg-type]


def test_a_full_disk_is_recognised_in_a_cause() -> None:
    try:
        try:
            raise full()
        except OSError as exc:
            raise RuntimeError("the batch failed") from exc
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)


def test_a_step_is_tried_again_while_the_disk_is_full_with_one_line_a_minute_and_the_status_cleared(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    pauses: list[float] = []
    statuses: list[str | None] = []
    attempts = iter([full(), full(), full(), full(), full(), full(), full(), full(), full(), None])

    def step() -> str:
        failure = next(attempts)
        if failure is not None:
            raise failure
        return "written"

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    with caplog.at_level(logging.WARNING, logger="billing.store.disk_space"):
        done = retry_while_disk_full(step, "batch 7", Path("/data"), statuses.append, sleep, lambda: now[0])
    assert done == "written"
    assert pauses == [1.0, 2.0, 5.0, 10.0, 15.0, 15.0, 15.0, 15.0, 15.0], "a growing pause, then 15 s"
    # One line when it starts, one a minute while it lasts, one when it ends; the status follows.
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("waiting for disk space in /data: batch 7 failed ([Errno 28] No space left on device)")
    assert lines[1].startswith("waiting for disk space in /data for 63 s: batch 7")
    assert lines[-1] == "disk space is back in /data after 93 s: batch 7 done"
    assert len(lines) == 3
    assert statuses[-1] is None and all(s and "waiting for disk space" in s for s in statuses[:-1])


def test_any_other_failure_is_raised_at_once() -> None:
    def step() -> None:
        raise ValueError("not the disk")

    with pytest.raises(ValueError, match="not the disk"):
        retry_while_disk_full(step, "a step", Path("/data"), sleep=lambda s: pytest.fail("no wait"))


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    probe_room(tmp_path, size=1024)
    assert list(tmp_path.iterdir()) == []


def test_a_batch_write_that_fails_leaves_no_staging_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = pa.table({"period": ["p1", "p2"], "batch_id": [3, 3], "click_id": ["c1", "c2"]})
    real = batch_output.pq.write_table
    written: list[Path] = []

    def write_then_fail(part: pa.Table, where: Path, **kwargs: object) -> None:
        real(part, where, **kwargs)  # type: ignore[arg-type]
        written.append(Path(where))
        if len(written) == 2:
            raise full()  # the second file of the batch finds the disk full, half written

    monkeypatch.setattr(batch_output.pq, "write_table", write_then_fail)
    with pytest.raises(OSError, match="No space left"):
        write_batch_files(table, tmp_path, ("period", "batch_id"))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [], "no staging file, no file in place"
