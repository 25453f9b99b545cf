"""`adbill catalog`: create an ad, set, pause and resume its price, show its history, on the catalog's database;
each refusal is one line on stderr and a non-zero exit, and changes nothing; a change that waits for another
writer's lock (the head row's) takes effect when it is made, and a new catalog never replaces one with a history."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from billing.catalog import Ad, AdChange, Catalog, Unbillable
from billing.layout import DataLayout
from billing.store.catalog_db import CatalogDatabase
from ops.cli import main
from tests.catalog_rows import catalog_rows, command_home

pytestmark = pytest.mark.integration

BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "USD")])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: str) -> Path:
    """The commands' data folder, and their database (a test's own) holding BASE."""
    return command_home(tmp_path, monkeypatch, database, BASE)


@pytest.fixture
def store(home: Path, database: str) -> CatalogDatabase:
    """The catalog's database, as another process (the web UI, the stream) reads and changes it."""
    return CatalogDatabase(database)


def test_the_commands_change_the_history_and_show_it(
    store: CatalogDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    soon = int(time.time() * 1000) + 3_600_000
    assert main(["catalog", "create-ad", "ad-9", "--campaign", "cmp-1", "--advertiser", "adv-1", "--currency", "EUR",
                 "--cpc-micros", "70000"]) == 0  # fmt: skip
    assert main(["catalog", "set-price", "ad-1", "--cpc-micros", "1250000", "--at", str(soon)]) == 0
    assert main(["catalog", "pause", "ad-2"]) == 0
    assert main(["catalog", "resume", "ad-2", "--at", str(soon)]) == 0
    catalog = store.current()
    assert catalog.version == 4
    assert catalog.price("ad-1", soon - 1)[1] == 250_000  # type: ignore[index]
    assert catalog.price("ad-1", soon)[1] == 1_250_000  # type: ignore[index]
    assert catalog.price("ad-2", soon - 1) == Unbillable.AD_PAUSED
    assert catalog.price("ad-2", soon)[1] == 1_000_000  # type: ignore[index]
    assert catalog.price("ad-9", soon)[1] == 70_000  # type: ignore[index]
    assert [e.kind for e in store.changes()] == ["start", "create-ad", "set-price", "pause", "resume"]
    capsys.readouterr()
    assert main(["catalog", "history", "ad-1"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].split("\t") == ["ad-1", "campaign cmp-1", "advertiser adv-1", "EUR"]
    assert shown[1] == "from the beginning: 0.250000 EUR (version 0)"
    assert shown[2].endswith(": 1.250000 EUR (version 2)")
    assert main(["catalog", "show"]) == 0
    assert "ad-2\tcmp-2\tadv-2\tpaused" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set-price", "ad-1", "--cpc-micros", "5", "--at", "2020-01-01T00:00Z"], "is in the past"),
        (["set-price", "ad-1", "--cpc-micros=-5"], "must not be negative"),
        (["set-price", "ad-1", "--cpc-micros", "0.25"], "whole number of micros"),
        (["set-price", "ad-1", "--cpc-micros", "5", "--advertiser", "adv-2"], "never change"),
        (["set-price", "ad-1", "--cpc-micros", "5", "--campaign", "cmp-2"], "never change"),
        (["set-price", "ad-1", "--cpc-micros", "5", "--currency", "USD"], "never change"),
        (["set-price", "ad-nope", "--cpc-micros", "5"], "unknown ad ad-nope"),
        (["pause", "ad-nope"], "unknown ad ad-nope"),
        (["history", "ad-nope"], "unknown ad ad-nope"),
        (["create-ad", "ad-9", "--campaign", "cmp-2", "--advertiser", "adv-1", "--currency", "EUR",
          "--cpc-micros", "5"], "campaign cmp-2 belongs to advertiser adv-2"),
        (["create-ad", "ad-1", "--campaign", "cmp-1", "--advertiser", "adv-1", "--currency", "EUR",
          "--cpc-micros", "5"], "exists already"),
        (["create-ad", "ad-9", "--campaign", "cmp-9", "--advertiser", "adv-1", "--currency", "JPY",
          "--cpc-micros", "5000000"], "advertiser adv-1 bills in EUR"),
        (["set-price"], "needs the ad's id"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_change_nothing(
    home: Path, database: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    before = catalog_rows(database)
    assert main(["catalog", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("adbill catalog: error: ")
    assert catalog_rows(database) == before


def _hold_the_lock_while(
    store: CatalogDatabase, command: list[str], hold_s: float, during: AdChange | None = None
) -> tuple[int, int]:
    """Run `adbill catalog COMMAND` while another writer (the admin page, say) holds the catalog's lock (the head
    row's) for `hold_s`, making the change `during` under it when one is given; (the command's exit code, when the
    lock was released, epoch ms)."""
    held, released_ms = threading.Event(), []

    def clock() -> int:  # read under the lock: the other writer holds it while this sleeps
        held.set()
        time.sleep(hold_s)
        released_ms.append(int(time.time() * 1000))
        return 0

    def other_writer() -> None:
        if during is not None:
            store.change(during, clock, backfill=True)
            return
        with store.locked():
            clock()

    writer = threading.Thread(target=other_writer)
    writer.start()
    assert held.wait(10)
    code = main(["catalog", *command])  # in the main thread: the command handles signals
    writer.join(30)
    return code, released_ms[0]


def test_a_change_that_waits_for_the_lock_takes_effect_when_it_is_made_not_when_it_was_asked(
    store: CatalogDatabase,
) -> None:
    code, released_ms = _hold_the_lock_while(store, ["set-price", "ad-1", "--cpc-micros", "400000"], 1.0)
    assert code == 0
    entry = store.current()["ad-1"].prices[-1]
    assert entry.cpc_micros == 400_000
    # "Now" is read under the lock: the change cannot take effect before the moment it could be made.
    assert entry.effective_from >= released_ms - 5, (entry.effective_from, released_ms)


def test_generate_force_refuses_to_replace_a_catalog_with_a_history(
    store: CatalogDatabase, database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["catalog", "set-price", "ad-1", "--cpc-micros", "300000"]) == 0
    before = catalog_rows(database)
    capsys.readouterr()
    assert main(["catalog", "generate", "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("adbill catalog: error: ")
    assert "history" in err and "version 1" in err and "set-price" in err
    assert catalog_rows(database) == before


def test_generate_force_waits_for_the_lock_and_sees_a_change_made_meanwhile(
    store: CatalogDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admin's change made while `generate --force` waits is never lost under a regenerated catalog."""
    code, _ = _hold_the_lock_while(store, ["generate", "--force"], 0.5, AdChange("ad-1", 0, 350_000))
    assert code == 1 and "history" in capsys.readouterr().err
    catalog = CatalogDatabase(store.url).current()
    assert catalog.version == 1 and catalog["ad-1"].prices[-1].cpc_micros == 350_000
    assert [e.kind for e in store.changes()] == ["start", "set-price"]


def test_generate_force_replaces_a_catalog_that_was_never_changed_nor_billed(store: CatalogDatabase) -> None:
    assert main(["catalog", "generate", "--force", "--advertisers", "2", "--campaigns", "1", "--ads", "1"]) == 0
    catalog = store.current()
    assert len(catalog) == 2 and catalog.version == 0
    assert {ad.ad_id for ad in catalog}.isdisjoint({"ad-1", "ad-2"})


def test_generate_force_refuses_a_catalog_the_stream_has_priced_with(
    home: Path, store: CatalogDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    versions = DataLayout(home).catalog_versions
    versions.mkdir(parents=True)
    (versions / "0").write_text("0")
    assert main(["catalog", "generate", "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "priced" in err
    assert store.current() == BASE
