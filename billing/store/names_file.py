"""The names people give campaigns and ads (`HOME/names.json`): words beside the ids on the pages and invoices.

A name is for people only: it prices nothing and bills nothing, so it has no history and may change at any time
(an invoice keeps the campaign names it was issued with). Changed under a lock and renamed into place, as the
catalog's file is, so two admins never lose one another's name and a reader sees the file whole.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from billing.store.durable import fsync_folder

KINDS = ("campaign", "ad")
MAX_NAME = 120


class NamingError(ValueError):
    """A name that is refused: empty, too long, or of something that is neither a campaign nor an ad."""


@dataclass(frozen=True)
class Names:
    """Campaign and ad names by id."""

    campaigns: dict[str, str] = field(default_factory=dict)
    ads: dict[str, str] = field(default_factory=dict)

    def of(self, kind: str, item_id: str) -> str:
        """The name of a campaign or an ad, or empty."""
        return (self.campaigns if kind == "campaign" else self.ads).get(item_id, "")


class NamesFile:
    """The names file: `current()` reads it (no names when there is none), `set()` names one campaign or ad."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None
        self._names = Names()

    def current(self) -> Names:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return Names()
        identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if identity != self._seen:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._names = Names(dict(data.get("campaigns", {})), dict(data.get("ads", {})))
            self._seen = identity
        return self._names

    def set(self, kind: str, item_id: str, name: str) -> Names:
        """Name a campaign or an ad (an empty name removes it); NamingError when refused. The names after it."""
        if kind not in KINDS:
            raise NamingError(f"a name is given to a campaign or an ad, not to a {kind!r}")
        name = " ".join(name.split())
        if len(name) > MAX_NAME:
            raise NamingError(f"a name is at most {MAX_NAME} characters; got {len(name)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.with_name(f".{self.path.name}.lock").open("a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                now = self.current()
                campaigns, ads = dict(now.campaigns), dict(now.ads)
                named = campaigns if kind == "campaign" else ads
                if name:
                    named[item_id] = name
                else:
                    named.pop(item_id, None)
                self._write({"campaigns": dict(sorted(campaigns.items())), "ads": dict(sorted(ads.items()))})
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        return self.current()

    def _write(self, data: dict[str, dict[str, str]]) -> None:
        fd, staging = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(staging, self.path)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise
        fsync_folder(self.path.parent)
