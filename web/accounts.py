"""The web UI's accounts: a JSON file under the data folder (never in the repository), passwords hashed with scrypt.

`adbill users` writes the file; the web server reads it, re-reading only when it changed on disk. Writes are atomic
(a temporary file renamed over the old one) and serialised by a lock file, so a reader sees the old file or the new
one and two `adbill users` commands never lose each other's change.

Each account carries a `generation`, raised when its password is reset or it is disabled: a session remembers the
generation it was opened with, and stops working when they differ.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gzip
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from werkzeug.security import check_password_hash, generate_password_hash

from web.access import Principal, Role

T = TypeVar("T")

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024
COMMON_PASSWORDS_FILE = Path(__file__).resolve().parent / "common-passwords.txt.gz"
"""Passwords refused whatever their length (ASVS 2.1.7); where the list comes from: `common-passwords.NOTICE`."""
_USERNAME = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}", re.ASCII)
_ADVERTISER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)


def hash_password(password: str) -> str:
    """werkzeug's scrypt hash (salted, `scrypt:32768:8:1$salt$hash`)."""
    return generate_password_hash(password, method="scrypt")


@functools.cache
def _dummy_hash() -> str:
    """Checked against when the username is unknown, so that a wrong name costs as long as a wrong password."""
    return hash_password("not the password of anyone")


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

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "role": self.role.value}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Account:
        return cls(**{**data, "role": Role(str(data["role"]))})  # type: ignore[arg-type]


class ParsedFile(Generic[T]):
    """A file's parsed content, read and parsed again only when the file changed on disk (mtime and size): the web
    server looks accounts and tokens up on every request."""

    def __init__(self, path: Path, parse: Callable[[str], T]) -> None:
        self.path = path
        self.parse = parse
        self._cache: tuple[tuple[int, int], T] | None = None

    def get(self) -> T | None:
        """The parsed content; None when the file does not exist yet."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if self._cache is None or self._cache[0] != stamp:
            self._cache = (stamp, self.parse(self.path.read_text()))
        return self._cache[1]


class AccountError(ValueError):
    """A `adbill users` request that cannot be done, in one sentence."""


class AccountsFile:
    """The accounts in one JSON file: `{"accounts": [...]}`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._parsed = ParsedFile(path, self._parse)

    # Reading: the web server calls `get` on every request, so the parsed file is kept until it changes on disk.
    def all(self) -> dict[str, Account]:
        """Every account by username; empty when the file does not exist yet."""
        return self._parsed.get() or {}

    def get(self, username: str) -> Account | None:
        return self.all().get(normalize_username(username))

    def authenticate(self, username: str, password: str) -> Account | None:
        """The enabled account whose password this is, else None (in about the same time either way)."""
        account = self.get(username)
        if account is None or len(password) > MAX_PASSWORD_LENGTH:
            check_password_hash(_dummy_hash(), password[:MAX_PASSWORD_LENGTH])
            return None
        if not check_password_hash(account.password_hash, password):
            return None
        return None if account.disabled else account

    # Writing: `adbill users`.
    def add(self, username: str, role: Role, password: str, advertiser_id: str | None = None) -> Account:
        """A new account; AccountError if the name is taken or the password too weak."""
        _check_password(password)
        name = normalize_username(username)
        with self._locked() as accounts:
            if name in accounts:
                raise AccountError(f"account {name} exists; use reset-password, enable or disable")
            account = Account(
                username=name,
                role=role,
                password_hash=hash_password(password),
                advertiser_id=advertiser_id,
                created_at_ms=int(time.time() * 1000),
            )
            accounts[name] = account
        return account

    def reset_password(self, username: str, password: str) -> Account:
        """A new password; the account's open sessions end."""
        _check_password(password)
        return self._update(username, lambda a: replace(a, password_hash=hash_password(password)))

    def set_disabled(self, username: str, disabled: bool) -> Account:
        """Disable (open sessions end, logins refused) or enable an account."""
        return self._update(username, lambda a: replace(a, disabled=disabled))

    def _update(self, username: str, change: Callable[[Account], Account]) -> Account:
        name = normalize_username(username)
        with self._locked() as accounts:
            if name not in accounts:
                raise AccountError(f"no account {name}")
            old = accounts[name]
            new = change(old)
            accounts[name] = replace(new, generation=old.generation + 1)
            return accounts[name]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Account]]:
        """The accounts, for changing under an exclusive lock; written back atomically on success."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            accounts = dict(self._parse(self.path.read_text())) if self.path.exists() else {}
            yield accounts
            text = json.dumps({"accounts": [a.to_json() for a in accounts.values()]}, indent=1, sort_keys=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".users-")
            with os.fdopen(fd, "w") as out:  # mkstemp creates it 0600: hashes are nobody else's business
                out.write(text + "\n")
            os.replace(tmp, self.path)

    def _parse(self, text: str) -> dict[str, Account]:
        try:
            data = json.loads(text)
            return {a.username: a for a in (Account.from_json(item) for item in data["accounts"])}
        except (ValueError, KeyError, TypeError) as exc:
            raise AccountError(f"cannot read the accounts file {self.path}: {exc}") from exc


def _check_password(password: str) -> None:
    problem = password_problem(password)
    if problem:
        raise AccountError(problem)
