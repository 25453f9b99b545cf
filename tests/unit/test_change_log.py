"""The catalog's change log: one entry per change with who made it, when and through which door, kept by the
catalog's store under its lock; two processes changing prices at once leave two entries."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from billing.budgets import BudgetChange
from billing.catalog import Ad, AdChange, Catalog, MadeBy
from billing.change_log import ChangeEntry, ChangeFilter, describe_change, filtered, merge_log
from billing.store.catalog_file import CatalogStore, save_catalog
from ops.cli import main

T0 = 1_767_225_600_000
BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD")])


def test_every_kind_of_change_is_read_from_the_entry_it_made(tmp_path: Path) -> None:
    store = CatalogStore(tmp_path / "catalog.json")
    store.start(BASE, made_by=MadeBy("ops", "command"))
    ada, api = MadeBy("ada", "page"), MadeBy("ada", "api 3f2a9c0e1b7d")
    store.change(AdChange("ad-9", T0, 70_000, "cmp-1", "adv-1", "EUR"), lambda: T0, made_by=ada)
    store.change(AdChange("ad-1", T0 + 10, 1_250_000), lambda: T0, made_by=api)
    store.change(AdChange("ad-2", T0 + 20, None), lambda: T0, made_by=ada)
    store.change(AdChange("ad-2", T0 + 30, 900_000), lambda: T0, made_by=MadeBy("ops", "replay"), backfill=True)
    store.update(lambda c, now: c.with_budget("cmp-1", T0 + 40, 5_000_000, now), lambda: T0, made_by=ada)
    store.update(lambda c, now: c.with_exclusion("203.0.113.0/24", T0 + 50, True, now), lambda: T0, made_by=ada)
    store.update(lambda c, now: c.with_exclusion("203.0.113.0/24", T0 + 60, False, now), lambda: T0, made_by=ada)
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
    assert len((tmp_path / "catalog-changes.jsonl").read_text().splitlines()) == 8
    # Recorded history that takes effect before it was made is a back-fill.
    store.change(AdChange("ad-1", T0 - 60_000, 1_300_000), lambda: T0, made_by=MadeBy("ops", "replay"), backfill=True)
    assert store.changes()[-1].backfill and store.changes()[-1].effective_from == T0 - 60_000
    picked = filtered(log, ChangeFilter(who="ada", kind="set-price"))
    assert [e.version for e in picked] == [2]
    assert [e.version for e in filtered(log, ChangeFilter(advertiser_id="adv-2"))] == [4, 3]
    assert [e.version for e in filtered(log, ChangeFilter(door="replay", since_ms=T0, until_ms=T0 + 1))] == [4]


def test_a_change_without_a_line_is_shown_as_not_recorded_and_a_torn_line_spoils_nothing(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    catalog = BASE.with_change(AdChange("ad-1", T0, 5), T0)  # version 1, made before the log existed
    save_catalog(catalog, path)
    store = CatalogStore(path)
    (tmp_path / "catalog-changes.jsonl").write_text('{"version": 9, "kind": "set-pr')  # a write torn by a crash
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


def _change_prices(path: str, who: str, price: int, start: float) -> None:
    time.sleep(max(0.0, start - time.time()))  # both at once
    CatalogStore(path).change(AdChange("ad-1", int(time.time() * 1000) + 60_000, price), made_by=MadeBy(who, "page"))


def test_two_processes_changing_prices_at_once_leave_two_entries(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    save_catalog(BASE, path)
    start = time.time() + 1.0
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_change_prices, args=(str(path), who, price, start))
        for who, price in (("ada", 7), ("bo", 8))
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    log = CatalogStore(path).changes()
    made = [(e.version, e.who, e.cpc_micros) for e in log if e.recorded]
    assert [v for v, _, _ in made] == [1, 2]
    assert sorted((who, price) for _, who, price in made) == [("ada", 7), ("bo", 8)]
    lines = (tmp_path / "catalog-changes.jsonl").read_text().splitlines()
    assert len(lines) == 2


def test_a_command_records_the_operating_system_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(tmp_path))
    monkeypatch.setenv("USER", "operator-7")
    monkeypatch.setenv("LOGNAME", "operator-7")
    save_catalog(BASE, tmp_path / "catalog.json")
    assert main(["catalog", "pause", "ad-2"]) == 0
    (entry,) = [e for e in CatalogStore(tmp_path / "catalog.json").changes() if e.recorded]
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


def test_the_start_counts_the_ads_the_catalog_started_with_not_those_added_since(tmp_path: Path) -> None:
    """A catalog whose start the log does not hold (written before the log existed) reads version 0 from the
    catalog: the ads it started with, not today's."""
    path = tmp_path / "catalog.json"
    grown = BASE.with_change(AdChange("ad-new", T0, 5, "cmp-1", "adv-1", "EUR"), T0)
    save_catalog(grown, path)
    start = CatalogStore(path).changes()[0]
    assert (start.kind, start.ads, start.recorded) == ("start", len(BASE), False) and len(grown) == len(BASE) + 1
