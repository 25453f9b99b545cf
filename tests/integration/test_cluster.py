"""The local cluster, started by `adbill up --cluster` on free loopback ports: three KRaft brokers, a Spark master
with two workers, the streaming job and reconciliation submitted to it. Under simulated traffic the job's driver is
SIGKILLed once and the leader broker of a partition once, each restarted as an operator would (`adbill up` again
starts what is missing); the ledger still equals the ground truth, click for click."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attribution.job import checkpoint_conf, checkpoint_join_state_format
from attribution.session import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER
from billing.store.catalog_file import save_catalog
from billing.store.parquet_ledger import read_ledger
from ops.kafka_service import partition_leaders
from ops.process import pid_alive
from ops.settings import PROJECT_ROOT, Settings
from ops.stack import local_cluster_env, local_spark_cluster
from producers.ground_truth import GroundTruth
from producers.publisher import simulate_to_kafka
from producers.simulator import SimulationConfig, Simulator
from tests.redis_figures import RedisFigures

pytestmark = pytest.mark.integration

UP = ["up", "--cluster", "--detach", "--no-web", "--no-traffic"]
# Two runs of one catalog (one seed: the simulator derives it from the seed), their ids apart (their prefixes differ)
# and their users the same: the second starts after the driver's restart, but how long after depends on the machine,
# so a user's click in the second may be a `duplicate_click` of theirs in the first. The ground truth is the two
# judged as one traffic, in the order sent (`ground_truth`).
BACKLOG = SimulationConfig(events=12_000, seed=23, users=300, late_fraction=0.0, bad_fraction=0.005)
FLOWING = SimulationConfig(
    events=12_000, seed=23, id_prefix="flowing", users=300, late_fraction=0.0, bad_fraction=0.005
)
FLOWING_RATE = 300.0  # events/s: 40 s of traffic, so the broker dies while records flow


def cluster_env(home: Path, **overrides: str) -> dict[str, str]:
    return local_cluster_env(
        home,
        ADBILL_DEPS_DIR=str(PROJECT_ROOT / ".deps"),
        ADBILL_RECONCILE_INTERVAL_S="20",
        ADBILL_TRIGGER_MS="1000",
        ADBILL_MAX_OFFSETS_PER_TRIGGER="2000",
        **overrides,
    )


def adbill(env: dict[str, str], *args: str, timeout_s: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, f"adbill {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_for(check: Callable[[], bool], what: str, deadline_s: float) -> float:
    """Poll until `check`; returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if check():
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")


