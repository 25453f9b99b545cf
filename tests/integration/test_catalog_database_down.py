"""The catalog's database down, as the people who run the product meet it, on the real PostgreSQL and Redis: the
streaming job's sink records that it prices with the catalog it holds (and removes the record when the database is
back), `/readyz` and the health page say so, and the web's pages go on with the catalog and accounts they hold; a web
worker that holds no accounts yet answers 503, and `adbill users add` fails in one line and exits 69."""

from __future__ import annotations

import io
import os
import time

import pytest

from attribution.job import BatchSink
from billing.catalog import AdChange, generate_catalog
from billing.store.database import RETRY_BEHIND_S
from billing.store.part_status import STREAM_CATALOG_PART, read_status
from billing.store.redis_totals import connect
from ops.cli import main
from ops.postgres_service import LocalPostgres
from ops.reach import EXIT_UNREACHABLE
from ops.settings import Settings
from ops.streaming import stream_config
from tests.web_support import PASSWORD, login
from web.access import Role
from web.app import create_app

pytestmark = pytest.mark.integration


def test_with_the_database_down_the_stream_prices_with_its_catalog_and_readyz_and_health_say_so(
    postgres_server: LocalPostgres,
    redis_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = redis_settings.catalog_store()
    store.start(generate_catalog(2, 2, 2, seed=1))
    sink = BatchSink(stream_config(redis_settings), redis_settings.catalog_store())
    held = sink.catalog_of(1)
    sink.say_catalog_behind()
    redis_settings.accounts_store().add("root", Role.ADMIN, PASSWORD, None)
    client = create_app(redis_settings).test_client()
    login(client, "root")
    redis = connect(redis_settings.redis_url)
    assert client.get("/readyz").get_json()["checks"]["catalog"] == "ok: catalog version 0"

    postgres_server.stop()
    try:
        during = sink.catalog_of(2)
        sink.say_catalog_behind()
        assert during is held, "the batch is priced with the catalog held"
        record = read_status(redis, redis_settings.redis_prefix, STREAM_CATALOG_PART)
        assert record["state"] == "pricing with the catalog it holds"
        assert "catalog version 0" in record["message"] and "cannot be reached" in record["message"]
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "cannot be reached" in ready.get_json()["checks"]["catalog"]
        health = client.get("/health").get_data(as_text=True)
        assert "Catalog database" in health and "pricing with the catalog it holds" in health.lower()
        # A worker that holds no accounts yet answers a login with a clear 503 page, not a traceback.
        refused = login(create_app(redis_settings).test_client(), "root")
        assert refused.status_code == 503 and "database (PostgreSQL) is unreachable" in refused.get_data(as_text=True)
        # `adbill users add` asks the database first: one line naming it, exit 69, nothing written.
        for name in [k for k in os.environ if k.startswith("ADBILL_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("ADBILL_HOME", str(redis_settings.root))
        monkeypatch.setenv("ADBILL_DATABASE_URL", redis_settings.database_url)
        monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
        capsys.readouterr()
        assert main(["users", "add", "fiona", "--role", "finance", "--password-stdin"]) == EXIT_UNREACHABLE
        said = capsys.readouterr().err.splitlines()
        assert len(said) == 1 and said[0].startswith("adbill users: cannot reach PostgreSQL at "), said
    finally:
        postgres_server.start()

    store.change(AdChange(held.ad_ids[0], int(time.time() * 1000) + 60_000, 1))
    time.sleep(RETRY_BEHIND_S + 0.5)  # readers try the database again after this long
    after = sink.catalog_of(3)
    sink.say_catalog_behind()
    assert after.version == 1, "the change made after the database came back is taken"
    assert read_status(redis, redis_settings.redis_prefix, STREAM_CATALOG_PART) == {}
    assert client.get("/readyz").get_json()["checks"]["catalog"] == "ok: catalog version 1"
    assert redis_settings.accounts_store().get("fiona") is None
