"""Commands fail fast and honestly: a service that does not answer is named, with its address, in one line within
seconds, and the exit code says so; a replay with a bad line or an undelivered record exits non-zero.

The unreachable services are real free loopback ports that nothing listens on (`ops.process.free_port`); the
reachable ones are the session's real Kafka and Redis. Each command runs as `python -m ops.cli`, as a person runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from billing.store.schema_registry import open_registry
from ops.cli import _delivery_outcome
from ops.kafka_service import broker_ready
from ops.process import free_port
from ops.reach import EXIT_UNREACHABLE
from ops.redis_service import LocalRedis
from ops.settings import PROJECT_ROOT, Settings
from producers.publisher import replay_to_kafka

pytestmark = pytest.mark.integration

BOUND_S = 20.0
"""Generous: the promise is about 10 s (Kafka's check waits 6 s, Redis's 3 s)."""


def adbill(home: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ADBILL_")}
    environ.update({"ADBILL_HOME": str(home), "ADBILL_NO_PROGRESS": "1", "PYTHONPATH": str(PROJECT_ROOT), **env})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        cwd=PROJECT_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - started


def capture(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


IMPRESSION = json.dumps(
    {"type": "impression", "impression_id": "i1", "ad_id": "ad-1", "user_id": "u1", "event_time": 1767225600000}
)


@pytest.mark.parametrize(
    "args",
    [["topics"], ["replay", "CAPTURE"], ["produce", "--events", "10"], ["reconcile"]],
    ids=["topics", "replay", "produce", "reconcile"],
)
def test_kafka_unreachable_is_one_line_naming_it_within_seconds(
    tmp_path: Path, args: list[str], redis_server: LocalRedis, database: str
) -> None:
    address = f"127.0.0.1:{free_port()}"
    # Reconcile needs Redis and the catalog's database as well: both answer, so Kafka is the one named.
    redis_url = redis_server.url
    args = [str(capture(tmp_path / "c.jsonl", [IMPRESSION])) if a == "CAPTURE" else a for a in args]
    done, took = adbill(
        tmp_path / "home", *args, ADBILL_KAFKA_BOOTSTRAP=address, ADBILL_REDIS_URL=redis_url,
        ADBILL_DATABASE_URL=database,
    )  # fmt: skip
    assert done.returncode == EXIT_UNREACHABLE, done
    assert took < BOUND_S
    assert done.stderr.strip().splitlines() == [
        f"adbill {args[0]}: cannot reach Kafka at {address} (no broker answered within 6 s); start it "
        "(`adbill up`) or set ADBILL_KAFKA_BOOTSTRAP"
    ]
    assert "rdkafka" not in done.stdout + done.stderr and "Connect to" not in done.stdout + done.stderr


@pytest.mark.parametrize("args", [["restore-redis"], ["audit"]], ids=["restore-redis", "audit"])
def test_redis_unreachable_is_one_line_naming_it_without_its_password(tmp_path: Path, args: list[str]) -> None:
    port = free_port()
    done, took = adbill(tmp_path / "home", *args, ADBILL_REDIS_URL=f"redis://:hunter2@127.0.0.1:{port}/3")
    assert done.returncode == EXIT_UNREACHABLE, done
    assert took < BOUND_S
    assert done.stderr.strip().splitlines() == [
        f"adbill {args[0]}: cannot reach Redis at redis://127.0.0.1:{port}/3 (no answer within 3 s); start it "
        "(`adbill up`) or set ADBILL_REDIS_URL"
    ]


@pytest.mark.parametrize(
    "args",
    [["catalog", "show"], ["ivt", "list"], ["explain", "c-1"], ["profiles", "list"], ["names", "list"],
     ["invoices", "issue"]],
    ids=["catalog", "ivt", "explain", "profiles", "names", "invoices"],
)  # fmt: skip
def test_the_catalogs_database_unreachable_is_one_line_naming_it_without_its_password(
    tmp_path: Path, args: list[str]
) -> None:
    port = free_port()
    done, took = adbill(
        tmp_path / "home", *args, ADBILL_DATABASE_URL=f"postgresql://adbill:hunter2@127.0.0.1:{port}/ads"
    )
    assert done.returncode == EXIT_UNREACHABLE, done
    assert took < BOUND_S
    assert done.stderr.strip().splitlines() == [
        f"adbill {args[0]}: cannot reach PostgreSQL at 127.0.0.1:{port}/ads (no answer within 3 s); start it "
        "(`adbill up`) or set ADBILL_DATABASE_URL"
    ]


def test_the_stream_names_redis_when_kafka_answers_and_redis_does_not(tmp_path: Path, settings: Settings) -> None:
    port = free_port()
    done, took = adbill(
        tmp_path / "home", "stream", ADBILL_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        ADBILL_REDIS_URL=f"redis://127.0.0.1:{port}/0",
    )  # fmt: skip
    assert done.returncode == EXIT_UNREACHABLE and took < BOUND_S, done
    assert f"cannot reach Redis at redis://127.0.0.1:{port}/0" in done.stderr


def test_broker_ready_answers_false_for_a_port_nobody_listens_on() -> None:
    started = time.monotonic()
    assert broker_ready(f"127.0.0.1:{free_port()}", timeout_s=1) is False
    assert time.monotonic() - started < BOUND_S


def test_a_replay_with_a_bad_line_exits_1_and_says_how_many(tmp_path: Path, settings: Settings) -> None:
    env = {
        "ADBILL_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "ADBILL_TOPIC_IMPRESSIONS": settings.topic_impressions,
        "ADBILL_TOPIC_CLICKS": settings.topic_clicks,
        "ADBILL_TOPIC_QUARANTINE": settings.topic_quarantine,
        "ADBILL_DATABASE_URL": settings.database_url,
    }
    good = capture(tmp_path / "good.jsonl", [IMPRESSION])
    done, _ = adbill(tmp_path / "home", "replay", str(good), **env)
    assert done.returncode == 0, done
    bad = capture(tmp_path / "bad.jsonl", [IMPRESSION, '{"type": "impression"', "not json either"])
    done, _ = adbill(tmp_path / "home", "replay", str(bad), **env)
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines()[-1] == "adbill replay: 2 bad line(s) not sent"


def test_a_replayed_ad_line_in_another_currency_than_its_advertisers_is_refused_in_one_line(
    tmp_path: Path, settings: Settings
) -> None:
    """An advertiser bills in one currency: a capture cannot give it an ad in a second one, back-fill or not."""
    env = {
        "ADBILL_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "ADBILL_TOPIC_IMPRESSIONS": settings.topic_impressions,
        "ADBILL_TOPIC_CLICKS": settings.topic_clicks,
        "ADBILL_TOPIC_QUARANTINE": settings.topic_quarantine,
        "ADBILL_DATABASE_URL": settings.database_url,
    }
    ad = {"type": "ad", "campaign_id": "c1", "advertiser_id": "adv1", "effective_from": 1767225600000}
    lines = [
        json.dumps({**ad, "ad_id": "a1", "currency": "EUR", "cpc_micros": 250000}),
        json.dumps({**ad, "ad_id": "a2", "currency": "JPY", "cpc_micros": 40000000}),
        IMPRESSION,
    ]
    done, _ = adbill(tmp_path / "home", "replay", str(capture(tmp_path / "c.jsonl", lines)), **env)
    assert done.returncode == 1, done
    refusal = [line for line in done.stderr.splitlines() if "catalog change refused" in line]
    assert len(refusal) == 1 and "advertiser adv1 bills in EUR" in refusal[0] and "a2" in refusal[0], done.stderr
    assert done.stderr.strip().splitlines()[-1] == "adbill replay: 1 bad line(s) not sent"
    assert [a.ad_id for a in settings.catalog_store().current()] == ["a1"]


def test_records_not_delivered_are_counted_and_make_the_exit_code_1(tmp_path: Path) -> None:
    """Kafka gone after the check: what the client could not deliver by the flush timeout is counted."""
    path = capture(tmp_path / "c.jsonl", [IMPRESSION] * 3)
    registry = open_registry(str(tmp_path / "schemas.json"))
    result = replay_to_kafka(path, f"127.0.0.1:{free_port()}", registry, progress=False, flush_timeout_s=1)
    assert result.publish.not_delivered == 3
    assert _delivery_outcome("replay", result.publish.not_delivered, result.bad_lines) == 1
    assert _delivery_outcome("replay", 0, 0) == 0


def test_adbill_debug_is_a_known_variable_and_shows_the_traceback(tmp_path: Path, database: str) -> None:
    assert Settings.from_env({"ADBILL_DEBUG": "1"}).home == Path("var")
    missing = tmp_path / "nowhere.json"
    # A database that holds no catalog, and no catalog file to take in: an error.
    env = {"ADBILL_CATALOG": str(missing), "ADBILL_DATABASE_URL": database}
    done, _ = adbill(tmp_path / "home", "catalog", "show", **env)
    assert done.returncode == 1 and done.stderr.startswith("adbill catalog: error:"), done
    done, _ = adbill(tmp_path / "home", "catalog", "show", **env, ADBILL_DEBUG="1")
    assert done.returncode == 1 and "Traceback" in done.stderr, done
