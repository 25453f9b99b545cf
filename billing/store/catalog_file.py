"""The ad catalog as one JSON document (`billing.catalog.Catalog.to_json`): what a run of the simulator writes beside
its ground truth, what `adbill catalog export` writes and `import` reads (with the change log beside it,
`billing.store.catalog_db.catalog_document`), and what a data folder written before the catalog's database holds
(`HOME/catalog.json`, taken into the database once: `billing.store.catalog_db`).

Also what every door of a change shares: how a request is read against the catalog and "now" under the catalog's
lock (`ChangeRequest`), the wall clock, the commands that change a catalog with a history, and the author of a
command's change.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable
from pathlib import Path

from billing.catalog import Catalog, CatalogChange, MadeBy
from billing.store.durable import write_whole

Clock = Callable[[], int]
"""Returns "now" as epoch milliseconds, UTC."""

ChangeRequest = Callable[[Catalog | None, int], CatalogChange]
"""A person's request read into a change (of an ad's prices, a campaign's budget or the IP exclusion list) against
the catalog as the database holds it (None: no catalog yet) and "now", both under the catalog's lock
(`billing.catalog_changes` does the reading)."""

CHANGE_COMMANDS = "`adbill catalog create-ad`, `set-price`, `pause`, `resume` or `set-budget`, or `adbill ivt`"
"""What changes a catalog that has a history (named in refusals)."""


def wall_clock_ms() -> int:
    """The wall clock, epoch milliseconds UTC."""
    return time.time_ns() // 1_000_000


def save_catalog(catalog: Catalog, path: str | os.PathLike[str]) -> None:
    """Write atomically and durably: readers see the old file or the new one, never half of one."""
    write_whole(Path(path), catalog.to_json())


def load_catalog(path: str | os.PathLike[str]) -> Catalog:
    """The catalog in the JSON file `path`; ValueError, naming the file, when it does not read or is refused."""
    try:
        return Catalog.from_json(Path(path).read_text())
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"cannot read the ad catalog {path}: {exc}") from exc


def operating_system_user() -> str:
    """Who runs this process, as the operating system names them (the author of a command's change)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def command_made_by(door: str = "command") -> MadeBy:
    """The author of a change made by a command: the operating system's user, through `door` (`command`, or
    `replay` and `simulator` for the changes a replay or a simulation makes)."""
    return MadeBy(operating_system_user(), door)
