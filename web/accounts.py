"""The web UI's accounts, in the product's database (PostgreSQL, `ADBILL_DATABASE_URL`), passwords hashed with
scrypt.

`adbill users` changes them; the web server's workers, on any host, read them. Tables (docs/catalog-database.md,
"The web's accounts and API tokens"):
- `web_accounts`: one row per account (`Account`); the username is its key, so two `adbill users add` of one name,
  on any host, cannot both succeed; the role and the advertiser it sees are checked by constraints too;
- `web_access_version`: one row, raised by every change of an account or an API token (`web.tokens`), in the
  change's own transaction.

A change is one transaction. Each account carries a `generation`, raised when its password is reset or it is
disabled (or enabled): a session remembers the generation it was opened with, and stops working when they differ.

A reader (each web request) asks the database one small question, the version (`AccountsDatabase.held`), and reads
the accounts again only when it moved. When the database cannot be reached, a reader goes on with the accounts it
holds (no change can be made meanwhile) and asks again every few seconds; one that holds none says so
(`AccountsUnavailable`: the web answers 503).

A data folder written before the database (`HOME/users.json`) is taken in once, the first time a process opens the
tables, and the file set aside (renamed `users.json.imported`; it keeps its mode 0600): an account the database
already holds is kept as the database has it.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from werkzeug.security import check_password_hash, generate_password_hash

from billing.store import database
from billing.store.database import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    constraint_message,
    integrity_errors,
)
from web.access import Principal, Role

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")

log = logging.getLogger(__name__)

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024
COMMON_PASSWORDS_FILE = Path(__file__).resolve().parent / "common-passwords.txt.gz"
"""Passwords refused whatever their length (ASVS 2.1.7); where the list comes from: `common-passwords.NOTICE`."""
_USERNAME = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}", re.ASCII)
_ADVERTISER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)

SCHEMA = """
CREATE TABLE IF NOT EXISTS web_accounts (
    username text PRIMARY KEY CHECK (username ~ '^[a-z0-9][a-z0-9._@-]{0,63}$'),
    role text NOT NULL CHECK (role IN ('advertiser', 'finance', 'admin')),
    password_hash text NOT NULL CHECK (password_hash <> ''),
    advertiser_id text CHECK (advertiser_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    disabled boolean NOT NULL DEFAULT false,
    generation bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    created_at_ms bigint NOT NULL,
    CHECK ((role = 'advertiser') = (advertiser_id IS NOT NULL))
);
CREATE TABLE IF NOT EXISTS web_access_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint NOT NULL
);
INSERT INTO web_access_version (version) VALUES (0) ON CONFLICT DO NOTHING;
"""
"""The accounts' tables (made when missing, `billing.store.database.make_tables`)."""

_COLUMNS = "username, role, password_hash, advertiser_id, disabled, generation, created_at_ms"


SCRYPT_N = 32_768
"""scrypt's work factor for a new password's hash (werkzeug's default; `ADBILL_PASSWORD_SCRYPT_N`). A hash names the
factor it was made with (`scrypt:N:8:1$salt$hash`) and is checked with that one, so a changed setting applies to
passwords set after it and every account keeps logging in."""
LEAST_SCRYPT_N = 1_024


def check_scrypt_n(scrypt_n: int) -> int:
    """`scrypt_n`, or ValueError unless it is a power of two of at least 1,024 (what scrypt takes)."""
    if scrypt_n < LEAST_SCRYPT_N or scrypt_n & (scrypt_n - 1):
        raise ValueError(f"ADBILL_PASSWORD_SCRYPT_N must be a power of two of at least {LEAST_SCRYPT_N:,}: {scrypt_n}")
    return scrypt_n


def hash_password(password: str, scrypt_n: int = SCRYPT_N) -> str:
    """werkzeug's scrypt hash (salted, `scrypt:N:8:1$salt$hash`)."""
    return generate_password_hash(password, method=f"scrypt:{check_scrypt_n(scrypt_n)}:8:1")


@functools.cache
def _dummy_hash(scrypt_n: int) -> str:
    """Checked against when the username is unknown, so that a wrong name costs as long as a wrong password."""
    return hash_password("not the password of anyone", scrypt_n)


@functools.cache
def _common_passwords() -> frozenset[str]:
    with gzip.open(COMMON_PASSWORDS_FILE, "rt", encoding="utf-8") as lines:
        return frozenset(line.strip() for line in lines if line.strip())


def is_common_password(password: str) -> bool:
    """In the shipped list of common passwords, whatever its case and blanks (`Qwerty 123456` is `qwerty123456`)."""
    lowered = password.lower()
    return lowered in _common_passwords() or "".join(lowered.split()) in _common_passwords()


