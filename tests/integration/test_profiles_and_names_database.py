"""The billing profiles (`billing.store.profiles_db`) and the names of campaigns and ads (`billing.store.names_db`) in
PostgreSQL, on the real server: a profile changes from now on with its history kept, a reader reads by version,
concurrent writers lose nothing, a data folder's old files are taken in once, and a page's names go on while the
database is down."""

from __future__ import annotations

import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from billing.names import Names, NamingError
from billing.profiles import BillingProfile, BillingProfiles, ProfileError, profile_change
from billing.store.database import DatabaseUnavailable, connection_pool
from billing.store.names_db import READ_TIMEOUT_S, NamesDatabase
from billing.store.profiles_db import ProfileDatabase
from ops.process import free_port

pytestmark = pytest.mark.integration

JAN = 1_767_225_600_000  # 2026-01-01T00:00Z
FEB = 1_769_904_000_000  # 2026-02-01T00:00Z
HOUR = 3_600_000


# --- Billing profiles ---------------------------------------------------------------------------------------


def test_a_profile_is_kept_with_history_and_changes_from_now_on(database: str) -> None:
    store = ProfileDatabase(database)
    first = store.change(lambda now: profile_change("adv-1", "Acme", "1 Main St\nParis", "FR1", "20", now), lambda: JAN)
    later = profile_change("adv-1", "Acme SA", "2 Rue\nLyon", "FR1", "5.5", FEB)
    second = store.change(lambda now: later, lambda: JAN + HOUR)
    profiles = store.current()
    assert (first.version, second.version, second.made_at) == (1, 2, JAN + HOUR)
    assert profiles.in_force("adv-1", FEB - 1) == first  # the month's end: January's profile
    assert profiles.in_force("adv-1", FEB) == second
    assert profiles.in_force("adv-1", JAN - 1) is None
    with pytest.raises(ProfileError, match="before now"):
        store.change(lambda now: profile_change("adv-1", "X", "Y", "", "1", JAN), lambda: JAN + HOUR)
    with pytest.raises(ProfileError, match="already has a profile from"):
        store.change(lambda now: profile_change("adv-1", "X", "Y", "", "1", FEB), lambda: JAN + HOUR)
    with pytest.raises(ProfileError, match="needs a name"):
        store.change(lambda now: profile_change("adv-1", " ", "Y", "", "1", now), lambda: JAN + HOUR)
    again = ProfileDatabase(database).current()
    assert again.to_json() == profiles.to_json()  # refused changes leave every row as it was


def test_a_reader_of_profiles_reads_one_row_when_nothing_changed_and_only_the_new_entries_when_it_moved(
    database: str,
) -> None:
    writer, reader = ProfileDatabase(database), ProfileDatabase(database)
    assert reader.current().version == 0 and reader.current().advertiser_ids == []
    writer.change(lambda now: profile_change("adv-1", "Acme", "Paris", "", "20", now), lambda: JAN)
    held = reader.current()
    assert reader.current() is held  # nothing changed: the head row alone, and the history held
    writer.change(lambda now: profile_change("adv-2", "Beta", "Rome", "", "22", now), lambda: JAN + 1)
    moved = reader.current()
    assert moved.version == 2 and moved.advertiser_ids == ["adv-1", "adv-2"]
    assert moved.history("adv-1")[0] is held.history("adv-1")[0]  # an entry held is not read again
    assert moved.to_json() == ProfileDatabase(database).current().to_json()


def asked(entry: BillingProfile, now_ms: int) -> BillingProfile:
    """A request that asks for `entry` whatever the time."""
    return entry


def test_concurrent_profile_writers_lose_nothing_and_leave_no_gap(database: str) -> None:
    errors: list[BaseException] = []
    won: list[int] = []

    def write(number: int) -> None:
        store = ProfileDatabase(database)
        try:
            for i in range(10):
                entry = profile_change("adv-1", f"w{number}-{i}", "A", "", "19", JAN + number * 100 + i)
                store.change(partial(asked, entry), lambda: JAN)
            try:  # every writer asks for the same time of one advertiser: one wins, the others are refused
                store.change(lambda now: profile_change("adv-2", f"w{number}", "A", "", "19", FEB), lambda: JAN)
                won.append(number)
            except ProfileError:
                pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(won) == 1
    profiles = ProfileDatabase(database).current()
    assert profiles.version == 41
    entries = [e for a in profiles.advertiser_ids for e in profiles.history(a)]
    assert sorted(e.version for e in entries) == list(range(1, 42))
    assert {e.name for e in profiles.history("adv-1")} == {f"w{n}-{i}" for n in range(4) for i in range(10)}
    assert [e.name for e in profiles.history("adv-2")] == [f"w{won[0]}"]


