"""The web UI's accounts and API tokens in the database (real PostgreSQL, a database of each test's own): scrypt
hashes and only a token's SHA-256 at rest, the generation that sessions remember, refusals, `adbill users`, a reader
that asks one small question and reads again only when something changed, and a data folder written before the
database taken in once (tests/unit/test_web_accounts.py has the password policy)."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import psycopg
import pytest

from ops.cli import main
from ops.settings import Settings
from tests.catalog_rows import catalog_rows
from tests.unit.test_web_accounts import shipped_common_passwords
from tests.web_support import login
from web.access import Role
from web.accounts import AccountError, AccountsDatabase, hash_password
from web.app import create_app
from web.tokens import PREFIX, TokensDatabase

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"


def test_accounts_are_stored_hashed_with_scrypt_in_the_database(database: str) -> None:
    store = AccountsDatabase(database)
    store.add("Alice", Role.ADVERTISER, PASSWORD, "adv-0000")
    rows = catalog_rows(database)
    assert PASSWORD not in json.dumps(rows)
    (saved,) = [json.loads(row) for row in rows["web_accounts"]]
    assert saved["username"] == "alice" and saved["password_hash"].startswith("scrypt:")
    assert saved["role"] == "advertiser" and saved["advertiser_id"] == "adv-0000" and saved["generation"] == 1


def test_authenticate(database: str) -> None:
    store = AccountsDatabase(database)
    store.add("fiona", Role.FINANCE, PASSWORD)
    assert store.authenticate("FIONA", PASSWORD) is not None
    assert store.authenticate("fiona", PASSWORD + "!") is None
    assert store.authenticate("nobody", PASSWORD) is None
    assert store.authenticate("fiona", "x" * 5000) is None
    store.set_disabled("fiona", True)
    assert store.authenticate("fiona", PASSWORD) is None


def test_an_account_logs_in_whatever_work_factor_the_hashes_are_made_with_now(database: str) -> None:
    AccountsDatabase(database, scrypt_n=1_024).add("fiona", Role.FINANCE, PASSWORD)
    later = AccountsDatabase(database, scrypt_n=2_048)  # the setting raised after the account was made
    assert later.get("fiona").password_hash.startswith("scrypt:1024:8:1$")  # type: ignore[union-attr]
    assert later.authenticate("fiona", PASSWORD) is not None
    assert later.authenticate("fiona", PASSWORD + "!") is None and later.authenticate("nobody", PASSWORD) is None
    later.reset_password("fiona", "another long passphrase")
    assert later.get("fiona").password_hash.startswith("scrypt:2048:8:1$")  # type: ignore[union-attr]
    assert AccountsDatabase(database, scrypt_n=1_024).authenticate("fiona", "another long passphrase") is not None
    with pytest.raises(ValueError, match="ADBILL_PASSWORD_SCRYPT_N"):
        Settings.from_env({"ADBILL_DATABASE_URL": database, "ADBILL_PASSWORD_SCRYPT_N": "1000"}).accounts_store()


def test_changes_raise_the_generation_that_sessions_remember(database: str) -> None:
    store = AccountsDatabase(database)
    assert store.add("ada", Role.ADMIN, PASSWORD).generation == 1
    assert store.reset_password("ada", "another long passphrase").generation == 2
    assert store.set_disabled("ada", True).generation == 3
    assert store.set_disabled("ada", False).generation == 4
    assert store.authenticate("ada", "another long passphrase") is not None
    assert AccountsDatabase(database).get("ada").generation == 4  # type: ignore[union-attr]


def test_refusals(database: str) -> None:
    store = AccountsDatabase(database)
    store.add("ada", Role.ADMIN, PASSWORD)
    with pytest.raises(AccountError, match="exists"):
        AccountsDatabase(database).add("ADA", Role.ADMIN, PASSWORD)  # the key refuses it, whichever process asks
    with pytest.raises(AccountError, match="no account"):
        store.reset_password("nobody", PASSWORD)
    with pytest.raises(AccountError, match="at least 12"):
        store.add("bob", Role.FINANCE, "short")
    with pytest.raises(ValueError, match="exactly one advertiser"):
        store.add("bob", Role.ADVERTISER, PASSWORD)
    with pytest.raises(ValueError, match="exactly one advertiser"):
        store.add("bob", Role.FINANCE, PASSWORD, "adv-0000")
    with pytest.raises(ValueError, match="not a username"):
        store.add("bob smith", Role.FINANCE, PASSWORD)
    assert sorted(store.all()) == ["ada"]
    # The database holds the rules too: an advertiser account without its advertiser is refused where it commits.
    with psycopg.connect(database) as connection, pytest.raises(psycopg.errors.CheckViolation):
        connection.execute(
            "INSERT INTO web_accounts (username, role, password_hash, created_at_ms) "
            "VALUES ('eve', 'advertiser', 'x', 0)"
        )


def test_a_reader_asks_one_small_question_and_reads_again_only_after_a_change(database: str) -> None:
    serving = AccountsDatabase(database)
    assert serving.get("carol") is None
    held = serving.all()
    assert serving.all() is held, "nothing changed: the accounts held are kept"
    AccountsDatabase(database).add("carol", Role.FINANCE, PASSWORD)
    assert serving.get("carol") is not None
    tokens = TokensDatabase(AccountsDatabase(database))
    token, _ = tokens.create("carol")
    assert TokensDatabase(serving).authenticate(token) == serving.get("carol")
    AccountsDatabase(database).set_disabled("carol", True)
    assert TokensDatabase(serving).authenticate(token) is None, "a disabled account's token opens nothing"


def _users(monkeypatch: pytest.MonkeyPatch, home: Path, database: str, *argv: str, stdin: str = "") -> int:
    for name in [k for k in os.environ if k.startswith("ADBILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ADBILL_HOME", str(home))
    monkeypatch.setenv("ADBILL_DATABASE_URL", database)
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return main(["users", *argv])


def test_adbill_users_refuses_a_common_password_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], database: str
) -> None:
    home = tmp_path / "data"
    common = next(p for p in shipped_common_passwords() if len(p) >= 12)
    add = ("add", "ada", "--role", "admin", "--password-stdin")
    assert _users(monkeypatch, home, database, *add, stdin=common + "\n") == 1
    said = capsys.readouterr().err
    assert said.startswith("adbill users: error: that password is in the list of") and "choose another" in said
    assert AccountsDatabase(database).get("ada") is None
    assert _users(monkeypatch, home, database, *add, stdin=PASSWORD) == 0
    assert _users(monkeypatch, home, database, "reset-password", "ada", "--password-stdin", stdin=common.title()) == 1
    assert "choose another" in capsys.readouterr().err
    store = AccountsDatabase(database)
    assert store.authenticate("ada", PASSWORD) is not None and store.get("ada").generation == 1  # type: ignore[union-attr]


def test_adbill_users(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], database: str
) -> None:
    home = tmp_path / "data"

    def users(*argv: str, stdin: str = "") -> int:
        return _users(monkeypatch, home, database, *argv, stdin=stdin)

    assert users("add", "alice", "--role", "advertiser", "--advertiser", "adv-0003", "--password-stdin",
                 stdin=PASSWORD + "\n") == 0  # fmt: skip
    assert users("add", "fiona", "--role", "finance", "--password-stdin", stdin=PASSWORD) == 0
    assert users("disable", "fiona") == 0
    capsys.readouterr()
    assert users("list") == 0
    assert capsys.readouterr().out.splitlines() == [
        "alice\tadvertiser\tadv-0003\tenabled",
        "fiona\tfinance\t-\tdisabled",
    ]
    assert users("enable", "fiona") == 0
    assert users("reset-password", "fiona", "--password-stdin", stdin="a brand new passphrase\n") == 0
    store = AccountsDatabase(database)
    assert store.authenticate("fiona", "a brand new passphrase") is not None
    assert store.authenticate("alice", PASSWORD) is not None
    # Refusals come back as one line and exit code 1.
    assert users("add", "bob", "--role", "advertiser", "--password-stdin", stdin=PASSWORD) == 1
    assert users("add", "bob", "--role", "admin", "--password-stdin", stdin="short") == 1
    assert "at least 12 characters" in capsys.readouterr().err
    assert not home.exists() or not list(home.glob("users.json*")), "no accounts file is written"


def test_long_and_unicode_passwords_work_whole(database: str) -> None:
    """ASVS 2.1.2-2.1.4: up to 1024 characters, any Unicode, blanks inside, never truncated."""
    store = AccountsDatabase(database)
    long_one = "long passphrase " * 64  # 1024 characters
    unicode_one = "Zürich 東京 🚲 naïve façade"
    store.add("ada", Role.ADMIN, long_one.strip() + "x")
    store.add("bob", Role.FINANCE, unicode_one)
    assert store.authenticate("ada", long_one.strip() + "x") is not None
    assert store.authenticate("ada", long_one.strip() + "y") is None, "the last of 1024 characters counts"
    assert store.authenticate("bob", unicode_one) is not None
    assert store.authenticate("bob", unicode_one.replace("🚲", "🛴")) is None


def _old_files(home: Path) -> str:
    """`users.json` and `api-tokens.json` as the release before the database wrote them (mode 0600, the file's
    own layout): two accounts, one disabled after a reset, and a token of each (one of an account since removed).
    Returns ada's token."""
    home.mkdir(parents=True)
    accounts = [
        {"username": "ada", "role": "admin", "password_hash": hash_password(PASSWORD), "advertiser_id": None,
         "disabled": False, "generation": 1, "created_at_ms": 1_760_000_000_000},
        {"username": "alice", "role": "advertiser", "password_hash": hash_password(PASSWORD),
         "advertiser_id": "adv-0000", "disabled": True, "generation": 3, "created_at_ms": 1_760_000_100_000},
    ]  # fmt: skip
    token = f"{PREFIX}0123456789ab_{'T' * 43}"
    tokens = [
        {"token_id": "0123456789ab", "username": "ada", "sha256": _sha256(token), "created_at_ms": 1_760_000_200_000},
        {"token_id": "ba9876543210", "username": "gone", "sha256": "0" * 64, "created_at_ms": 1_760_000_300_000},
    ]
    for name, key, rows in (("users.json", "accounts", accounts), ("api-tokens.json", "tokens", tokens)):
        (home / name).write_text(json.dumps({key: rows}, indent=1, sort_keys=True) + "\n")
        (home / name).chmod(0o600)
    return token


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_a_data_folder_of_the_release_before_is_taken_in_once(redis_settings: Settings) -> None:
    home = redis_settings.root
    token = _old_files(home)
    AccountsDatabase(redis_settings.database_url).add("bob", Role.FINANCE, PASSWORD)  # made before the take-in
    client = create_app(redis_settings).test_client()

    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).get_json()["username"] == "ada"
    assert login(client, "ada").status_code == 302, "the same account logs in with the same password"
    assert login(create_app(redis_settings).test_client(), "alice").status_code == 200, "still disabled"
    for name in ("users.json", "api-tokens.json"):
        assert not (home / name).exists()
        assert stat.S_IMODE((home / f"{name}.imported").stat().st_mode) == 0o600, "set aside, still private"
    store = redis_settings.accounts_store()
    assert sorted(store.all()) == ["ada", "alice", "bob"]
    assert store.get("alice").generation == 3  # type: ignore[union-attr]
    assert [t.token_id for t in redis_settings.tokens_store().of()] == ["0123456789ab"], "the removed account's not"
