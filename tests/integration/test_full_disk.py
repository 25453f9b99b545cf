"""A full disk under the running job, on real Kafka, Spark and Redis: the data folder on a small tmpfs of its own,
filled with a ballast file until writes fail with ENOSPC for about 30 s, then freed. The job and a reconciliation
run during it wait, say so, and go on by themselves; nothing is lost, nothing billed twice, no partial file counts.

Needs to mount a tmpfs (root, as on CI); skipped with the mount's error otherwise."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from attribution.stream_position import stream_position
from billing.reconcile_plan import hold_reason
from billing.store.corrections_arrow import CorrectionFiles
from billing.store.export_files import read_export
from billing.store.parquet_ledger import read_ledger
from billing.store.part_status import read_status
from ops.settings import Settings
from tests.conftest import child_env
from tests.integration.test_stream_job import (
    ledger_ad_totals,
    ledger_rows,
    read_to_the_end,
    redis_ad_totals,
    settled,
    simulated_run,
    wait_for,
)
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

# Room for the job's Spark scratch at its largest, with a reconciliation's beside, and a ballast: the job's (RocksDB's
# working files for its 20 state store instances) measured 75 to 155 MB on one machine and filled 256 MB on another.
DISK_MB = 1024
FULL_FOR_S = 30.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of `DISK_MB` MB at `tmp_path/home` (the test's data folder), unmounted after the test."""
    home = tmp_path / "home"
    home.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(home)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem for the data folder: `{' '.join(mount)}`: {done.stderr.strip()}")
    yield home
    subprocess.run(["umount", "-l", str(home)], check=False)


def fill(folder: Path, ballast: Path) -> int:
    """Append zeros to `ballast` until the disk of `folder` is full (ENOSPC); the bytes it holds."""
    block = b"\0" * (1 << 20)
    if not ballast.exists():
        free = shutil.disk_usage(folder).free
        assert free > (DISK_MB << 20) // 4, (
            f"the data folder's own files leave {free >> 20} MB of {DISK_MB} MB: too little to fill and free again"
        )
    with ballast.open("ab") as out:
        while True:
            try:
                out.write(block)
                out.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        size = out.tell()
    # The last bytes: whatever room the blocks left (a page or two).
    try:
        with ballast.open("ab") as out:
            while True:
                out.write(b"\0" * 4096)
                out.flush()
    except OSError:
        pass
    return size