def password_problem(password: str) -> str | None:
    """Why a new password is refused, or None when it is acceptable."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"a password has at least {MIN_PASSWORD_LENGTH} characters"
    if len(password) > MAX_PASSWORD_LENGTH:
        return f"a password has at most {MAX_PASSWORD_LENGTH} characters"
    if password.strip() != password:
        return "a password does not start or end with blanks"
    if is_common_password(password):
        return (
            f"that password is in the list of {len(_common_passwords()):,} common passwords that attackers try "
            f"first ({COMMON_PASSWORDS_FILE.name}); choose another"
        )
    return None


def normalize_username(name: str) -> str:
    """Usernames are case-insensitive: stored and compared in lower case."""
    return name.strip().lower()


@dataclass(frozen=True, slots=True)
class Account:
    """One person's login."""

    username: str
    role: Role
    password_hash: str
    advertiser_id: str | None = None
    disabled: bool = False
    generation: int = 1
    created_at_ms: int = 0

    def __post_init__(self) -> None:
        if not _USERNAME.fullmatch(self.username):
            raise ValueError(
                f"{self.username!r} is not a username: lower-case letters, digits and . _ @ -, at most 64 characters"
            )
        if self.advertiser_id is not None and not _ADVERTISER.fullmatch(self.advertiser_id):
            raise ValueError(f"{self.advertiser_id!r} is not an advertiser id")
        Principal(self.username, self.role, self.advertiser_id)  # the role and advertiser binding must agree

    @property
    def principal(self) -> Principal:
        return Principal(self.username, self.role, self.advertiser_id)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Account:
        """An account as the accounts file of an earlier release kept it (taken in once)."""
        return cls(**{**data, "role": Role(str(data["role"]))})  # type: ignore[arg-type]


class AccountError(ValueError):
    """A `adbill users` request that cannot be done, in one sentence."""


class AccountsUnavailable(database.DatabaseUnavailable, AccountError):
    """The database cannot be reached, and nothing is held to go on with: the message names it (no password)."""


class Held(Generic[T]):
    """What a process holds of a table, with the version (`web_access_version`) it was read at: read again only when
    the version moved."""

    def __init__(self, read: Callable[[psycopg.Connection[Any]], T]) -> None:
        self._read = read
        self._held: tuple[int, T] | None = None

    @property
    def value(self) -> T | None:
        """What is held, None before the first read."""
        return None if self._held is None else self._held[1]

    def at(self, connection: psycopg.Connection[Any], version: int) -> T:
        """The table as of `version` (read after it: a change made in between only costs one more read)."""
        held = self._held
        if held is None or held[0] != version:
            held = (version, self._read(connection))
            self._held = held
        return held[1]


