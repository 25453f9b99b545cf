"""The ad catalog's file: the one store of the catalog's history, shared by the streaming job, reconciliation, the
web UI and the commands (`HOME/catalog.json`, `billing.layout.DataLayout.catalog_file`).

Why a file in the data folder: every part of the product already shares that folder (the ledger, the archive and
the exports live there, on one machine and, as a shared volume, on a cluster), a reader sees a change by comparing
the file's identity (`os.stat`) before re-reading it, and a change is one rename, so a reader sees the catalog
before or after it, never half of it. Changes are made under an exclusive lock (`CatalogStore.change`), so two
writers (a command and the admin page) never lose one another's change; each is numbered (`Catalog.version`). A
change is read against the catalog the lock holds and takes effect from "now" read under the lock too: a change that
waited for another writer never takes effect in the past. A new catalog (`CatalogStore.start`, `adbill catalog
generate`) never replaces one with a history: that would re-price the past and number its versions again from 0.

Beside the file, its change log (`catalog-changes.jsonl` beside `catalog.json`, `billing.change_log`): one line per
change, appended under the same lock after the catalog is written, saying who made it, through which door and when
(`MadeBy`); `changes()` reads it with the catalog, one entry per version.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from billing.catalog import AdChange, BudgetSetting, Catalog, CatalogChange, CatalogError, ExclusionSetting, MadeBy
from billing.change_log import ChangeEntry, describe_change, merge_log, read_lines
from billing.store.durable import fsync_folder

Clock = Callable[[], int]
"""Returns "now" as epoch milliseconds, UTC."""

ChangeRequest = Callable[[Catalog | None, int], CatalogChange]
"""A person's request read into a change (of an ad's prices, a campaign's budget or the IP exclusion list) against
the catalog as the file holds it (None: no file yet) and "now", both under the catalog's lock
(`billing.catalog_changes` does the reading)."""

CHANGE_COMMANDS = "`adbill catalog create-ad`, `set-price`, `pause`, `resume` or `set-budget`, or `adbill ivt`"
"""What changes a catalog that has a history (named in refusals)."""


def wall_clock_ms() -> int:
    """The wall clock, epoch milliseconds UTC."""
    return time.time_ns() // 1_000_000


def save_catalog(catalog: Catalog, path: str | os.PathLike[str]) -> None:
    """Write atomically and durably: readers see the old file or the new one, never half of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".catalog-")
    with os.fdopen(fd, "w") as out:
        out.write(catalog.to_json())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
    fsync_folder(target.parent)


def load_catalog(path: str | os.PathLike[str]) -> Catalog:
    """The catalog in the JSON file `path`; ValueError, naming the file, when it does not read or is refused."""
    try:
        return Catalog.from_json(Path(path).read_text())
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"cannot read the ad catalog {path}: {exc}") from exc