def test_a_full_disk_makes_the_job_and_reconciliation_wait_and_go_on_with_nothing_lost_or_billed_twice(
    settings: Settings, small_disk: Path, tmp_path: Path
) -> None:
    settings.catalog_file.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(
        settings,
        ADBILL_METRICS_PORT="0",
        ADBILL_MAX_OFFSETS_PER_TRIGGER="4000",
        ADBILL_TRIGGER_MS="500",
        ADBILL_PERIOD_MS="60000",
        ADBILL_LATENESS_HORIZON_MS="1000",
        ADBILL_RECONCILE_METRICS_PORT="0",
    )
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    truth: dict[str, tuple[dict[str, int], set[str]]] = {}
    # Live traffic all through: 18,000 events at 200/s, 90 s of it (past the disk freed), its ground truth beside.
    traffic = threading.Thread(
        target=lambda: truth.update(run=simulated_run(settings, tmp_path / "run", events=18_000, rate=200)),
        daemon=True,
    )
    traffic.start()
    log = (tmp_path / "job.log").open("ab")
    job = subprocess.Popen([sys.executable, "-m", "ops.cli", "stream"], env=env, stdout=log, stderr=log)
    reconcile_log = tmp_path / "reconcile.log"
    try:
        wait_for(lambda: (totals.last_applied("billing") or -1) >= 2, "the job's first batches", 240)
        ballast = small_disk / f".ballast-{uuid.uuid4().hex[:6]}"
        fill(small_disk, ballast)
        full_since = time.monotonic()
        # Reconciliation, run while the disk is full, records what Kafka holds for the periods past their horizon:
        # it waits for room, and says so.
        with reconcile_log.open("ab") as out:
            reconcile = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "reconcile"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        waited: dict[str, str] = {}
        while time.monotonic() - full_since < FULL_FOR_S or not waited.get("stream"):
            fill(small_disk, ballast)  # whatever a failed write gave back is taken again
            for part in ("stream", "reconcile"):
                status = read_status(totals.client, settings.redis_prefix, part)
                if status:
                    waited[part] = status["message"]
            assert job.poll() is None, "the job waits for room; it does not exit"
            assert time.monotonic() - full_since < 240, f"the job never said it waits for disk space: {waited}"
            time.sleep(1)
        assert "waiting for disk space" in waited["stream"] or "disk" in waited["stream"], waited
        health = subprocess.run(
            [sys.executable, "-m", "ops.cli", "health", "stream"], env=env, capture_output=True, text=True
        )
        assert health.returncode == 1 and "disk" in health.stdout + health.stderr, health
        # Reconciliation holds the periods the job has not passed, saying that the job waits, not that it is down.
        position = stream_position(
            settings.layout.checkpoint("billing"),
            settings.kafka_bootstrap,
            [settings.topic_impressions, settings.topic_clicks],
            settings.redis_url,
            settings.redis_prefix,
            "billing",
            alive_within_ms=1,
        )
        assert position.end is not None, position
        held = hold_reason(position, position.end) or ""
        assert held.startswith("held: the streaming job is waiting for disk space for "), held
        ballast.unlink()
        freed_at = time.monotonic()

        # Room again: both go on by themselves.
        assert reconcile.wait(timeout=300) == 0, reconcile_log.read_text()[-3000:]
        traffic.join(timeout=600)
        assert "run" in truth, "the traffic finished"
        wait_for(lambda: read_to_the_end(settings), "the job to commit up to the end of the topics", 300)
        recovered_s = time.monotonic() - freed_at
        wait_for(
            lambda: not read_status(totals.client, settings.redis_prefix, "stream"), "the job's status cleared", 60
        )
        assert job.poll() is None, "the job is still running"
        closing = subprocess.run(
            [sys.executable, "-m", "ops.cli", "reconcile", "--until", str(int(time.time() * 1000) - 60_000)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert closing.returncode == 0, closing.stdout[-2000:] + closing.stderr[-2000:]
    finally:
        job.terminate()
        job.wait(timeout=60)

    job_log = (tmp_path / "job.log").read_text(errors="replace")
    assert "waiting for disk space" in job_log
    assert "disk space is back" in job_log
    assert "waiting for disk space" in reconcile_log.read_text(), "reconciliation said that it waited"
    expected, conflicted = truth["run"]
    # The ledger: every file whole (read_ledger stops on a broken one), one bill per click, the ground truth (on
    # every click without a conflicting copy: `simulated_run`).
    rows = ledger_rows(settings)
    assert len(rows) == len({row["click_id"] for row in rows}), "one bill per click across the full disk"
    billed = {row["click_id"]: row["amount_micros"] for row in rows}
    assert settled(billed, conflicted) == settled(expected, conflicted)
    # Redis: the stream's bills, but a bill made after its period closed (the first run closed periods while the job
    # was still catching up) leaves the closed period's totals alone and is booked as an adjustment.
    assert redis_plus_billed_after_close(settings) == ledger_ad_totals(rows)
    # No staging file was left behind by a failed write, in any table.
    for table in ("ledger", "archive", "quarantine", "unbilled", "corrections", "exports"):
        left = (
            [p for p in (settings.root / table).rglob(".*") if p.is_file()] if (settings.root / table).exists() else []
        )
        assert left == [], f"staging files left in {table}: {left[:5]}"
    # What finance was given for the closed periods: the ground truth of those periods, to the micro.
    exports = sorted((settings.root / "exports").glob("*/billing.parquet"))
    assert exports, "the last run closed periods"
    closed = {path.parent.name for path in exports}
    exported, booked_open = given_for(settings, closed)
    assert exported + booked_open == sum(
        r["amount_micros"]
        for r in rows
        if r["period"] in closed and (r["click_id"] not in conflicted or r["click_id"] in expected)
    )
    assert read_ledger(settings.root / "ledger").num_rows == len(rows)
    print(
        f"full disk for {FULL_FOR_S:.0f} s; the job had read everything {recovered_s:.1f} s after room came back; "
        f"{booked_open:,} micros of the closed periods booked in a period still open"
    )


def given_for(settings: Settings, closed: set[str]) -> tuple[int, int]:
    """The micros finance was given for the `closed` periods: their exports (each period's bills and the adjustments
    booked in it), and the adjustments of those periods booked in a period still open (the first run closes periods
    while the job still catches up; a bill it makes there after the close is booked in the period open at the next
    run, which the last run, closing up to a minute ago, may leave open)."""
    exported = sum(sum(read_export(settings.layout.export(p)).column("net_micros").to_pylist()) for p in closed)
    booked_open = sum(
        c.amount_micros
        for c in CorrectionFiles(settings.layout).read()
        if c.corrects_period in closed and c.booked_period not in closed
    )
    return exported, booked_open


def redis_plus_billed_after_close(settings: Settings) -> dict[str, tuple[int, int]]:
    """Each ad's clicks and micros in Redis plus the `billed_after_close` adjustments booked for it: what the ledger
    holds, once every bill the stream made after its period closed is booked."""
    totals = {ad: list(figures) for ad, figures in redis_ad_totals(settings).items()}
    for correction in CorrectionFiles(settings.layout).read():
        if correction.reason == "billed_after_close":
            figures = totals.setdefault(correction.ad_id, [0, 0])
            figures[0] += 1
            figures[1] += correction.amount_micros
    return {ad: (clicks, micros) for ad, (clicks, micros) in totals.items()}
