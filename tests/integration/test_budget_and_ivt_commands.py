"""`adbill catalog set-budget|budgets` and `adbill ivt exclude|include|list`: a campaign's daily budget and the IP
exclusion list change through the catalog's one store, its database (`CatalogDatabase.change`: the head row's lock,
its versions, its refusals); each change says who made it and through which door; each refusal is one line on stderr
and a non-zero exit, and changes nothing."""

from __future__ import annotations

import getpass
import threading
import time
from pathlib import Path

import pytest

from billing.catalog import Ad, Catalog, ExclusionSetting
from billing.store.catalog_db import CatalogDatabase
from ops.cli import main
from tests.catalog_rows import catalog_rows, command_home

pytestmark = pytest.mark.integration

BASE = Catalog([Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR"), Ad("ad-2", "cmp-2", "adv-2", 1_000_000, "JPY")])
HOUR_MS = 3_600_000


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: str) -> Path:
    """The commands' data folder, and their database (a test's own) holding BASE."""
    return command_home(tmp_path, monkeypatch, database, BASE)


@pytest.fixture
def store(home: Path, database: str) -> CatalogDatabase:
    """The catalog's database, as another process (the web UI, the stream) reads and changes it."""
    return CatalogDatabase(database)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_set_budget_from_now_and_later_and_show_the_history(
    store: CatalogDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    soon = now_ms() + HOUR_MS
    before = now_ms()
    assert main(["catalog", "set-budget", "cmp-1", "--daily-micros", "50000000"]) == 0
    assert main(["catalog", "set-budget", "cmp-1", "--unlimited", "--at", str(soon)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("set-budget: cmp-1 from ") and "50.000000 EUR a day (version 1, by " in out[0]
    assert f"unlimited (version 2, by {getpass.getuser()} (command) at " in out[1]
    assert out[1].endswith("(catalog version 2)")
    catalog = store.current()
    first, second = catalog.budget_history("cmp-1")
    assert before <= first.effective_from <= now_ms() and first.daily_budget_micros == 50_000_000
    assert (second.effective_from, second.daily_budget_micros, second.version) == (soon, None, 2)
    # Who made it, through which door, and when (under the lock): docs/billing-rules.md, "Who sees what".
    assert (first.made_by, first.door) == (getpass.getuser(), "command")
    assert first.made_at == first.effective_from  # no --at: from the moment it was made
    assert catalog.budget_at("cmp-1", soon - 1) == 50_000_000 and catalog.budget_at("cmp-1", soon) is None
    assert catalog.budget_at("cmp-2", soon) is None  # never set: unlimited

    # A change from now, made after one planned later, says the entry it made (not the latest in time).
    assert main(["catalog", "set-budget", "cmp-1", "--daily-micros", "60000000"]) == 0
    assert "60.000000 EUR a day (version 3, by " in capsys.readouterr().out
    assert main(["catalog", "budgets"]) == 0
    assert capsys.readouterr().out.splitlines() == ["cmp-1\tadv-1\t60.000000 EUR a day", "cmp-2\tadv-2\tunlimited"]
    assert main(["catalog", "budgets", "cmp-1"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "cmp-1\tadvertiser adv-1\tEUR"
    assert "50.000000 EUR a day (version 1" in shown[1] and "60.000000 EUR a day (version 3" in shown[2]
    assert "unlimited (version 2" in shown[3]
    assert main(["catalog", "budgets", "cmp-2"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "unlimited since the beginning (no budget was ever set)"


def test_a_backfilled_budget_takes_effect_in_the_past_only_when_asked(store: CatalogDatabase) -> None:
    assert main(["catalog", "set-budget", "cmp-2", "--daily-micros", "900000000", "--at", "2026-01-01T00:00Z",
                 "--backfill"]) == 0  # fmt: skip
    catalog = store.current()
    assert catalog.budget_at("cmp-2", 1_767_225_600_000) == 900_000_000
    assert catalog.budget_at("cmp-2", 1_767_225_599_999) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # An effective time in the past, without --backfill: a budget changes from now on.
        (["set-budget", "cmp-1", "--daily-micros", "5", "--at", "2020-01-01T00:00Z"], "is in the past"),
        (["set-budget", "cmp-1", "--daily-micros=-5"], "a daily budget must not be negative, got -5"),
        (["set-budget", "cmp-1", "--daily-micros", "2.5"], "a daily budget is a whole number of micros"),
        (["set-budget", "cmp-1", "--daily-micros", str(2**63)], "must fit in 63 bits"),
        (["set-budget", "cmp-1"], "set-budget cmp-1: give the daily budget in micros, or unlimited"),
        (["set-budget", "cmp-1", "--daily-micros", "5", "--unlimited"], "in micros or unlimited, not both"),
        (["set-budget", "cmp-nope", "--daily-micros", "5"], "unknown campaign cmp-nope"),
        (["set-budget", "--daily-micros", "5"], "set-budget needs the campaign's id"),
        (["set-budget", "cmp-1", "--cpc-micros", "5"], "not --cpc-micros"),
        (["budgets", "cmp-nope"], "unknown campaign cmp-nope"),
    ],
)
def test_budget_refusals_are_one_line_and_change_nothing(
    home: Path, database: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    before = catalog_rows(database)
    assert main(["catalog", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("adbill catalog: error: "), err
    assert catalog_rows(database) == before


def test_exclude_include_and_list_the_ip_ranges(store: CatalogDatabase, capsys: pytest.CaptureFixture[str]) -> None:
    soon = now_ms() + HOUR_MS
    assert main(["ivt", "exclude", "203.0.113.0/24"]) == 0
    assert main(["ivt", "exclude", "2001:db8::/32", "--at", str(soon)]) == 0
    assert main(["ivt", "include", "203.0.113.0/24", "--at", str(soon)]) == 0
    made = capsys.readouterr().out.splitlines()
    assert made[0].startswith("exclude: 203.0.113.0/24 excluded from ") and made[0].endswith("(catalog version 1)")
    assert made[2].startswith("include: 203.0.113.0/24 no longer excluded from ")
    exclusions = store.current().exclusions
    assert exclusions.excluding("203.0.113.9", soon - 1) == "203.0.113.0/24"
    assert exclusions.excluding("203.0.113.9", soon) is None
    assert exclusions.excluding("2001:db8::1", soon - 1) is None
    assert exclusions.excluding("2001:db8::1", soon) == "2001:db8::/32"
    assert {(c.made_by, c.door) for c in exclusions.changes} == {(getpass.getuser(), "command")}

    assert main(["ivt", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 1 and listed[0].startswith("203.0.113.0/24 excluded from ")
    assert main(["ivt", "list", "--at", str(soon), "--history"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("2001:db8::/32 excluded from ")
    assert [line.split("\t")[0] for line in listed[1:]] == ["history"] * 3
    assert main(["ivt", "list", "--at", "2020-01-01T00:00Z"]) == 0
    assert "no IP range is excluded at 2020-01-01T00:00:00.000Z" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["exclude", "203.0.113.0/24", "--at", "2020-01-01T00:00Z"], "is in the past"),
        (["exclude", "203.0.113.7/24"], "203.0.113.7/24 has host bits set: the range is 203.0.113.0/24"),
        (["exclude", "not-a-range"], "'not-a-range' is not an IP range"),
        (["exclude"], "ivt exclude needs an IP range"),
        (["include", "198.51.100.0/24"], "range 198.51.100.0/24 is not excluded at"),
        (["exclude", "192.0.2.0/24"], "range 192.0.2.0/24 is already excluded at"),
        (["list", "192.0.2.0/24"], "ivt list takes no range"),
    ],
)
def test_exclusion_refusals_are_one_line_and_change_nothing(
    store: CatalogDatabase, database: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    store.change(ExclusionSetting("192.0.2.0/24", 0, True), lambda: 0, backfill=True)
    before = catalog_rows(database)
    assert main(["ivt", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("adbill ivt: error: "), err
    assert catalog_rows(database) == before


def test_budget_and_exclusion_changes_share_the_catalogs_lock_and_versions(store: CatalogDatabase) -> None:
    """A change that waits for the lock (another writer: the admin page) takes effect when it is made, and every
    kind of change takes the next version of the one catalog."""
    assert main(["catalog", "set-price", "ad-1", "--cpc-micros", "300000"]) == 0
    for command in (["catalog", "set-budget", "cmp-1", "--daily-micros", "7000000"], ["ivt", "exclude", "10.0.0.0/8"]):
        held, released_ms = threading.Event(), []

        def other_writer(held: threading.Event = held, released_ms: list[int] = released_ms) -> None:
            with store.locked():
                held.set()
                time.sleep(0.6)
                released_ms.append(now_ms())

        writer = threading.Thread(target=other_writer)
        writer.start()
        assert held.wait(10)
        assert main(command) == 0
        writer.join(30)
        catalog = store.current()
        entry = catalog.budget_history("cmp-1")[-1] if command[0] == "catalog" else catalog.exclusions.changes[-1]
        assert entry.effective_from >= released_ms[0] - 5, (entry, released_ms)
    catalog = store.current()
    assert catalog.version == 3
    assert catalog.budget_history("cmp-1")[-1].version == 2 and catalog.exclusions.version == 3