class AccountsDatabase(database.HeldReader):
    """The web UI's accounts at `url`: read by version (`all`, `get`, `authenticate`), changed in transactions
    (`add`, `reset_password`, `set_disabled`).

    `imports`: the accounts file of a data folder written before the database (`HOME/users.json`), taken in once.
    `scrypt_n`: the work factor of the hashes it makes (`SCRYPT_N`)."""

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None, scrypt_n: int = SCRYPT_N) -> None:
        super().__init__(url, imports)
        self.scrypt_n = check_scrypt_n(scrypt_n)
        self._tables = database.Tables(f"web_accounts:{self.imports}", SCHEMA, self._take_in)
        self._accounts: Held[dict[str, Account]] = Held(_read_accounts)

    # Reading: the web server asks on every request, so the accounts are kept until the version moves.
    def all(self) -> dict[str, Account]:
        """Every account by username."""
        return self.held(self._accounts)[0]

    def get(self, username: str) -> Account | None:
        return self.all().get(normalize_username(username))

    def with_accounts(self, other: Held[T], tables: database.Tables) -> tuple[T, dict[str, Account]]:
        """`other` (a table of `tables`, such as the API tokens) and the accounts, for the one question of the
        version: what an API request reads."""
        value, accounts = self.held(other, self._accounts, tables=tables)
        return value, accounts

    def held(self, *wanted: Held[Any], tables: database.Tables | None = None) -> list[Any]:
        """The value of each of `wanted` as of the version now: one small query when nothing changed. When the
        database cannot be reached, what is held (and `behind` says why); AccountsUnavailable when nothing is."""
        kept = [w.value for w in wanted]
        if self.waiting() and None not in kept:
            return kept
        try:
            with self.connection(READ_TIMEOUT_S, tables) as connection:
                version = _version(connection)
                values = [w.at(connection, version) for w in wanted]
        except AccountsUnavailable as exc:
            if None in kept:
                raise
            if self.unreached(exc):
                log.warning("%s; the web goes on with the accounts and API tokens it holds", exc)
            return kept
        self.behind = None
        return values

    def authenticate(self, username: str, password: str) -> Account | None:
        """The enabled account whose password this is, else None (in about the same time either way)."""
        account = self.get(username)
        if account is None or len(password) > MAX_PASSWORD_LENGTH:
            check_password_hash(_dummy_hash(self.scrypt_n), password[:MAX_PASSWORD_LENGTH])
            return None
        if not check_password_hash(account.password_hash, password):
            return None
        return None if account.disabled else account

    # Writing: `adbill users`, one transaction each.
    def add(self, username: str, role: Role, password: str, advertiser_id: str | None = None) -> Account:
        """A new account; AccountError if the name is taken or the password too weak."""
        _check_password(password)
        name = normalize_username(username)
        account = Account(
            username=name,
            role=role,
            password_hash=hash_password(password, self.scrypt_n),
            advertiser_id=advertiser_id,
            created_at_ms=int(time.time() * 1000),
        )
        try:
            with self.connection() as connection, connection.transaction():
                _insert(connection, account)
                bump_version(connection)
        except integrity_errors() as exc:
            if getattr(exc, "sqlstate", None) == UNIQUE_VIOLATION:
                raise AccountError(f"account {name} exists; use reset-password, enable or disable") from None
            raise AccountError(f"the database refused account {name}: {constraint_message(exc)}") from None
        return account

    def reset_password(self, username: str, password: str) -> Account:
        """A new password; the account's open sessions end."""
        _check_password(password)
        return self._update(username, "password_hash = %s", hash_password(password, self.scrypt_n))

    def set_disabled(self, username: str, disabled: bool) -> Account:
        """Disable (open sessions end, logins refused) or enable an account."""
        return self._update(username, "disabled = %s", disabled)

    def _update(self, username: str, assignment: str, value: object) -> Account:
        """Change one column of the account and raise its generation, in one statement of one transaction."""
        name = normalize_username(username)
        with self.connection() as connection, connection.transaction():
            row = connection.execute(
                f"UPDATE web_accounts SET {assignment}, generation = generation + 1 WHERE username = %s "
                f"RETURNING {_COLUMNS}",
                (value, name),
            ).fetchone()
            if row is None:
                raise AccountError(f"no account {name}")
            bump_version(connection)
        return _account(row)

    # The connection, the tables and the take-in.
    @contextmanager
    def connection(
        self, timeout_s: float = CONNECT_TIMEOUT_S, tables: database.Tables | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection from this process's pool, the accounts' tables made and the data folder's file taken in
        first (then `tables`, such as the API tokens'); AccountsUnavailable when the database cannot be reached."""
        try:
            with database.connection(self.url, self._tables, "web accounts' database", timeout_s) as connection:
                if tables is not None:
                    database.make_tables(self.url, connection, tables)
                yield connection
        except database.DatabaseUnavailable as exc:
            if isinstance(exc, AccountsUnavailable):
                raise
            raise AccountsUnavailable(str(exc)) from None

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in a data folder's accounts file (once, under the lock of `database.make_tables`): the accounts the
        database lacks; the file is set aside (FILE.imported) once this commits."""
        if self.imports is None or not self.imports.exists():
            return []
        accounts = read_accounts_file(self.imports)
        kept = [a.username for a in accounts if not _insert(connection, a, if_new=True)]
        bump_version(connection)
        log.warning(
            "took the accounts file %s (%d accounts%s) into %s; the file is set aside as %s.imported",
            self.imports,
            len(accounts) - len(kept),
            f"; {', '.join(kept)} kept as the database had them" if kept else "",
            self.where,
            self.imports.name,
        )
        return [self.imports]


UNIQUE_VIOLATION = "23505"
"""PostgreSQL's SQLSTATE for a duplicate key."""


def bump_version(connection: psycopg.Connection[Any]) -> None:
    """Raise the version of the web's access records (in the change's transaction): readers read them again."""
    connection.execute("UPDATE web_access_version SET version = version + 1")


def _version(connection: psycopg.Connection[Any]) -> int:
    row = connection.execute("SELECT version FROM web_access_version").fetchone()
    return int(row[0]) if row else 0


def _read_accounts(connection: psycopg.Connection[Any]) -> dict[str, Account]:
    rows = connection.execute(f"SELECT {_COLUMNS} FROM web_accounts").fetchall()
    return {account.username: account for account in map(_account, rows)}


def _account(row: tuple[Any, ...]) -> Account:
    username, role, password_hash, advertiser_id, disabled, generation, created_at_ms = row
    return Account(username, Role(role), password_hash, advertiser_id, disabled, int(generation), int(created_at_ms))


def _insert(connection: psycopg.Connection[Any], account: Account, if_new: bool = False) -> bool:
    """Insert `account`; `if_new`: unless the username is taken (then False)."""
    cursor = connection.execute(
        f"INSERT INTO web_accounts ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
        + (" ON CONFLICT (username) DO NOTHING" if if_new else ""),
        (
            account.username,
            account.role.value,
            account.password_hash,
            account.advertiser_id,
            account.disabled,
            account.generation,
            account.created_at_ms,
        ),
    )
    return cursor.rowcount == 1


def read_accounts_file(path: Path) -> list[Account]:
    """The accounts of an accounts file of an earlier release (`{"accounts": [...]}`), to take in."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [Account.from_json(item) for item in data["accounts"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise AccountError(f"cannot read the accounts file {path}: {exc}") from exc


def _check_password(password: str) -> None:
    problem = password_problem(password)
    if problem:
        raise AccountError(problem)
