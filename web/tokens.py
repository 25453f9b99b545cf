"""API tokens: a script's credential for `/api/v1`, sent as `Authorization: Bearer TOKEN`, with exactly the access
of the account it belongs to.

`adbill tokens create USER` prints a new token once; only its SHA-256 is kept, in the product's database (table
`api_tokens`, beside the accounts of `web.accounts`; docs/catalog-database.md). A token is 32 random bytes, so a
plain hash is enough (a slow password hash guards guessable secrets; nobody guesses 256 bits). `revoke` removes it;
a disabled account's tokens open nothing, and a token cannot outlive its account (a foreign key). A change is one
transaction and raises the version the web's readers ask for (`web.accounts.bump_version`): an API request asks
that one small question and reads the tokens and accounts again only when it moved.

A data folder written before the database (`HOME/api-tokens.json`) is taken in once, the first time a process opens
the table, and the file set aside (`api-tokens.json.imported`): the same tokens open the API.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from billing.store import database
from billing.store.database import integrity_errors
from web.accounts import (
    UNIQUE_VIOLATION,
    Account,
    AccountError,
    AccountsDatabase,
    Held,
    bump_version,
    normalize_username,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

PREFIX = "adbill_"
_TOKEN = re.compile(r"adbill_([0-9a-f]{12})_[A-Za-z0-9_-]{43}", re.ASCII)

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_tokens (
    token_id text PRIMARY KEY CHECK (token_id ~ '^[0-9a-f]{12}$'),
    username text NOT NULL REFERENCES web_accounts ON DELETE CASCADE,
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    created_at_ms bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS api_tokens_by_username ON api_tokens (username);
"""
"""The tokens' table (made after the accounts' tables, which it references)."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One token as kept at rest: its id (shown in lists), its owner, the SHA-256 of the whole token."""

    token_id: str
    username: str
    sha256: str
    created_at_ms: int


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


class TokensDatabase:
    """The API tokens, in the database of `accounts`; an account's access is looked up at each use.

    `imports`: the tokens file of a data folder written before the database (`HOME/api-tokens.json`), taken in once
    (after the accounts file of `accounts`)."""

    def __init__(self, accounts: AccountsDatabase, imports: str | os.PathLike[str] | None = None) -> None:
        self.accounts = accounts
        self.imports = Path(imports) if imports is not None else None
        self._tables = database.Tables(f"api_tokens:{self.imports}", SCHEMA, self._take_in)
        self._tokens: Held[dict[str, TokenRecord]] = Held(_read_tokens)

    def __repr__(self) -> str:
        return f"TokensDatabase({self.accounts.where!r})"

    def all(self) -> dict[str, TokenRecord]:
        """Every token by id (read again only when the version moved)."""
        return self.accounts.with_accounts(self._tokens, self._tables)[0]

    def authenticate(self, token: str) -> Account | None:
        """The enabled account this token belongs to, or None (unknown, revoked, malformed, account disabled)."""
        match = _TOKEN.fullmatch(token)
        if match is None:
            return None
        tokens, accounts = self.accounts.with_accounts(self._tokens, self._tables)
        record = tokens.get(match.group(1))
        if record is None or not hmac.compare_digest(record.sha256, _digest(token)):
            return None
        account = accounts.get(record.username)
        return None if account is None or account.disabled else account

    def create(self, username: str, now_ms: int | None = None) -> tuple[str, TokenRecord]:
        """A new token for an existing, enabled account: (the token, to show once; what is kept). One transaction:
        the account is locked against a change while its token is written."""
        name = normalize_username(username)
        created = int(time.time() * 1000) if now_ms is None else now_ms
        while True:
            token_id = secrets.token_hex(6)
            token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
            record = TokenRecord(token_id, name, _digest(token), created)
            try:
                with self.accounts.connection(tables=self._tables) as connection, connection.transaction():
                    row = connection.execute(
                        "SELECT disabled FROM web_accounts WHERE username = %s FOR SHARE", (name,)
                    ).fetchone()
                    if row is None:
                        raise AccountError(f"no account {name}")
                    if row[0]:
                        raise AccountError(f"account {name} is disabled; enable it first")
                    _insert(connection, record)
                    bump_version(connection)
            except integrity_errors() as exc:
                if getattr(exc, "sqlstate", None) == UNIQUE_VIOLATION:
                    continue  # another token drew the same id (one chance in 2**48): draw again
                raise
            return token, record

    def of(self, username: str | None = None) -> list[TokenRecord]:
        """The tokens of one account (or of all), oldest first."""
        name = None if username is None else normalize_username(username)
        rows = [t for t in self.all().values() if name is None or t.username == name]
        return sorted(rows, key=lambda t: (t.username, t.created_at_ms, t.token_id))

    def revoke(self, username: str, token_id: str | None = None) -> list[str]:
        """Remove one token of the account (by id) or all of them; returns the ids removed."""
        name = normalize_username(username)
        with self.accounts.connection(tables=self._tables) as connection, connection.transaction():
            gone = [
                row[0]
                for row in connection.execute(
                    "DELETE FROM api_tokens WHERE username = %s AND (%s::text IS NULL OR token_id = %s) "
                    "RETURNING token_id",
                    (name, token_id, token_id),
                )
            ]
            if not gone:
                what = f"token {token_id} of {name}" if token_id else f"tokens of {name}"
                raise AccountError(f"no {what}")
            bump_version(connection)
        return sorted(gone)

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in a data folder's tokens file (once, under the lock of `database.make_tables`): each token of an
        account the database holds; the file is set aside (FILE.imported) once this commits."""
        if self.imports is None or not self.imports.exists():
            return []
        try:
            records = [TokenRecord(**t) for t in json.loads(self.imports.read_text(encoding="utf-8"))["tokens"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise AccountError(f"cannot read the API tokens file {self.imports}: {exc}") from exc
        known = {row[0] for row in connection.execute("SELECT username FROM web_accounts")}
        taken = [r for r in records if r.username in known and _insert(connection, r, if_new=True)]
        bump_version(connection)
        log.warning(
            "took the API tokens file %s (%d tokens; %d of accounts that are gone or already there left out) into "
            "%s; the file is set aside as %s.imported",
            self.imports,
            len(taken),
            len(records) - len(taken),
            self.accounts.where,
            self.imports.name,
        )
        return [self.imports]


def _read_tokens(connection: psycopg.Connection[Any]) -> dict[str, TokenRecord]:
    rows = connection.execute("SELECT token_id, username, sha256, created_at_ms FROM api_tokens").fetchall()
    return {row[0]: TokenRecord(row[0], row[1], row[2], int(row[3])) for row in rows}


def _insert(connection: psycopg.Connection[Any], record: TokenRecord, if_new: bool = False) -> bool:
    cursor = connection.execute(
        "INSERT INTO api_tokens (token_id, username, sha256, created_at_ms) VALUES (%s, %s, %s, %s)"
        + (" ON CONFLICT (token_id) DO NOTHING" if if_new else ""),
        (record.token_id, record.username, record.sha256, record.created_at_ms),
    )
    return cursor.rowcount == 1


def token_id_of(token: str) -> str | None:
    """The id part of a well-formed token (what `adbill tokens list` shows), else None."""
    match = _TOKEN.fullmatch(token)
    return match.group(1) if match else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None
