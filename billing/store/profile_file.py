"""The advertisers' billing profiles in one JSON file (`HOME/billing-profiles.json`), changed under a lock.

As the catalog's file (`billing.store.catalog_file`): a change reads the file and "now" under an exclusive lock,
adds its entry (`billing.profiles.BillingProfiles.with_profile`, which refuses an effective time in the past) and
renames the new file into place, so two writers (the command and the admin page) never lose one another's change,
and a reader sees the file before or after a change, never half of one.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from billing.profiles import BillingProfile, BillingProfiles
from billing.store.durable import fsync_folder

ProfileRequest = Callable[[int], BillingProfile]
"""A person's request read into a profile entry, given "now" (read under the lock)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ProfileFile:
    """The profiles file: `current()` reads it (an empty history when there is none), `change()` adds an entry."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def current(self) -> BillingProfiles:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return BillingProfiles()
        try:
            return BillingProfiles.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read the billing profiles {self.path}: {exc}") from exc

    def change(self, request: ProfileRequest, clock: Callable[[], int] = wall_clock_ms) -> BillingProfile:
        """Add the entry `request` makes (from "now" read under the lock) and return it as kept (with its version and
        when it was made); ProfileError when refused, and the file is left as it was."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(f".{self.path.name}.lock")
        with lock.open("a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                now = clock()
                profiles = self.current().with_profile(request(now), now)
                self._save(profiles)
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return next(e for a in profiles.advertiser_ids for e in profiles.history(a) if e.version == profiles.version)

    def _save(self, profiles: BillingProfiles) -> None:
        fd, staging = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(profiles.to_json())
                out.flush()
                os.fsync(out.fileno())
            os.replace(staging, self.path)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise
        fsync_folder(self.path.parent)
