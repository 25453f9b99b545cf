"""Accounts: the password policy and `adbill users`'s arguments (pure; the accounts in the database:
tests/integration/test_web_accounts_in_database.py)."""

from __future__ import annotations

import gzip

import pytest

from ops.cli import _parser
from ops.settings import Settings
from web.accounts import COMMON_PASSWORDS_FILE, SCRYPT_N, check_scrypt_n, hash_password, password_problem

PASSWORD = "correct horse battery staple"


def test_password_policy() -> None:
    assert password_problem(PASSWORD) is None
    assert password_problem("eleven char") is not None
    assert password_problem(" leading blank here") is not None
    assert password_problem("x" * 1025) is not None


def shipped_common_passwords() -> list[str]:
    with gzip.open(COMMON_PASSWORDS_FILE, "rt", encoding="utf-8") as lines:
        return [line.strip() for line in lines if line.strip()]


def test_every_common_password_long_enough_for_the_policy_is_refused() -> None:
    """ASVS 2.1.7: the shipped list is checked, whatever the case and blanks of the password typed."""
    candidates = [p for p in shipped_common_passwords() if len(p) >= 12]
    assert len(candidates) > 100, "the list has passwords of the policy's length to refuse"
    for password in candidates:
        assert "common passwords" in (password_problem(password) or ""), password
        assert "common passwords" in (password_problem(password.upper()) or ""), password
    spaced = " ".join([candidates[0][:4], candidates[0][4:8], candidates[0][8:]])
    assert "common passwords" in (password_problem(spaced) or ""), spaced
    assert password_problem(PASSWORD) is None and password_problem("a whole new passphrase") is None


def test_a_password_is_never_taken_from_the_command_line() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["users", "add", "x", "--role", "admin", "--password", PASSWORD])
    with pytest.raises(SystemExit):
        _parser().parse_args(["users", "reset-password", "x", PASSWORD])


def test_adbill_web_parses() -> None:
    assert _parser().parse_args(["web"]).command == "web"


def test_the_products_hashes_are_scrypt_at_32768_and_another_factor_is_a_power_of_two_of_at_least_1024() -> None:
    assert SCRYPT_N == Settings().password_scrypt_n == 32_768  # the product's default, whatever the tests run with
    assert hash_password(PASSWORD).startswith("scrypt:32768:8:1$")
    assert hash_password(PASSWORD, 1_024).startswith("scrypt:1024:8:1$")
    assert [check_scrypt_n(n) for n in (1_024, 65_536)] == [1_024, 65_536]
    for refused in (0, 512, 1_000, 3_072):
        with pytest.raises(ValueError, match="ADBILL_PASSWORD_SCRYPT_N must be a power of two of at least 1,024"):
            check_scrypt_n(refused)
