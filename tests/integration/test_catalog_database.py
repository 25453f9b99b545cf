"""The ad catalog in PostgreSQL (`billing.store.catalog_db`), on the real server: readers take only what changed since
the version they hold, concurrent writers lose nothing and number their changes with no gap, the constraints refuse a
second currency where a change commits, a data folder's catalog file is taken in once, and a reader goes on with
the catalog it holds while the database is down."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from billing.catalog import (
    Ad,
    AdChange,
    BudgetSetting,
    Catalog,
    CatalogError,
    ExclusionSetting,
    MadeBy,
    generate_catalog,
)
from billing.change_log import Provenance, describe_change
from billing.store.catalog_db import CatalogDatabase, Scope
from billing.store.catalog_file import save_catalog
from billing.store.database import CONNECT_TIMEOUT_S
from ops.catalog_load import ChangeWriters, check_confirmed
from ops.postgres_service import LocalPostgres

pytestmark = pytest.mark.integration

NOW = 1_800_000_000_000
EUR = "EUR"


def _catalog() -> Catalog:
    return Catalog(
        [
            Ad("ad-1", "c-1", "adv-1", 500_000, EUR),
            Ad("ad-2", "c-1", "adv-1", 700_000, EUR),
            Ad("ad-3", "c-2", "adv-2", 300_000, "USD"),
        ]
    )


def test_a_reader_takes_only_the_changes_made_since_the_version_it_holds(database: str) -> None:
    writer, reader = CatalogDatabase(database), CatalogDatabase(database)
    writer.start(_catalog(), made_by=MadeBy("ops", "command"))
    before = reader.current()
    assert before == _catalog() and before.version == 0

    writer.change(AdChange("ad-1", NOW + 10, 900_000), clock=lambda: NOW, made_by=MadeBy("ana", "page"))
    writer.change(BudgetSetting("c-2", NOW + 20, 5_000_000), clock=lambda: NOW + 1)
    writer.change(ExclusionSetting("203.0.113.0/24", NOW + 30, True), clock=lambda: NOW + 2)
    writer.change(AdChange("ad-4", NOW + 40, 100_000, "c-2", "adv-2", "USD"), clock=lambda: NOW + 3)
    after = reader.current()

    assert after.version == 4
    assert after.price("ad-1", NOW + 10) == (after["ad-1"], 900_000)
    assert after.budget_at("c-2", NOW + 20) == 5_000_000
    assert after.exclusions.in_force("203.0.113.0/24", NOW + 30)
    assert after["ad-4"].campaign_id == "c-2"
    assert after["ad-2"] is before["ad-2"]  # an ad no change touched is not read again
    assert after == writer.current()
    kinds = [(e.version, e.kind, e.who, e.door) for e in reader.changes()]
    assert kinds == [
        (0, "start", "ops", "command"),
        (1, "set-price", "ana", "page"),
        (2, "set-budget", None, None),
        (3, "exclude-ip", None, None),
        (4, "create-ad", None, None),
    ]


def test_concurrent_writers_on_their_own_connections_lose_nothing_and_leave_no_gap(database: str) -> None:
    CatalogDatabase(database).start(_catalog())
    errors: list[BaseException] = []

    def write(number: int) -> None:
        store = CatalogDatabase(database)
        try:
            for i in range(15):
                price = 1_000 * (number * 100 + i + 1)
                store.change(AdChange(f"ad-{number % 3 + 1}", NOW + 1_000 + i, price), clock=lambda: NOW)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    catalog = CatalogDatabase(database).current()
    assert catalog.version == 60
    versions = sorted(p.version for ad in catalog for p in ad.prices if p.version > 0)
    assert versions == list(range(1, 61))
    log = CatalogDatabase(database).changes()
    assert [e.version for e in log if e.kind != "start"] == list(range(1, 61))


def test_the_database_refuses_a_second_currency_and_a_shared_campaign_where_the_change_commits(database: str) -> None:
    store = CatalogDatabase(database)
    store.start(_catalog())
    with pytest.raises(CatalogError, match="bills in EUR"):
        store.change(AdChange("ad-9", NOW, 1, "c-9", "adv-1", "USD"), clock=lambda: NOW)
    with psycopg.connect(database) as connection:  # a writer that skipped the product's checks
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            connection.execute("INSERT INTO ads VALUES ('ad-9', 'c-1', 'adv-1', 'USD')")
        connection.rollback()
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            connection.execute("INSERT INTO ads VALUES ('ad-9', 'c-1', 'adv-2', 'USD')")
    assert store.current().version == 0 and "ad-9" not in CatalogDatabase(database).current()


def test_a_change_in_the_past_is_refused_against_now_read_under_the_lock(database: str) -> None:
    store = CatalogDatabase(database)
    store.start(_catalog())
    with pytest.raises(CatalogError, match="in the past"):
        store.change(AdChange("ad-1", NOW - 1, 1), clock=lambda: NOW)
    assert CatalogDatabase(database).changes()[-1].kind == "start"


def test_a_new_catalog_replaces_one_without_history_only_and_readers_see_the_new_one(database: str) -> None:
    writer, reader = CatalogDatabase(database), CatalogDatabase(database)
    writer.start(_catalog())
    assert len(reader.current()) == 3
    with pytest.raises(CatalogError, match="--force"):
        writer.start(generate_catalog(1, 1, 5, seed=1))
    writer.start(generate_catalog(1, 1, 5, seed=1), replace=True)
    assert reader.current() == generate_catalog(1, 1, 5, seed=1)  # same version 0, another generation
    writer.change(AdChange("adv-0000-cmp-000-ad-001", NOW, 1), clock=lambda: NOW)
    with pytest.raises(CatalogError, match="history of changes"):
        writer.start(_catalog(), replace=True)
    with pytest.raises(CatalogError, match="already holds a catalog"):
        writer.load(_catalog(), [])


def test_a_data_folders_catalog_file_is_taken_in_once_with_its_change_log(tmp_path: Path, database: str) -> None:
    """A data folder as an earlier release left it: the catalog file with its history, and its change log's lines."""
    path = tmp_path / "catalog.json"
    ana, bo = MadeBy("ana", "command"), MadeBy("bo", "api")
    v1 = _catalog().with_change(AdChange("ad-2", NOW + 5, 800_000), NOW)
    v2 = v1.with_budget("c-1", NOW + 6, 2_000_000, NOW, made_by=bo)
    save_catalog(v2, path)
    lines = [
        describe_change(v1, 1, Provenance(NOW, ana)).to_json(),
        describe_change(v2, 2, Provenance(NOW, bo)).to_json(),
    ]
    (tmp_path / "catalog-changes.jsonl").write_text("\n".join(lines) + "\n")

    store = CatalogDatabase(database, imports=path)
    assert store.current() == v2
    log = store.changes()
    assert [(e.version, e.kind, e.who, e.recorded) for e in log] == [
        (0, "start", None, False),  # before the log's first line: read from the catalog, its author unknown
        (1, "set-price", "ana", True),
        (2, "set-budget", "bo", True),
    ]
    assert not path.exists() and (tmp_path / "catalog.json.imported").exists()
    assert (tmp_path / "catalog-changes.jsonl.imported").exists()
    assert CatalogDatabase(database, imports=path).current() == v2  # once: nothing left to take in


