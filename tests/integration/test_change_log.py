"""The catalog's change log: one entry per change with who made it, when and through which door, kept by the
catalog's database (a row written in the change's own transaction, under the head row's lock); a data folder's log
written before the database is taken in with its catalog; two processes changing prices at once leave two
entries."""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

import psycopg
import pytest

from billing.budgets import BudgetChange
from billing.catalog import Ad, AdChange, BudgetSetting, Catalog, ExclusionSetting, MadeBy
from billing.change_log import ChangeEntry, ChangeFilter, describe_change, filtered, merge_log
from billing.store.catalog_db import CatalogDatabase
from billing.store.catalog_file import save_catalog
from ops.cli import main

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000
BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD")])


def log_rows(url: str) -> list[tuple[int, str]]:
    """(version, kind) of each row of the change log's table, in the order written."""
    with psycopg.connect(url) as connection:
        return [(int(v), k) for v, k in connection.execute("SELECT version, kind FROM catalog_changes ORDER BY seq")]


def test_every_kind_of_change_is_read_from_the_entry_it_made(database: str) -> None:
    store = CatalogDatabase(database)
    store.start(BASE, made_by=MadeBy("ops", "command"))
    ada, api = MadeBy("ada", "page"), MadeBy("ada", "api 3f2a9c0e1b7d")
    store.change(AdChange("ad-9", T0, 70_000, "cmp-1", "adv-1", "EUR"), lambda: T0, made_by=ada)
    store.change(AdChange("ad-1", T0 + 10, 1_250_000), lambda: T0, made_by=api)
    store.change(AdChange("ad-2", T0 + 20, None), lambda: T0, made_by=ada)
    store.change(AdChange("ad-2", T0 + 30, 900_000), lambda: T0, made_by=MadeBy("ops", "replay"), backfill=True)
    store.change(BudgetSetting("cmp-1", T0 + 40, 5_000_000), lambda: T0, made_by=ada)
    store.change(ExclusionSetting("203.0.113.0/24", T0 + 50, True), lambda: T0, made_by=ada)
    store.change(ExclusionSetting("203.0.113.0/24", T0 + 60, False), lambda: T0, made_by=ada)
    log = store.changes()
    assert [(e.version, e.kind, e.who, e.door_kind) for e in log] == [
        (0, "start", "ops", "command"),
        (1, "create-ad", "ada", "page"),
        (2, "set-price", "ada", "api"),
        (3, "pause", "ada", "page"),
        (4, "resume", "ops", "replay"),
        (5, "set-budget", "ada", "page"),
        (6, "exclude-ip", "ada", "page"),
        (7, "include-ip", "ada", "page"),
    ]
    assert log[2].token_id == "3f2a9c0e1b7d" and log[2].cpc_micros == 1_250_000 and log[2].advertiser_id == "adv-1"
    # Replayed with --backfill but taking effect after it was made (as the simulator's live changes do): no back-fill.
    assert not log[4].backfill and log[5].daily_budget_micros == 5_000_000 and log[5].advertiser_id == "adv-1"
    assert log[6].cidr == "203.0.113.0/24" and all(e.made_at == T0 for e in log[1:])
    assert log_rows(database) == [(e.version, e.kind) for e in log]  # one row per change, written with it
    # Recorded history that takes effect before it was made is a back-fill.
    store.change(AdChange("ad-1", T0 - 60_000, 1_300_000), lambda: T0, made_by=MadeBy("ops", "replay"), backfill=True)
    assert store.changes()[-1].backfill and store.changes()[-1].effective_from == T0 - 60_000
    picked = filtered(log, ChangeFilter(who="ada", kind="set-price"))
    assert [e.version for e in picked] == [2]
    assert [e.version for e in filtered(log, ChangeFilter(advertiser_id="adv-2"))] == [4, 3]
    assert [e.version for e in filtered(log, ChangeFilter(door="replay", since_ms=T0, until_ms=T0 + 1))] == [4]