class CatalogStore:
    """The catalog file, read again whenever it changed (`current`), changed under a lock (`change`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None
        self._catalog: Catalog | None = None
        self._mutex = threading.Lock()
        self.behind: str | None = None
        """Always None: a file is read where it lies (`billing.store.catalog_db.CatalogDatabase.behind`)."""

    @property
    def where(self) -> str:
        """The file, as a person reads it in a message."""
        return str(self.path)

    def exists(self) -> bool:
        """Whether the file holds a catalog."""
        return self.path.exists()

    def current(self) -> Catalog:
        """The catalog as the file holds it now; the last good one when the file is being replaced or is refused
        after a good read (ValueError when no good read was ever made)."""
        with self._mutex:
            try:
                stat = self.path.stat()
            except OSError:
                if self._catalog is not None:
                    return self._catalog
                raise ValueError(f"cannot read the ad catalog {self.path}: no such file") from None
            identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if identity != self._seen or self._catalog is None:
                try:
                    self._catalog = load_catalog(self.path)
                except ValueError:
                    if self._catalog is None:
                        raise
                    return self._catalog
                self._seen = identity
            return self._catalog

    def change(
        self,
        change: CatalogChange | ChangeRequest,
        clock: Clock = wall_clock_ms,
        backfill: bool = False,
        made_by: MadeBy | None = None,
    ) -> Catalog:
        """Make `change` (an ad's price, a campaign's budget or the IP exclusion list: `Catalog.apply`, CatalogError
        when refused) and write the file; the new catalog; the change log gets its entry (who, when, which door).

        Everything happens under the lock: the catalog is read, "now" is read from `clock` (a change that waited
        for the lock takes effect when it is made, never before), a `ChangeRequest` is read into a change against
        both, and the file is written. Every change is numbered by the same versions and refused by the same
        rules, whichever door it came through."""
        with self.locked():
            current = load_catalog(self.path) if self.path.exists() else None
            now_ms = clock()
            asked = (
                change if isinstance(change, AdChange | BudgetSetting | ExclusionSetting) else change(current, now_ms)
            )
            changed = (current or Catalog([])).apply(asked, now_ms, backfill)
            save_catalog(changed, self.path)
            self._record(changed, now_ms, made_by or getattr(asked, "made_by", None), backfill)
            return changed

    def start(
        self, catalog: Catalog, replace: bool = False, priced: bool = False, made_by: MadeBy | None = None
    ) -> None:
        """Write `catalog` (a generated one, in force from the beginning) as the file, under the lock.

        An existing file is replaced only when `replace` is given and it has no history: a catalog that was changed
        (version above 0), or that the streaming job has priced batches with (`priced`), is refused (CatalogError),
        since replacing it would re-price the past and give its version numbers another meaning."""
        with self.locked():
            if self.path.exists():
                held = load_catalog(self.path)
                if held.version > 0:
                    raise CatalogError(
                        f"{self.path} holds a history of changes (catalog version {held.version}): a new catalog "
                        "would replace it, re-price the past and number its versions from 0 again; change it with "
                        f"{CHANGE_COMMANDS} instead, or start afresh in a new data folder (ADBILL_HOME)"
                    )
                if priced:
                    raise CatalogError(
                        f"the streaming job has priced batches with {self.path}: a new catalog would re-price "
                        f"them; change it with {CHANGE_COMMANDS} instead, or start afresh in a new data folder "
                        "(ADBILL_HOME)"
                    )
                if not replace:
                    raise CatalogError(f"{self.path} exists; pass --force to replace it")
            save_catalog(catalog, self.path)
            self._record(catalog, wall_clock_ms(), made_by, backfill=False)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the catalog's write lock (a file beside it), across processes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # --- The change log --------------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """The change log beside the catalog file: `catalog-changes.jsonl` for `catalog.json`."""
        return self.path.with_name(f"{self.path.stem}-changes.jsonl")

    def changes(self) -> list[ChangeEntry]:
        """Every change of the catalog, oldest first, one per version (`billing.change_log.merge_log`)."""
        try:
            lines = self.log_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        return merge_log(self.current(), read_lines(lines))

    def _record(self, catalog: Catalog, now_ms: int, made_by: MadeBy | None, backfill: bool) -> None:
        """Append the change that made `catalog` to the log, under the lock the caller holds, flushed to disk. A
        line torn by a crash is closed first, so that it spoils no other line."""
        line = describe_change(catalog, catalog.version, now_ms, made_by, backfill).to_json()
        with open(self.log_path, "ab") as log:
            if log.tell() > 0:
                with open(self.log_path, "rb") as tail:
                    tail.seek(-1, os.SEEK_END)
                    if tail.read(1) != b"\n":
                        log.write(b"\n")
            log.write(line.encode("utf-8") + b"\n")
            log.flush()
            os.fsync(log.fileno())


def operating_system_user() -> str:
    """Who runs this process, as the operating system names them (the author of a command's change)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
