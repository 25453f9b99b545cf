"""The web UI's open probes and its answer while Redis is down, on a real Redis that this module starts and stops.

`/healthz` answers while the process serves; `/readyz` only while Redis answers and the job's last batch is recent;
with Redis stopped every page answers 503 with a clear page, the API a JSON body, never a bare 500.
"""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from billing.store.redis_keys import RedisKeys
from ops.process import ServiceError, free_port
from ops.redis_service import LocalRedis
from ops.settings import Settings
from ops.stack import Stack, http_ok
from tests.conftest import isolated_settings
from tests.web_support import OWN, login, seed
from web.app import create_app

pytestmark = pytest.mark.integration

NOW_MS = 1_767_229_200_000  # 2026-01-01T01:00Z


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[LocalRedis]:
    """A Redis of this test alone, so that stopping it disturbs no other test."""
    server = LocalRedis(data_dir=tmp_path / "redis", port=free_port(), run_dir=tmp_path / "run", appendonly=False)
    server.start()
    yield server
    server.stop()


def settings_for(home: Path, redis_url: str, database_url: str) -> Settings:
    return isolated_settings(
        home=home,
        database_url=database_url,
        redis_url=redis_url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
    )


def test_healthz_is_open_and_readyz_follows_redis_and_the_jobs_last_batch(
    tmp_path: Path, own_redis: LocalRedis, database: str
) -> None:
    settings = settings_for(tmp_path / "home", own_redis.url, database)
    seeded = seed(settings)
    app = create_app(settings, clock=lambda: NOW_MS)
    client = app.test_client()
    assert client.get("/healthz").json == {"status": "ok"}

    # No batch yet: Redis answers, the job has never reported.
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json["checks"] == {"redis": "ok", "job": "no batch yet", "catalog": "ok: catalog version 0"}

    beat = RedisKeys(settings.redis_prefix).heartbeat("billing")
    seeded.client.set(beat, str(NOW_MS - 5_000))  # a batch 5 s ago
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json["status"] == "ready", ready.json
    assert ready.json["checks"]["job"] == "ok: last batch 5 s ago"

    seeded.client.set(beat, str(NOW_MS - (settings.web_ready_batch_age_s + 1) * 1000))  # one second too old
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json["checks"]["job"].startswith("last batch 61 s ago")
    seeded.client.close()


def test_with_redis_stopped_pages_and_api_answer_503_and_healthz_still_200(
    tmp_path: Path, own_redis: LocalRedis, database: str
) -> None:
    settings = settings_for(tmp_path / "home", own_redis.url, database)
    seeded = seed(settings)
    seeded.client.set(RedisKeys(settings.redis_prefix).heartbeat("billing"), str(int(time.time() * 1000)))
    app = create_app(settings, cache_s=0)
    alice = app.test_client()
    assert login(alice, "alice").status_code == 302
    assert alice.get(f"/api/v1/advertisers/{OWN}/dashboard").status_code == 200
    assert alice.get("/readyz").status_code == 200
    seeded.client.close()

    own_redis.stop()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(own_redis.url, socket_connect_timeout=1).ping()

    page = alice.get(f"/advertisers/{OWN}")
    assert page.status_code == 503, page.text
    assert "Redis" in page.text and "unreachable" in page.text and page.mimetype == "text/html"
    assert page.headers["Retry-After"] == "5"
    api = alice.get(f"/api/v1/advertisers/{OWN}/dashboard")
    assert api.status_code == 503
    assert api.json == {"error": "Redis is unreachable", "status": 503}
    anonymous = app.test_client()
    assert anonymous.post("/login", data={"username": "alice", "password": "x"}).status_code in (400, 503)
    assert anonymous.get("/login").status_code == 200, "the login form itself needs no Redis"

    # The probes: alive, not ready, and why; a session cookie does not make them touch Redis.
    assert alice.get("/healthz").status_code == 200
    ready = alice.get("/readyz")
    assert ready.status_code == 503 and ready.json["checks"]["redis"].startswith("unreachable")

    # Redis back: the same app serves again, without a restart.
    own_redis.start()
    assert alice.get(f"/api/v1/advertisers/{OWN}/dashboard").status_code in (200, 401)


def test_the_stack_waits_for_the_web_uis_healthz_and_fails_with_its_log_when_it_dies(
    tmp_path: Path,
    redis_server: LocalRedis,
    database: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`adbill up` starts the web UI and waits for its `/healthz`; one that cannot start fails the wait at once."""
    settings = isolated_settings(
        home=tmp_path / "home",
        database_url=database,
        redis_url=redis_server.url,
        redis_prefix=f"t{uuid.uuid4().hex[:10]}",
        web_port=free_port(),
        web_workers=2,
    )
    for name, value in settings.to_env().items():  # the stack's children read the settings from the environment
        monkeypatch.setenv(name, value)
    url = f"http://127.0.0.1:{settings.web_port}"
    stack = Stack(settings)
    try:
        stack.start_child("web", ["web"])
        stack.wait_healthy("web", f"{url}/healthz", timeout_s=60)
        assert f"web      healthy   {url}/healthz" in capsys.readouterr().out
        assert http_ok(f"{url}/healthz") and not http_ok(f"{url}/readyz"), "no job: alive, not ready"
        for _ in range(5):
            http_ok(f"{url}/readyz")
        # /metrics adds up both gunicorn workers: exactly the six /readyz asked, whichever worker answered each.
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        assert 'adbill_web_requests_total{endpoint="probes.readyz",method="GET",status="503"} 6.0' in scraped
        assert 'adbill_web_request_duration_seconds_count{endpoint="probes.readyz",method="GET"} 6.0' in scraped
    finally:
        stack.stop()

    # A second web UI on a port that another program holds dies at once; the wait says so with its log.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        monkeypatch.setenv("ADBILL_WEB_PORT", str(holder.getsockname()[1]))
        taken = Settings.from_env()
        stack = Stack(taken)
        try:
            stack.start_child("web", ["web"])
            started = time.monotonic()
            with pytest.raises(ServiceError, match="web exited with code"):
                stack.wait_healthy("web", f"http://127.0.0.1:{taken.web_port}/healthz", timeout_s=60)
            assert time.monotonic() - started < 45
        finally:
            stack.stop()


def test_the_web_uis_metrics_count_and_time_requests_by_route_name(
    tmp_path: Path, redis_server: LocalRedis, database: str
) -> None:
    settings = settings_for(tmp_path / "home", redis_server.url, database)
    seed(settings).client.close()
    client = create_app(settings).test_client()

    def count(endpoint: str, status: str) -> float:
        scraped = client.get("/metrics")
        assert scraped.status_code == 200 and scraped.mimetype == "text/plain"
        for line in scraped.text.splitlines():
            if line.startswith(f'adbill_web_requests_total{{endpoint="{endpoint}",method="GET",status="{status}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = count("pages.finance", "302"), count("unmatched", "404")
    client.get("/finance")  # anonymous: to the login form
    client.get("/no/such/page/123")  # unmatched URLs share one label, whatever they are
    client.get("/no/such/page/456")
    assert (count("pages.finance", "302"), count("unmatched", "404")) == (before[0] + 1, before[1] + 2)
    assert "/no/such" not in client.get("/metrics").text