def test_a_change_without_a_line_is_shown_as_not_recorded_and_a_torn_line_spoils_nothing(
    tmp_path: Path, database: str
) -> None:
    """A data folder written before the database: its catalog and its log, the log's last line torn by a crash,
    taken in when the database is first opened."""
    path = tmp_path / "catalog.json"
    catalog = BASE.with_change(AdChange("ad-1", T0, 5), T0)  # version 1, made before the log existed
    save_catalog(catalog, path)
    (tmp_path / "catalog-changes.jsonl").write_text('{"version": 9, "kind": "set-pr')  # a write torn by a crash
    store = CatalogDatabase(database, imports=path)
    store.change(AdChange("ad-1", T0 + 1, 6), lambda: T0, made_by=MadeBy("ada", "page"))
    log = store.changes()
    assert [(e.version, e.kind, e.recorded, e.who) for e in log] == [
        (0, "start", False, None),
        (1, "set-price", False, None),
        (2, "set-price", True, "ada"),
    ]
    assert describe_change(catalog, 1).cpc_micros == 5
    assert merge_log(Catalog([ad for ad in catalog if ad.ad_id != "ad-1"], 1), [])[-1].kind == "unknown"
    assert ChangeEntry.from_json(log[2].to_json()) == log[2]
    assert not path.exists() and (tmp_path / "catalog.json.imported").exists()
    assert (tmp_path / "catalog-changes.jsonl.imported").exists()
    assert CatalogDatabase(database).changes() == log, "the entries not recorded are kept as such"


def _change_prices(url: str, path: str, who: str, price: int, ready: Barrier) -> None:
    store = CatalogDatabase(url, imports=path)
    ready.wait(60)  # both at once
    store.change(AdChange("ad-1", int(time.time() * 1000) + 60_000, price), made_by=MadeBy(who, "page"))


def test_two_processes_changing_prices_at_once_leave_two_entries(tmp_path: Path, database: str) -> None:
    """Both open the database at once, and the data folder's catalog file is taken in by one of them, once."""
    path = tmp_path / "catalog.json"
    save_catalog(BASE, path)
    # Spawned, not forked: a forked child inherits this process's threads and objects (Kafka clients among them),
    # and one of those collected in the child can abort it.
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(2)
    writers = [
        context.Process(target=_change_prices, args=(database, str(path), who, price, ready))
        for who, price in (("ada", 7), ("bo", 8))
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    log = CatalogDatabase(database).changes()
    made = [(e.version, e.who, e.cpc_micros) for e in log if e.recorded]
    assert [v for v, _, _ in made] == [1, 2]
    assert sorted((who, price) for _, who, price in made) == [("ada", 7), ("bo", 8)]
    assert log_rows(database) == [(0, "start"), (1, "set-price"), (2, "set-price")]


def test_a_command_records_the_operating_system_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: str
) -> None:
    for name in [k for k in os.environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(tmp_path))
    monkeypatch.setenv("ADBILL_DATABASE_URL", database)
    monkeypatch.setenv("USER", "operator-7")
    monkeypatch.setenv("LOGNAME", "operator-7")
    save_catalog(BASE, tmp_path / "catalog.json")  # written before the database: the command takes it in
    assert main(["catalog", "pause", "ad-2"]) == 0
    (entry,) = [e for e in CatalogDatabase(database).changes() if e.recorded]
    assert (entry.who, entry.door, entry.kind, entry.ad_id) == ("operator-7", "command", "pause", "ad-2")


def test_budgets_are_described_with_their_campaign_and_currency() -> None:
    catalog = Catalog(list(BASE), budgets={"cmp-2": [BudgetChange(T0, None, 3)]})
    entry = describe_change(catalog, 3)
    assert (entry.kind, entry.campaign_id, entry.currency, entry.daily_budget_micros) == (
        "set-budget",
        "cmp-2",
        "USD",
        None,
    )


def test_the_start_counts_the_ads_the_catalog_started_with_not_those_added_since(tmp_path: Path, database: str) -> None:
    """A catalog whose start the log does not hold (written before the log existed, then taken into the database)
    reads version 0 from the catalog: the ads it started with, not today's."""
    path = tmp_path / "catalog.json"
    grown = BASE.with_change(AdChange("ad-new", T0, 5, "cmp-1", "adv-1", "EUR"), T0)
    save_catalog(grown, path)
    start = CatalogDatabase(database, imports=path).changes()[0]
    assert (start.kind, start.ads, start.recorded) == ("start", len(BASE), False) and len(grown) == len(BASE) + 1
