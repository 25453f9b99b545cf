"""Accounts: the file under the data folder, scrypt hashes, and `adbill users`."""

from __future__ import annotations

import gzip
import io
import json
import stat
from pathlib import Path

import pytest

from ops.cli import _parser, main
from web.access import Role
from web.accounts import COMMON_PASSWORDS_FILE, AccountError, AccountsFile, password_problem

PASSWORD = "correct horse battery staple"


def test_accounts_are_stored_hashed_with_scrypt_in_a_private_file(tmp_path: Path) -> None:
    store = AccountsFile(tmp_path / "users.json")
    store.add("Alice", Role.ADVERTISER, PASSWORD, "adv-0000")
    text = (tmp_path / "users.json").read_text()
    assert PASSWORD not in text
    (saved,) = json.loads(text)["accounts"]
    assert saved["username"] == "alice" and saved["password_hash"].startswith("scrypt:")
    assert stat.S_IMODE((tmp_path / "users.json").stat().st_mode) == 0o600


def test_authenticate(tmp_path: Path) -> None:
    store = AccountsFile(tmp_path / "users.json")
    store.add("fiona", Role.FINANCE, PASSWORD)
    assert store.authenticate("FIONA", PASSWORD) is not None
    assert store.authenticate("fiona", PASSWORD + "!") is None
    assert store.authenticate("nobody", PASSWORD) is None
    assert store.authenticate("fiona", "x" * 5000) is None
    store.set_disabled("fiona", True)
    assert store.authenticate("fiona", PASSWORD) is None


def test_changes_raise_the_generation_that_sessions_remember(tmp_path: Path) -> None:
    store = AccountsFile(tmp_path / "users.json")
    assert store.add("ada", Role.ADMIN, PASSWORD).generation == 1
    assert store.reset_password("ada", "another long passphrase").generation == 2
    assert store.set_disabled("ada", True).generation == 3
    assert store.set_disabled("ada", False).generation == 4
    assert store.authenticate("ada", "another long passphrase") is not None


def test_refusals(tmp_path: Path) -> None:
    store = AccountsFile(tmp_path / "users.json")
    store.add("ada", Role.ADMIN, PASSWORD)
    with pytest.raises(AccountError, match="exists"):
        store.add("ADA", Role.ADMIN, PASSWORD)
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


def test_password_policy() -> None:
    assert password_problem(PASSWORD) is None
    assert password_problem("eleven char") is not None
    assert password_problem(" leading blank here") is not None
    assert password_problem("x" * 1025) is not None


def _shipped_common_passwords() -> list[str]:
    with gzip.open(COMMON_PASSWORDS_FILE, "rt", encoding="utf-8") as lines:
        return [line.strip() for line in lines if line.strip()]


def test_every_common_password_long_enough_for_the_policy_is_refused() -> None:
    """ASVS 2.1.7: the shipped list is checked, whatever the case and blanks of the password typed."""
    candidates = [p for p in _shipped_common_passwords() if len(p) >= 12]
    assert len(candidates) > 100, "the list has passwords of the policy's length to refuse"
    for password in candidates:
        assert "common passwords" in (password_problem(password) or ""), password
        assert "common passwords" in (password_problem(password.upper()) or ""), password
    spaced = " ".join([candidates[0][:4], candidates[0][4:8], candidates[0][8:]])
    assert "common passwords" in (password_problem(spaced) or ""), spaced
    assert password_problem(PASSWORD) is None and password_problem("a whole new passphrase") is None


def test_adbill_users_refuses_a_common_password_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "data"
    common = next(p for p in _shipped_common_passwords() if len(p) >= 12)
    assert _users(monkeypatch, home, "add", "ada", "--role", "admin", "--password-stdin", stdin=common + "\n") == 1
    said = capsys.readouterr().err
    assert said.startswith("adbill users: error: that password is in the list of") and "choose another" in said
    assert AccountsFile(home / "users.json").get("ada") is None
    assert _users(monkeypatch, home, "add", "ada", "--role", "admin", "--password-stdin", stdin=PASSWORD) == 0
    assert _users(monkeypatch, home, "reset-password", "ada", "--password-stdin", stdin=common.title()) == 1
    assert "choose another" in capsys.readouterr().err
    store = AccountsFile(home / "users.json")
    assert store.authenticate("ada", PASSWORD) is not None and store.get("ada").generation == 1  # type: ignore[union-attr]


def test_the_file_is_reread_when_another_process_changes_it(tmp_path: Path) -> None:
    serving = AccountsFile(tmp_path / "users.json")
    assert serving.get("carol") is None
    AccountsFile(tmp_path / "users.json").add("carol", Role.FINANCE, PASSWORD)
    assert serving.get("carol") is not None


def _users(monkeypatch: pytest.MonkeyPatch, home: Path, *argv: str, stdin: str = "") -> int:
    monkeypatch.setenv("ADBILL_HOME", str(home))
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return main(["users", *argv])


def test_adbill_users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "data"
    assert _users(monkeypatch, home, "add", "alice", "--role", "advertiser", "--advertiser", "adv-0003",
                  "--password-stdin", stdin=PASSWORD + "\n") == 0  # fmt: skip
    assert _users(monkeypatch, home, "add", "fiona", "--role", "finance", "--password-stdin", stdin=PASSWORD) == 0
    assert _users(monkeypatch, home, "disable", "fiona") == 0
    capsys.readouterr()
    assert _users(monkeypatch, home, "list") == 0
    assert capsys.readouterr().out.splitlines() == [
        "alice\tadvertiser\tadv-0003\tenabled",
        "fiona\tfinance\t-\tdisabled",
    ]
    assert _users(monkeypatch, home, "enable", "fiona") == 0
    assert (
        _users(monkeypatch, home, "reset-password", "fiona", "--password-stdin", stdin="a brand new passphrase\n") == 0
    )
    store = AccountsFile(home / "users.json")
    assert store.authenticate("fiona", "a brand new passphrase") is not None
    assert store.authenticate("alice", PASSWORD) is not None
    # Refusals come back as one line and exit code 1.
    assert _users(monkeypatch, home, "add", "bob", "--role", "advertiser", "--password-stdin", stdin=PASSWORD) == 1
    assert _users(monkeypatch, home, "add", "bob", "--role", "admin", "--password-stdin", stdin="short") == 1
    assert "at least 12 characters" in capsys.readouterr().err


def test_a_password_is_never_taken_from_the_command_line() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["users", "add", "x", "--role", "admin", "--password", PASSWORD])
    with pytest.raises(SystemExit):
        _parser().parse_args(["users", "reset-password", "x", PASSWORD])


def test_adbill_web_parses() -> None:
    assert _parser().parse_args(["web"]).command == "web"


def test_long_and_unicode_passwords_work_whole(tmp_path: Path) -> None:
    """ASVS 2.1.2-2.1.4: up to 1024 characters, any Unicode, blanks inside, never truncated."""
    store = AccountsFile(tmp_path / "users.json")
    long_one = "long passphrase " * 64  # 1024 characters
    unicode_one = "Zürich 東京 🚲 naïve façade"
    store.add("ada", Role.ADMIN, long_one.strip() + "x")
    store.add("bob", Role.FINANCE, unicode_one)
    assert store.authenticate("ada", long_one.strip() + "x") is not None
    assert store.authenticate("ada", long_one.strip() + "y") is None, "the last of 1024 characters counts"
    assert store.authenticate("bob", unicode_one) is not None
    assert store.authenticate("bob", unicode_one.replace("🚲", "🛴")) is None