@pytest.fixture(params=["default", pytest.param("4", marks=pytest.mark.slow)], ids=lambda f: f"join-state-{f}")
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Settings, dict[str, str]]]:
    """The local cluster, its job's join state in Spark's default format, and (a slow run) in format 4. Its data
    folder is under /tmp, not pytest's (mode 700): as root, `adbill up` runs PostgreSQL as the `postgres` user,
    which must reach its cluster folder (HOME/postgres/cluster). The logs are copied beside the test's files after."""
    folder = Path(tempfile.mkdtemp(prefix="adbill-cluster-"))
    folder.chmod(0o755)
    env = cluster_env(folder / "home", ADBILL_JOIN_STATE_FORMAT=request.param)
    settings = Settings.from_env(env)
    settings.root.mkdir(parents=True)
    # The job bills from the simulator's catalog: written as a data folder's file before the database runs (`adbill
    # up` starts it), taken into the database the first time it is opened.
    save_catalog(BACKLOG.catalog(), settings.catalog_file)
    try:
        adbill(env, *UP)
        store = settings.catalog_store()
        assert store.current(fresh=True) == BACKLOG.catalog(), "`adbill up` took the file into its database"
        assert not settings.catalog_file.exists(), "the file is set aside once taken in"
        store.close()
        yield settings, env
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "ops.cli", "down", "--cluster"], env=env, capture_output=True, text=True, timeout=180
        )
        print(down.stdout, down.stderr)
        with contextlib.suppress(OSError, shutil.Error):
            shutil.copytree(settings.layout.logs, tmp_path / "logs", dirs_exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_cluster_bills_exactly_through_a_driver_kill_and_a_broker_kill(
    cluster: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, env = cluster
    totals = RedisFigures.from_url(settings.redis_url, settings.redis_prefix)
    spark = local_spark_cluster(settings)

    # The topology: two workers, the job and reconciliation both running, each within its bounded cores.
    assert spark.alive_workers() == 2
    wait_for(
        lambda: {app["name"] for app in spark.applications()} >= {"adbill-stream", "adbill-reconcile"},
        "the job and reconciliation both running on the master",
        120,
    )
    cores = {app["name"]: app["cores"] for app in spark.applications()}
    assert cores["adbill-stream"] <= settings.stream_cores and cores["adbill-reconcile"] <= settings.batch_cores

    def billed_after(batch: int) -> Callable[[], bool]:
        return lambda: (totals.last_applied("billing") or -1) > batch

    # Fault 1: a backlog in Kafka, the driver SIGKILLed once it has billed a batch of it (a batch reads at most
    # 2,000 records per topic), and `adbill up` again, which starts a new driver.
    backlog = send_traffic(settings, tmp_path / "run-a", BACKLOG, rate=None)
    wait_for(billed_after(-1), "a first billing batch", 240)
    driver = pid_alive(settings.layout.run / "stream.pid")
    assert driver is not None
    os.kill(driver, signal.SIGKILL)
    killed_at = totals.last_applied("billing") or -1
    adbill(env, *UP)
    driver_back = wait_for(billed_after(killed_at), "a batch billed by the restarted driver", 240)

    # Fault 2: while traffic flows, the broker leading partition 0 of the clicks topic SIGKILLed; restarted once
    # the job has billed without it.
    sent: dict[str, dict[str, int] | BaseException] = {}

    def send() -> None:
        try:
            sent["truth"] = send_traffic(settings, tmp_path / "run-b", FLOWING, rate=FLOWING_RATE)
        except BaseException as exc:  # reported by the test, not lost in the thread
            sent["truth"] = exc

    traffic = threading.Thread(target=send, daemon=True)
    traffic.start()
    time.sleep(5)
    leader = partition_leaders(settings.kafka_bootstrap, settings.topic_clicks)[0]
    broker = pid_alive(settings.layout.run / f"kafka-{leader}.pid")
    assert broker is not None
    before = totals.last_applied("billing") or -1
    os.kill(broker, signal.SIGKILL)
    new_leader = wait_for(
        lambda: partition_leaders(settings.kafka_bootstrap, settings.topic_clicks)[0] not in (leader, -1),
        "a new leader",
        60,
    )
    broker_gone = wait_for(billed_after(before), "a batch billed without the broker", 180)
    adbill(env, *UP)

    traffic.join(timeout=300)
    assert not traffic.is_alive(), "the traffic did not finish"
    flowing = sent["truth"]
    assert isinstance(flowing, dict), flowing
    alone = backlog | flowing
    truth = ground_truth(tmp_path / "truth", (BACKLOG, tmp_path / "run-a"), (FLOWING, tmp_path / "run-b"))

    def ledger() -> list[dict]:
        return read_ledger(settings.root / "ledger").to_pylist()

    wait_for(lambda: len(ledger()) >= len(truth), "the ledger to catch up with the ground truth", 300)
    time.sleep(3)  # a batch in flight would show up as an extra row
    rows = ledger()
    print(
        f"cluster: {len(truth)} billable clicks ({len(alone.keys() ^ truth.keys())} judged otherwise than in their "
        f"run alone); restarted driver billing {driver_back:.1f} s after `adbill up`; "
        f"new leader {new_leader:.1f} s and a batch {broker_gone:.1f} s after broker {leader} was killed"
    )
    assert len(rows) == len({row["click_id"] for row in rows}), "one bill per click across the faults"
    assert {row["click_id"]: row["amount_micros"] for row in rows} == truth
    redis_clicks = sum(t.clicks for t in totals.all_ad_totals().values())
    redis_micros = sum(t.micros for t in totals.all_ad_totals().values())
    assert (redis_clicks, redis_micros) == (len(truth), sum(truth.values()))
    recorded = checkpoint_join_state_format(settings.layout.checkpoint("billing"))
    assert recorded == (2 if settings.join_state_format == "default" else int(settings.join_state_format))
    # On a Spark master the state is in RocksDB without ADBILL_STATE_STORE (`auto`), the restarted driver's too:
    # in the executors' 1g heaps the in-memory store ran out of memory on a backlog.
    assert "ADBILL_STATE_STORE" not in env
    assert checkpoint_conf(settings.layout.checkpoint("billing"), STATE_STORE_PROVIDER) == ROCKSDB_PROVIDER


def ground_truth(work: Path, *runs: tuple[SimulationConfig, Path]) -> dict[str, int]:
    """What must be charged of `runs` sent one after the other (click id -> micros): each run's arrivals made again
    from its start (its `summary.json`), all judged as one traffic by the ground truth, with the first run's
    catalog (one seed, one catalog)."""
    truth = GroundTruth(runs[0][0].catalog(), workdir=work)
    for config, run_dir in runs:
        start_ms = json.loads((run_dir / "summary.json").read_text())["start_ms"]
        for arrival in Simulator(dataclasses.replace(config, start_ms=start_ms)).arrivals():
            truth.observe(arrival)
    result = truth.finish(work / "billable.jsonl")
    return {row["click_id"]: row["amount_micros"] for row in result.billable()}


def send_traffic(settings: Settings, run_dir: Path, config: SimulationConfig, rate: float | None) -> dict[str, int]:
    """Simulated traffic into the cluster; its ground truth (click id -> micros)."""
    summary = simulate_to_kafka(
        config, settings.kafka_bootstrap, settings.registry_location, run_dir, settings.topics, rate, progress=False
    )
    assert summary.delivery_failures == 0
    lines = (run_dir / "billable.jsonl").read_text().splitlines()
    return {row["click_id"]: row["amount_micros"] for row in map(json.loads, lines)}