def test_while_the_database_is_down_a_reader_keeps_its_catalog_and_a_door_fails_in_one_line(
    postgres_server: LocalPostgres, database: str
) -> None:
    store = CatalogDatabase(database)
    store.start(_catalog())
    held = store.current()
    postgres_server.stop()
    try:
        assert store.current() is held
        assert store.behind is not None and "cannot be reached" in store.behind
        with pytest.raises(CatalogError, match="cannot be reached") as refused:
            store.change(AdChange("ad-1", NOW, 1), clock=lambda: NOW)
        assert "\n" not in str(refused.value)
    finally:
        postgres_server.start()
    store.change(AdChange("ad-1", NOW, 1), clock=lambda: NOW)
    assert store.current().version == 1 and store.behind is None


def test_doors_writing_while_the_database_is_killed_lose_no_confirmed_change_and_make_none_twice(
    postgres_server: LocalPostgres, database: str
) -> None:
    """Four doors making 20 changes a second; the server and its sessions killed outright, then started again."""
    CatalogDatabase(database).start(_catalog())
    writers = ChangeWriters(database, rate=20.0, writers=4, ads=10)
    writers.prepare()
    writers.start()
    time.sleep(2)
    pid = postgres_server.process.running_pid()
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    time.sleep(CONNECT_TIMEOUT_S + 2)  # longer than a door waits: some changes are refused
    try:
        postgres_server.start()
    finally:
        time.sleep(2)
        run = writers.stop()
    assert run.refused, "the doors said the database could not be reached while it was down"
    lost, twice = check_confirmed(database, run.confirmed)
    assert len(run.confirmed) > 20 and lost == [] and twice == []
    versions = [c.version for c in run.confirmed]
    assert len(set(versions)) == len(versions)


def test_a_door_that_makes_one_change_reads_only_what_it_is_about_and_is_refused_alike(database: str) -> None:
    """`adbill catalog ...`: its ad, its campaign's ads, an ad of its advertiser and the IP list, not the whole
    catalog; the same rules refuse the same changes."""
    CatalogDatabase(database).start(_catalog())
    made = CatalogDatabase(database).change(AdChange("ad-1", NOW, 600_000), clock=lambda: NOW, scope=Scope(("ad-1",)))
    assert sorted(made.ad_ids) == ["ad-1", "ad-2"], "the ad and its campaign's other ad, not adv-2's"
    assert made.version == 1 and made.price("ad-1", NOW) == (made["ad-1"], 600_000)
    new_ad = Scope(("ad-9",), ("c-2",), ("adv-1",))
    with pytest.raises(CatalogError, match="campaign c-2 belongs to advertiser adv-2, not adv-1"):
        CatalogDatabase(database).change(AdChange("ad-9", NOW, 1, "c-2", "adv-1", "EUR"), lambda: NOW, scope=new_ad)
    with pytest.raises(CatalogError, match="bills in EUR"):
        CatalogDatabase(database).change(
            AdChange("ad-9", NOW, 1, "c-9", "adv-1", "USD"), lambda: NOW, scope=Scope(("ad-9",), ("c-9",), ("adv-1",))
        )
    ranges = CatalogDatabase(database)
    ranges.change(ExclusionSetting("10.0.0.0/8", NOW, True), clock=lambda: NOW, scope=Scope())
    with pytest.raises(CatalogError, match="already excluded"):
        CatalogDatabase(database).change(ExclusionSetting("10.0.0.0/8", NOW, True), lambda: NOW, scope=Scope())
    whole = CatalogDatabase(database).current()
    assert whole.version == 2 and len(whole) == 3 and whole["ad-1"].price_at(NOW) == 600_000