# --- Names --------------------------------------------------------------------------------------------------


def test_a_name_is_set_changed_and_removed_and_refused_when_too_long(database: str) -> None:
    store = NamesDatabase(database)
    assert store.current() == Names() and store.version() == 0
    assert store.set("campaign", "cmp-1", "  Winter \n sale ") == "Winter sale"
    store.set("ad", "ad-1", "Banner")
    store.set("ad", "ad-2", "Tower")
    store.set("ad", "ad-2", "Tower")  # the same name again changes nothing
    assert store.version() == 3
    assert store.current() == Names({"cmp-1": "Winter sale"}, {"ad-1": "Banner", "ad-2": "Tower"})
    store.set("ad", "ad-1", "")
    store.set("ad", "ad-9", "")  # no name to remove: nothing changes
    assert store.version() == 4
    with pytest.raises(NamingError, match="at most 120"):
        store.set("ad", "ad-2", "x" * 121)
    with pytest.raises(NamingError, match="not to a 'advertiser'"):
        store.set("advertiser", "adv-1", "Acme")
    assert NamesDatabase(database).current() == Names({"cmp-1": "Winter sale"}, {"ad-2": "Tower"})
    assert store.named("campaign") == {"cmp-1": "Winter sale"}
    assert store.names_of("ad", ["ad-1", "ad-2", "ad-3"]) == {"ad-2": "Tower"}


def test_a_reader_of_names_reads_by_version_and_a_page_reads_only_the_names_it_shows(database: str) -> None:
    writer, reader, page = NamesDatabase(database), NamesDatabase(database), NamesDatabase(database)
    for n in range(50):
        writer.set("ad", f"ad-{n}", f"Ad {n}")
    held = reader.current()
    assert reader.current() is held  # nothing changed: the head row alone
    writer.set("ad", "ad-3", "Third")
    writer.set("ad", "ad-4", "")
    moved = reader.current()
    assert moved.ads["ad-3"] == "Third" and "ad-4" not in moved.ads and len(moved.ads) == 49

    assert page.shown("ad", ["ad-1", "ad-3", "ad-4"]) == {"ad-1": "Ad 1", "ad-3": "Third"}
    assert len(page._known) == 3  # noqa: SLF001 - the names a page showed, not every name
    writer.set("ad", "ad-1", "First")
    assert page.name_of("ad", "ad-1", check=False) == "Ad 1"  # within one request: the names as it started
    assert page.name_of("ad", "ad-1") == "First"  # the next request: brought up to date by version
    page.set("ad", "ad-2", "Second")
    assert page.name_of("ad", "ad-2", check=False) == "Second"  # the worker that set it shows it at once


