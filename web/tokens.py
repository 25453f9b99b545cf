"""API tokens: a script's credential for `/api/v1`, sent as `Authorization: Bearer TOKEN`, with exactly the access
of the account it belongs to.

`adbill tokens create USER` prints a new token once; only its SHA-256 is kept, in a JSON file under the data folder
(`HOME/api-tokens.json`, mode 0600, never in the repository). A token is 32 random bytes, so a plain hash is enough
(a slow password hash guards guessable secrets; nobody guesses 256 bits). `revoke` removes it; a disabled or removed
account's tokens open nothing. Writes are atomic and serialised by a lock file, like the accounts file's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from web.accounts import Account, AccountError, AccountsFile, ParsedFile, normalize_username

PREFIX = "adbill_"
_TOKEN = re.compile(r"adbill_([0-9a-f]{12})_[A-Za-z0-9_-]{43}", re.ASCII)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One token as kept at rest: its id (shown in lists), its owner, the SHA-256 of the whole token."""

    token_id: str
    username: str
    sha256: str
    created_at_ms: int


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


class TokensFile:
    """The tokens in one JSON file: `{"tokens": [...]}`; an account's access is looked up at each use."""

    def __init__(self, path: Path, accounts: AccountsFile) -> None:
        self.path = path
        self.accounts = accounts
        self._parsed = ParsedFile(path, self._parse)

    def all(self) -> dict[str, TokenRecord]:
        """Every token by id; empty when the file does not exist yet (re-read only when it changed on disk)."""
        return self._parsed.get() or {}

    def authenticate(self, token: str) -> Account | None:
        """The enabled account this token belongs to, or None (unknown, revoked, malformed, account disabled)."""
        match = _TOKEN.fullmatch(token)
        if match is None:
            return None
        record = self.all().get(match.group(1))
        if record is None or not hmac.compare_digest(record.sha256, _digest(token)):
            return None
        account = self.accounts.get(record.username)
        return None if account is None or account.disabled else account

    def create(self, username: str, now_ms: int | None = None) -> tuple[str, TokenRecord]:
        """A new token for an existing account: (the token, to show once; what is kept)."""
        account = self.accounts.get(username)
        if account is None:
            raise AccountError(f"no account {normalize_username(username)}")
        if account.disabled:
            raise AccountError(f"account {account.username} is disabled; enable it first")
        with self._locked() as tokens:
            token_id = secrets.token_hex(6)
            while token_id in tokens:
                token_id = secrets.token_hex(6)
            token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
            created = int(time.time() * 1000) if now_ms is None else now_ms
            record = TokenRecord(token_id, account.username, _digest(token), created)
            tokens[token_id] = record
        return token, record

    def of(self, username: str | None = None) -> list[TokenRecord]:
        """The tokens of one account (or of all), oldest first."""
        name = None if username is None else normalize_username(username)
        rows = [t for t in self.all().values() if name is None or t.username == name]
        return sorted(rows, key=lambda t: (t.username, t.created_at_ms, t.token_id))

    def revoke(self, username: str, token_id: str | None = None) -> list[str]:
        """Remove one token of the account (by id) or all of them; returns the ids removed."""
        name = normalize_username(username)
        with self._locked() as tokens:
            gone = [i for i, t in tokens.items() if t.username == name and (token_id is None or i == token_id)]
            if not gone:
                what = f"token {token_id} of {name}" if token_id else f"tokens of {name}"
                raise AccountError(f"no {what}")
            for token in gone:
                del tokens[token]
        return sorted(gone)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, TokenRecord]]:
        """The tokens, for changing under an exclusive lock; written back atomically (0600) on success."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.with_name(self.path.name + ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            tokens = dict(self._parse(self.path.read_text())) if self.path.exists() else {}
            yield tokens
            text = json.dumps({"tokens": [asdict(t) for t in tokens.values()]}, indent=1, sort_keys=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".api-tokens-")
            with os.fdopen(fd, "w") as out:
                out.write(text + "\n")
            os.replace(tmp, self.path)

    def _parse(self, text: str) -> dict[str, TokenRecord]:
        try:
            return {t["token_id"]: TokenRecord(**t) for t in json.loads(text)["tokens"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise AccountError(f"cannot read the API tokens file {self.path}: {exc}") from exc


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