def test_concurrent_name_writers_lose_nothing(database: str) -> None:
    errors: list[BaseException] = []

    def write(number: int) -> None:
        store = NamesDatabase(database)
        try:
            for i in range(25):
                store.set("ad", f"ad-{number}-{i}", f"Ad {number}/{i}")
                if i == 12:
                    store.set("campaign", "cmp-shared", f"Writer {number}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    names = NamesDatabase(database).current()
    assert names.ads == {f"ad-{n}-{i}": f"Ad {n}/{i}" for n in range(4) for i in range(25)}
    assert names.campaigns["cmp-shared"] in {f"Writer {n}" for n in range(4)}
    assert NamesDatabase(database).version() == 104  # one version per change, no gap


# --- A data folder written before the database ----------------------------------------------------------------


def test_a_data_folders_profiles_and_names_files_are_taken_in_once(tmp_path: Path, database: str) -> None:
    """A data folder as an earlier release left it: `billing-profiles.json` (as `ProfileFile` wrote it: the
    history's JSON) and `names.json`."""
    profiles = (
        BillingProfiles()
        .with_profile(profile_change("adv-1", "Acme", "1 Main St\nParis", "FR1", "20", JAN), JAN)
        .with_profile(profile_change("adv-1", "Acme SA", "2 Rue\nLyon", "FR1", "5.5", FEB), JAN + 1)
        .with_profile(profile_change("adv-2", "Kabushiki Kaisha", "Tokyo", "T1", "10", JAN + 2), JAN + 2)
    )
    profiles_file, names_file = tmp_path / "billing-profiles.json", tmp_path / "names.json"
    profiles_file.write_text(profiles.to_json(), encoding="utf-8")
    names = {"campaigns": {"cmp-1": "Winter sale"}, "ads": {"ad-1": "Banner", "ad-2": "Tour Eiffel ✓"}}
    names_file.write_text(json.dumps(names, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    taken = ProfileDatabase(database, imports=profiles_file).current()
    assert taken.to_json() == profiles.to_json()
    assert NamesDatabase(database, imports=names_file).current() == Names(names["campaigns"], names["ads"])
    assert not profiles_file.exists() and not names_file.exists()
    assert (tmp_path / "billing-profiles.json.imported").read_text(encoding="utf-8") == profiles.to_json()
    assert json.loads((tmp_path / "names.json.imported").read_text(encoding="utf-8")) == names

    # Once: the next change follows the history taken in, and another folder's files meet a database that holds
    # profiles and names already: they are left where they are, and nothing changes.
    kept = ProfileDatabase(database).change(
        lambda now: profile_change("adv-2", "KK", "Osaka", "T1", "10", now), lambda: FEB
    )
    assert kept.version == 4
    other = tmp_path / "other"
    other.mkdir()
    (other / "billing-profiles.json").write_text(BillingProfiles().to_json(), encoding="utf-8")
    (other / "names.json").write_text(json.dumps({"campaigns": {}, "ads": {"ad-1": "Other"}}), encoding="utf-8")
    assert ProfileDatabase(database, imports=other / "billing-profiles.json").current().version == 4
    assert NamesDatabase(database, imports=other / "names.json").current().ads["ad-1"] == "Banner"
    assert (other / "billing-profiles.json").exists() and (other / "names.json").exists()


# --- The database down ----------------------------------------------------------------------------------------


def test_with_the_database_down_a_page_shows_the_names_it_knows_and_a_change_fails_in_one_line() -> None:
    url = f"postgresql://adbill:hunter2@127.0.0.1:{free_port()}/ads"
    store = NamesDatabase(url)
    started = time.monotonic()
    assert store.shown("ad", ["ad-1", "ad-2"]) == {}
    assert store.name_of("ad", "ad-1") == ""  # asked again at once: the database is tried again only later
    assert time.monotonic() - started < READ_TIMEOUT_S + 3
    assert store.behind is not None and "cannot be reached" in store.behind and "hunter2" not in store.behind
    with pytest.raises(DatabaseUnavailable, match="the names' database .* cannot be reached") as caught:
        store.set("ad", "ad-1", "x")
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)
    connection_pool(url).close()  # its attempts to connect end with the test


def test_a_taken_in_file_is_set_aside_only_once_its_rows_committed(tmp_path: Path, database: str) -> None:
    """A take-in that fails leaves the file where it was (the next process takes it in); one that commits sets it
    aside after the commit, never before (`billing.store.database.Tables`)."""
    from billing.store import database as db

    old = tmp_path / "old.json"
    old.write_text("{}", encoding="utf-8")
    seen_during: list[bool] = []

    def failing(connection: object) -> list[Path]:
        raise ValueError("cannot take in old.json: not a file of this kind")

    def taking(connection: Any) -> list[Path]:
        connection.execute("CREATE TABLE taken (one int)")
        seen_during.append(old.exists())
        return [old]

    with pytest.raises(ValueError, match="cannot take in"), db.connection(database, db.Tables("t1", "", failing)):
        pass
    assert old.exists() and not (tmp_path / "old.json.imported").exists()
    with db.connection(database, db.Tables("t2", "SELECT 1", taking)) as connection:
        assert connection.execute("SELECT count(*) FROM taken").fetchone() == (0,)
    assert seen_during == [True], "the file is still in place while its rows are being written"
    assert not old.exists() and (tmp_path / "old.json.imported").read_text(encoding="utf-8") == "{}"
