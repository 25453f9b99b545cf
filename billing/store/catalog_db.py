"""The ad catalog in PostgreSQL: the one store of the catalog's history when the product has a database
(`ADBILL_DATABASE_URL`), shared by the streaming job, reconciliation, the web UI and the commands on any host.

Tables, each row one entry of a history (docs/catalog-database.md has the columns):
- `advertisers` (each with its one currency), `campaigns` (each of one advertiser) and `ads` (each of one campaign,
  in its advertiser's currency): the constraints refuse a second currency or a campaign shared by two advertisers
  where the change commits, whichever process made it;
- `ad_prices`, `budgets` and `ip_exclusions`: the price, budget and exclusion histories, each entry with the catalog
  version that made it (`billing.catalog`);
- `catalog_changes`: the change log, one row per change, written in the change's own transaction (`who`, `door`,
  `made_at`: `billing.change_log`);
- `catalog_head`: one row, the catalog's version (-1 before the first catalog) and its generation (a new catalog
  replacing one without history starts a new generation).

A change (`CatalogDatabase.change`) locks the head row (`SELECT ... FOR UPDATE`), so changes are numbered one after
the other with no gap and none lost; it reads "now" under that lock (a change that waited never takes effect in the
past), checks the change against the catalog as of the head (`billing.catalog.Catalog.apply`: the same rules as
every door), writes the one entry it adds, the log row and the new head, and commits. A reader
(`CatalogDatabase.current`) reads the head (one row) and, when it moved, only the entries made since the version it
holds: a batch of the stream pays for the changes since its last batch, not for the catalog's size. When the database
cannot be reached, a reader goes on with the catalog it holds and says so (`CatalogDatabase.behind`).

A data folder written before the database (`HOME/catalog.json` and its change log) is taken in once, the first time
the store opens an empty database, and the files are set aside (renamed `.imported`), nothing lost.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from billing.budgets import BudgetChange
from billing.catalog import (
    Ad,
    AdChange,
    BudgetSetting,
    Catalog,
    CatalogChange,
    CatalogError,
    ExclusionSetting,
    MadeBy,
    PriceChange,
)
from billing.change_log import ChangeEntry, Provenance, describe_change, describe_made, merge_log, read_lines
from billing.invalid import ExclusionChange, IpExclusions
from billing.store import database
from billing.store.catalog_file import (
    CHANGE_COMMANDS,
    ChangeRequest,
    Clock,
    load_catalog,
    wall_clock_ms,
)
from billing.store.database import (
    READ_TIMEOUT_S,
    constraint_message,
    integrity_errors,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog_head (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint NOT NULL CHECK (version >= -1),
    generation bigint NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS advertisers (
    advertiser_id text PRIMARY KEY CHECK (advertiser_id <> ''),
    currency char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    UNIQUE (advertiser_id, currency)
);
CREATE TABLE IF NOT EXISTS campaigns (
    campaign_id text PRIMARY KEY CHECK (campaign_id <> ''),
    advertiser_id text NOT NULL REFERENCES advertisers,
    UNIQUE (campaign_id, advertiser_id)
);
CREATE TABLE IF NOT EXISTS ads (
    ad_id text PRIMARY KEY CHECK (ad_id <> ''),
    campaign_id text NOT NULL,
    advertiser_id text NOT NULL,
    currency char(3) NOT NULL,
    FOREIGN KEY (campaign_id, advertiser_id) REFERENCES campaigns (campaign_id, advertiser_id),
    FOREIGN KEY (advertiser_id, currency) REFERENCES advertisers (advertiser_id, currency)
);
CREATE TABLE IF NOT EXISTS ad_prices (
    ad_id text NOT NULL REFERENCES ads,
    version bigint NOT NULL CHECK (version >= 0),
    effective_from bigint NOT NULL CHECK (effective_from >= 0),
    cpc_micros bigint CHECK (cpc_micros >= 0),
    PRIMARY KEY (ad_id, version)
);
CREATE INDEX IF NOT EXISTS ad_prices_by_version ON ad_prices (version);
CREATE TABLE IF NOT EXISTS budgets (
    campaign_id text NOT NULL REFERENCES campaigns,
    version bigint NOT NULL CHECK (version >= 0),
    effective_from bigint NOT NULL CHECK (effective_from >= 0),
    daily_budget_micros bigint CHECK (daily_budget_micros >= 0),
    made_by text,
    door text,
    made_at bigint,
    PRIMARY KEY (campaign_id, version)
);
CREATE INDEX IF NOT EXISTS budgets_by_version ON budgets (version);
CREATE TABLE IF NOT EXISTS ip_exclusions (
    cidr text NOT NULL,
    version bigint NOT NULL CHECK (version >= 0),
    effective_from bigint NOT NULL CHECK (effective_from >= 0),
    excluded boolean NOT NULL,
    made_by text,
    door text,
    made_at bigint,
    PRIMARY KEY (cidr, version)
);
CREATE INDEX IF NOT EXISTS ip_exclusions_by_version ON ip_exclusions (version);
CREATE TABLE IF NOT EXISTS catalog_changes (
    seq bigserial PRIMARY KEY,
    version bigint NOT NULL,
    kind text NOT NULL,
    entry jsonb NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS catalog_changes_one_per_version ON catalog_changes (version)
    WHERE kind <> 'start';
"""
"""The catalog's tables (made when missing, `billing.store.database.make_tables`)."""


class CatalogSource(Protocol):
    """What a reader of the catalog needs: the catalog now and its change log (`CatalogDatabase`; a catalog held in
    memory for the benchmark that writes a data folder without a database, `ops.bench.stories`)."""

    def current(self) -> Catalog: ...
    def changes(self) -> list[ChangeEntry]: ...
    def changes_of(self, versions: Iterable[int]) -> dict[int, ChangeEntry]: ...


class LogEntries(Mapping[int, ChangeEntry]):
    """The catalog's change log as a story or a page reads it: the entries of the versions it asks for, each read
    once, never the whole log (which grows by every change of a network's catalog)."""

    def __init__(self, source: CatalogSource) -> None:
        self.source = source
        self._read: dict[int, ChangeEntry | None] = {}

    def get(self, version: int, default: ChangeEntry | None = None) -> ChangeEntry | None:  # type: ignore[override]
        if version not in self._read:
            self._read[version] = self.source.changes_of([version]).get(version)
        found = self._read[version]
        return default if found is None else found

    def read(self, versions: Iterable[int]) -> None:
        """Read these versions' entries at once (a page about to show many)."""
        missing = [v for v in set(versions) if v not in self._read]
        if missing:
            self._read.update(dict.fromkeys(missing))
            self._read.update(self.source.changes_of(missing))

    def __getitem__(self, version: int) -> ChangeEntry:
        found = self.get(version)
        if found is None:
            raise KeyError(version)
        return found

    def __iter__(self) -> Iterator[int]:
        return iter([v for v, entry in self._read.items() if entry is not None])

    def __len__(self) -> int:
        return sum(1 for entry in self._read.values() if entry is not None)


class DatabaseUnavailable(database.DatabaseUnavailable, CatalogError):
    """The database cannot be reached: the message names it and says what the caller does meanwhile."""


@dataclass(frozen=True)
class Scope:
    """What one change is about, for a door that reads only that (`CatalogDatabase.change`)."""

    ad_ids: tuple[str, ...] = ()
    campaign_ids: tuple[str, ...] = ()
    advertiser_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Held:
    """The catalog a process holds, with the generation it belongs to."""

    catalog: Catalog
    generation: int


EXPORT_FORMAT = "adbill-catalog-export/1"
"""The document `adbill catalog export` writes and `adbill catalog import` reads (docs/catalog-database.md)."""


def catalog_document(catalog: Catalog, changes: Iterable[ChangeEntry]) -> str:
    """The whole catalog with its history (prices, budgets, the IP list) and its change log, as one JSON document:
    the catalog file's format (`Catalog.to_json`) with `export` and `changes` beside it."""
    document = json.loads(catalog.to_json())
    document["export"] = EXPORT_FORMAT
    document["changes"] = [{k: v for k, v in asdict(e).items() if v is not None} for e in changes]
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def read_catalog_document(text: str) -> tuple[Catalog, list[ChangeEntry]]:
    """The catalog and change log of an export (or a catalog file, whose log is then read from the catalog);
    CatalogError, saying what is wrong, when it is neither."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CatalogError(f"not a catalog export: {exc}") from None
    if not isinstance(data, dict):
        raise CatalogError("not a catalog export: a JSON object is expected")
    if data.get("export") not in (None, EXPORT_FORMAT):
        raise CatalogError(f"catalog export format {data.get('export')!r} is not one this version reads")
    names = {f.name for f in fields(ChangeEntry)}
    try:
        changes = [ChangeEntry(**{k: v for k, v in e.items() if k in names}) for e in data.pop("changes", [])]
        catalog = Catalog.from_json(json.dumps(data))
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise CatalogError(f"not a catalog export: {exc}") from None
    return catalog, changes


class CatalogDatabase(database.HeldReader):
    """The catalog's tables at `url`, read by version (`current`), changed in transactions (`change`, `start`).

    `imports`: the catalog file of a data folder written before the database, taken in when the database holds no
    catalog yet (`HOME/catalog.json`; its change log beside it)."""

    TABLES = database.StoreTables("catalog", SCHEMA, "catalog's database", DatabaseUnavailable)

    def __init__(self, url: str, imports: str | os.PathLike[str] | None = None) -> None:
        super().__init__(url, imports)
        self._held: Held | None = None
        self._mutex = threading.Lock()

    # --- Reading ---------------------------------------------------------------------------------------------

    def current(self, fresh: bool = False) -> Catalog:
        """The catalog as the database holds it now, read by version: only the entries made since the version held
        are read. When the database cannot be reached, the catalog held (and `behind` says why), or, `fresh`,
        DatabaseUnavailable; ValueError when none was ever read, or when the database holds no catalog."""
        with self._mutex:
            if self._held is not None and self.waiting() and not fresh:  # the database went away: readers do not wait
                return self._held.catalog
            try:
                with self._connection(READ_TIMEOUT_S) as connection, connection.transaction():
                    head = _head(connection)
                    if head is None:
                        raise self._none_here()
                    self._held = _caught_up(connection, self._held, *head)
                self.behind = None
            except DatabaseUnavailable as exc:
                if fresh:
                    raise
                if self._held is None:
                    raise ValueError(str(exc)) from None
                if self.unreached(exc):
                    log.warning("%s; pricing with catalog version %d meanwhile", exc, self._held.catalog.version)
            return self._held.catalog

    def exists(self) -> bool:
        """Whether the database holds a catalog."""
        with self._connection() as connection:
            return _head(connection) is not None

    def require(self) -> None:
        """That the database answers (DatabaseUnavailable) and holds a catalog (ValueError), without reading it: a
        read of the whole catalog under way in another thread is not waited for."""
        if not self.exists():
            raise self._none_here()

    def _none_here(self) -> ValueError:
        return ValueError(
            f"no ad catalog in {self.where}: make one with `adbill catalog generate` or load one with "
            "`adbill catalog import`"
        )

    def changes(self) -> list[ChangeEntry]:
        """Every change of the catalog, oldest first, one per version (the log rows, written with each change)."""
        with self._connection() as connection:
            rows = connection.execute("SELECT entry FROM catalog_changes ORDER BY version, seq").fetchall()
        return [ChangeEntry(**row[0]) for row in rows]

    def changes_of(self, versions: Iterable[int]) -> dict[int, ChangeEntry]:
        """The change log's entries of `versions` (a start for version 0: the latest), by version: what a page
        shows beside the history entries it lists, without reading the whole log."""
        wanted = sorted(set(versions))
        if not wanted:
            return {}
        with self._connection() as connection:
            rows = connection.execute(
                "SELECT entry FROM catalog_changes WHERE version = ANY(%s) ORDER BY version, seq", (wanted,)
            ).fetchall()
        return {entry.version: entry for entry in (ChangeEntry(**row[0]) for row in rows)}

    # --- Changing --------------------------------------------------------------------------------------------

    def change(
        self,
        change: CatalogChange | ChangeRequest,
        clock: Clock = wall_clock_ms,
        backfill: bool = False,
        made_by: MadeBy | None = None,
        scope: Scope | None = None,
    ) -> Catalog:
        """Make `change` (an ad's price, a campaign's budget or the IP exclusion list: `Catalog.apply`, CatalogError
        when refused) in one transaction with its change log row; the new catalog.

        The head row is locked first: the catalog is brought up to its version, "now" is read from `clock`, a
        `ChangeRequest` is read into a change against both, and the entry, the log row and the new head commit
        together or not at all. The catalog is read before the lock is taken, so that only the entries made
        meanwhile are read under it: a door that starts cold never holds the other doors up for a whole read.

        `scope` (a door that makes one change and ends, `adbill catalog ...`): only what the change is about is
        read (its ad, its campaign's ads, an ad of its advertiser, the campaign's budgets, the IP list), and the
        catalog returned holds only that; a store that holds the whole catalog reads it as always."""
        if scope is None or self._held is not None:
            scope = None
            with contextlib.suppress(ValueError):
                self.current()  # no catalog yet: the change makes the first
        with self._mutex, self._connection() as connection:
            try:
                with connection.transaction():
                    head = _head(connection, lock=True)
                    if head is not None and scope is not None:
                        held: Held | None = Held(_read_scope(connection, head[0], scope), head[1])
                    else:
                        held = _caught_up(connection, self._held, *head) if head is not None else None
                    current = held.catalog if held is not None else None
                    now_ms = clock()
                    asked = (
                        change
                        if isinstance(change, AdChange | BudgetSetting | ExclusionSetting)
                        else change(current, now_ms)
                    )
                    changed = (current if current is not None else Catalog([])).apply(asked, now_ms, backfill)
                    _write_change(connection, current if current is not None else Catalog([]), changed, asked)
                    who = made_by or getattr(asked, "made_by", None)
                    _log(connection, describe_made(changed, asked, Provenance(now_ms, who, backfill)))
                    generation = held.generation if held is not None else 1
                    _set_head(connection, changed.version, generation)
            except integrity_errors() as exc:
                raise CatalogError(f"the catalog refused the change: {constraint_message(exc)}") from None
            self.behind = None  # the database answered: the catalog held is its own again
            if scope is None:
                self._held = Held(changed, generation)
            return changed

    def start(
        self, catalog: Catalog, replace: bool = False, priced: bool = False, made_by: MadeBy | None = None
    ) -> None:
        """Write `catalog` (a generated one, in force from the beginning) as the catalog, in one transaction.

        A catalog already there is replaced only when `replace` is given and it has no history: one that was
        changed (version above 0), or that the streaming job has priced batches with (`priced`), is refused
        (CatalogError), since replacing it would re-price the past and give its version numbers another meaning."""
        with self._mutex, self._connection() as connection, connection.transaction():
            head = _head(connection, lock=True)
            generation = 1
            if head is not None:
                version, generation = head
                if version > 0:
                    raise CatalogError(
                        f"the catalog in {self.where} holds a history of changes (catalog version {version}): a new "
                        "catalog would replace it, re-price the past and number its versions from 0 again; change "
                        f"it with {CHANGE_COMMANDS} instead, or start afresh with a new database"
                    )
                if priced:
                    raise CatalogError(
                        f"the streaming job has priced batches with the catalog in {self.where}: a new catalog would "
                        f"re-price them; change it with {CHANGE_COMMANDS} instead, or start afresh with a new database"
                    )
                if not replace:
                    raise CatalogError(f"the catalog in {self.where} exists; pass --force to replace it")
                _clear(connection)
                generation += 1
            _write_whole(connection, catalog)
            _log(connection, describe_change(catalog, catalog.version, Provenance(wall_clock_ms(), made_by)))
            _set_head(connection, catalog.version, generation)
            self._held = Held(catalog, generation)

    def load(self, catalog: Catalog, changes: Iterable[ChangeEntry]) -> None:
        """Load a whole catalog with its history and change log into a database that holds none (`adbill catalog
        import`, a data folder's files taken in); CatalogError when it holds one."""
        with self._mutex, self._connection() as connection, connection.transaction():
            if _head(connection, lock=True) is not None:
                raise CatalogError(
                    f"the database {self.where} already holds a catalog: import into an empty database, or change "
                    f"this one with {CHANGE_COMMANDS}"
                )
            _write_whole(connection, catalog)
            for entry in merge_log(catalog, changes):
                _log(connection, entry)
            _set_head(connection, catalog.version, 1)
            self._held = Held(catalog, 1)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the catalog's write lock (its head row) across processes and hosts, for as long as the block runs."""
        with self._connection() as connection, connection.transaction():
            _head(connection, lock=True)
            yield

    def close(self) -> None:
        """Nothing to release: the connections are the process's (`billing.store.database.connection_pool`)."""

    # --- Taking in a data folder's files ----------------------------------------------------------------------

    def _take_in(self, connection: psycopg.Connection[Any]) -> list[Path]:
        """Take in a data folder's catalog file and its change log when the database holds no catalog yet (once,
        under the lock of `database.make_tables`, which sets them aside once this commits)."""
        if self.imports is None or not self.imports.exists() or _head(connection) is not None:
            return []
        catalog = load_catalog(self.imports)
        log_file = self.imports.with_name(f"{self.imports.stem}-changes.jsonl")
        lines = log_file.read_text(encoding="utf-8").splitlines() if log_file.exists() else []
        _write_whole(connection, catalog)
        for entry in merge_log(catalog, read_lines(lines)):
            _log(connection, entry)
        _set_head(connection, catalog.version, 1)
        log.warning(
            "took the catalog file %s (version %d, %d ads) into %s; the file is set aside as %s.imported",
            self.imports,
            catalog.version,
            len(catalog),
            self.where,
            self.imports.name,
        )
        return [self.imports, log_file]


# --- Reading the tables ---------------------------------------------------------------------------------------


def _head(connection: psycopg.Connection[Any], lock: bool = False) -> tuple[int, int] | None:
    """The catalog's (version, generation); None when the database holds no catalog. `lock`: held until the
    transaction ends (made first when missing, so that two first writers wait for one another too)."""
    if lock:
        connection.execute("INSERT INTO catalog_head (version, generation) VALUES (-1, 0) ON CONFLICT DO NOTHING")
        connection.execute("SELECT version FROM catalog_head FOR UPDATE")
    row = connection.execute("SELECT version, generation FROM catalog_head").fetchone()
    return None if row is None or row[0] < 0 else (int(row[0]), int(row[1]))


def _caught_up(connection: psycopg.Connection[Any], held: Held | None, version: int, generation: int) -> Held:
    """The catalog at `version`: `held` with the entries made since its version, or read whole (nothing held, or
    another generation)."""
    if held is not None and held.generation == generation:
        if held.catalog.version == version:
            return held
        if held.catalog.version < version:
            return Held(_grown(connection, held.catalog, version), generation)
    return Held(_read_whole(connection, version), generation)


def _grown(connection: psycopg.Connection[Any], catalog: Catalog, version: int) -> Catalog:
    """`catalog` with the entries of versions after its own, up to `version`."""
    since = catalog.version
    touched = [
        row[0]
        for row in connection.execute(
            "SELECT DISTINCT ad_id FROM ad_prices WHERE version > %s AND version <= %s", (since, version)
        )
    ]
    ads = list(_ads(connection, "WHERE a.ad_id = ANY(%s) AND p.version <= %s", (touched, version))) if touched else []
    budgets: dict[str, list[BudgetChange]] = {}
    for campaign_id, entry in _budgets(connection, "WHERE version > %s AND version <= %s", (since, version)):
        budgets.setdefault(campaign_id, []).append(entry)
    exclusions = list(_exclusions(connection, "WHERE version > %s AND version <= %s", (since, version)))
    return catalog.grown(version, ads=ads, budgets=budgets, exclusions=exclusions)


def _read_scope(connection: psycopg.Connection[Any], version: int, scope: Scope) -> Catalog:
    """The part of the catalog at `version` that `scope` names: its ads, every ad of its campaigns (and of the
    campaigns of its ads), one ad of each of its advertisers (its currency), those campaigns' budgets, the IP list.
    Enough for `Catalog.apply` to judge a change about them as it judges it on the whole catalog."""
    found = connection.execute(
        "SELECT ad_id FROM ads WHERE ad_id = ANY(%s) "
        "UNION SELECT ad_id FROM ads WHERE campaign_id = ANY(%s) "
        "   OR campaign_id IN (SELECT campaign_id FROM ads WHERE ad_id = ANY(%s)) "
        "UNION SELECT min(ad_id) FROM ads WHERE advertiser_id = ANY(%s) GROUP BY advertiser_id",
        (list(scope.ad_ids), list(scope.campaign_ids), list(scope.ad_ids), list(scope.advertiser_ids)),
    ).fetchall()
    ad_ids = [row[0] for row in found]
    ads = list(_ads(connection, "WHERE a.ad_id = ANY(%s) AND p.version <= %s", (ad_ids, version))) if ad_ids else []
    campaigns = sorted({ad.campaign_id for ad in ads})
    budgets: dict[str, list[BudgetChange]] = {}
    for campaign_id, entry in _budgets(
        connection, "WHERE campaign_id = ANY(%s) AND version <= %s", (campaigns, version)
    ):
        budgets.setdefault(campaign_id, []).append(entry)
    exclusions = IpExclusions(_exclusions(connection, "WHERE version <= %s", (version,)))
    return Catalog(ads, version, budgets, exclusions)


def _read_whole(connection: psycopg.Connection[Any], version: int) -> Catalog:
    """The whole catalog at `version`, read with the garbage collector paused (`collector_paused`)."""
    with collector_paused():
        ads = _ads(connection, "WHERE p.version <= %s", (version,))
        budgets: dict[str, list[BudgetChange]] = {}
        for campaign_id, entry in _budgets(connection, "WHERE version <= %s", (version,)):
            budgets.setdefault(campaign_id, []).append(entry)
        exclusions = IpExclusions(_exclusions(connection, "WHERE version <= %s", (version,)))
        return Catalog(ads, version, budgets, exclusions)


_paused_lock = threading.Lock()
_paused_by = 0


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's garbage collector paused while the block runs, in every thread of the process (reads that overlap
    keep it paused until the last ends). A catalog read whole builds about ten million objects at a million ads and
    none of them in a cycle; the collector's passes over the growing heap took 30 % of the read (10.6 -> 7.5 s).
    What other threads leave meanwhile is collected after."""
    global _paused_by
    with _paused_lock:
        ours = _paused_by > 0 or gc.isenabled()  # else paused by someone else: theirs to resume
        if ours:
            _paused_by += 1
            gc.disable()
    try:
        yield
    finally:
        if ours:
            with _paused_lock:
                _paused_by -= 1
                if _paused_by == 0:
                    gc.enable()


def _ads(connection: psycopg.Connection[Any], where: str, params: tuple[Any, ...]) -> Iterator[Ad]:
    """The ads the condition selects, each with its whole history up to the condition's version."""
    rows = connection.execute(
        "SELECT a.ad_id, a.campaign_id, a.advertiser_id, a.currency, p.effective_from, p.cpc_micros, p.version "
        f"FROM ads a JOIN ad_prices p USING (ad_id) {where} ORDER BY a.ad_id, p.version",
        params,
    )
    current: list[Any] | None = None
    prices: list[PriceChange] = []
    for ad_id, campaign_id, advertiser_id, currency, effective_from, cpc_micros, entry_version in rows:
        if current is None or current[0] != ad_id:
            if current is not None:
                yield _ad(current, prices)
            current, prices = [ad_id, campaign_id, advertiser_id, currency], []
        prices.append(PriceChange.stored(effective_from, cpc_micros, entry_version))
    if current is not None:
        yield _ad(current, prices)


def _ad(owners: list[Any], prices: list[PriceChange]) -> Ad:
    """An ad read from the tables, as they hold it: checked when it was written (`Ad.stored`)."""
    ad_id, campaign_id, advertiser_id, currency = owners
    return Ad.stored(ad_id, campaign_id, advertiser_id, currency.strip(), tuple(prices))


def _budgets(
    connection: psycopg.Connection[Any], where: str, params: tuple[Any, ...]
) -> Iterator[tuple[str, BudgetChange]]:
    rows = connection.execute(
        "SELECT campaign_id, effective_from, daily_budget_micros, version, made_by, door, made_at "
        f"FROM budgets {where} ORDER BY version",
        params,
    )
    for campaign_id, *columns in rows:
        yield campaign_id, BudgetChange(*columns)


def _exclusions(connection: psycopg.Connection[Any], where: str, params: tuple[Any, ...]) -> Iterator[ExclusionChange]:
    rows = connection.execute(
        "SELECT cidr, effective_from, excluded, version, made_by, door, made_at "
        f"FROM ip_exclusions {where} ORDER BY version",
        params,
    )
    for columns in rows:
        yield ExclusionChange(*columns)


# --- Writing the tables ---------------------------------------------------------------------------------------


def _write_change(connection: psycopg.Connection[Any], before: Catalog, after: Catalog, asked: CatalogChange) -> None:
    """Write the one entry `asked` added (version `after.version`), with the owners of a new ad."""
    version = after.version
    if isinstance(asked, AdChange):
        ad = after[asked.ad_id]
        if asked.ad_id not in before:
            _write_owners(connection, [ad])
        entry = next(p for p in ad.prices if p.version == version)
        connection.execute(
            "INSERT INTO ad_prices (ad_id, version, effective_from, cpc_micros) VALUES (%s, %s, %s, %s)",
            (ad.ad_id, version, entry.effective_from, entry.cpc_micros),
        )
    elif isinstance(asked, BudgetSetting):
        budget = next(b for b in after.budget_history(asked.campaign_id) if b.version == version)
        _insert_budgets(connection, [(asked.campaign_id, budget)])
    else:
        change = next(c for c in after.exclusions.changes if c.version == version)
        _insert_exclusions(connection, [change])


def _write_whole(connection: psycopg.Connection[Any], catalog: Catalog) -> None:
    """Write every row of `catalog` (into empty tables), with COPY: a million ads in seconds, not minutes."""
    _write_owners(connection, catalog)
    with connection.cursor().copy("COPY ad_prices (ad_id, version, effective_from, cpc_micros) FROM STDIN") as copy:
        for ad in catalog:
            for entry in ad.prices:
                copy.write_row((ad.ad_id, entry.version, entry.effective_from, entry.cpc_micros))
    _insert_budgets(connection, [(c, b) for c, entries in catalog.budgets.items() for b in entries])
    _insert_exclusions(connection, catalog.exclusions.changes)


def _write_owners(connection: psycopg.Connection[Any], ads: Iterable[Ad]) -> None:
    """The advertisers, campaigns and ads of `ads` that the tables lack (a new advertiser, campaign, ad)."""
    ads = list(ads)
    if len(ads) == 1:
        ad = ads[0]
        connection.execute(
            "INSERT INTO advertisers (advertiser_id, currency) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (ad.advertiser_id, ad.currency),
        )
        connection.execute(
            "INSERT INTO campaigns (campaign_id, advertiser_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (ad.campaign_id, ad.advertiser_id),
        )
        connection.execute(
            "INSERT INTO ads (ad_id, campaign_id, advertiser_id, currency) VALUES (%s, %s, %s, %s)",
            (ad.ad_id, ad.campaign_id, ad.advertiser_id, ad.currency),
        )
        return
    advertisers = {ad.advertiser_id: ad.currency for ad in ads}
    campaigns = {ad.campaign_id: ad.advertiser_id for ad in ads}
    cursor = connection.cursor()
    with cursor.copy("COPY advertisers (advertiser_id, currency) FROM STDIN") as copy:
        for row in advertisers.items():
            copy.write_row(row)
    with cursor.copy("COPY campaigns (campaign_id, advertiser_id) FROM STDIN") as copy:
        for row in campaigns.items():
            copy.write_row(row)
    with cursor.copy("COPY ads (ad_id, campaign_id, advertiser_id, currency) FROM STDIN") as copy:
        for ad in ads:
            copy.write_row((ad.ad_id, ad.campaign_id, ad.advertiser_id, ad.currency))


def _insert_budgets(connection: psycopg.Connection[Any], entries: list[tuple[str, BudgetChange]]) -> None:
    if entries:
        connection.cursor().executemany(
            "INSERT INTO budgets (campaign_id, version, effective_from, daily_budget_micros, made_by, door, made_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(c, b.version, b.effective_from, b.daily_budget_micros, b.made_by, b.door, b.made_at) for c, b in entries],
        )


def _insert_exclusions(connection: psycopg.Connection[Any], changes: Iterable[ExclusionChange]) -> None:
    rows = [(c.cidr, c.version, c.effective_from, c.excluded, c.made_by, c.door, c.made_at) for c in changes]
    if rows:
        connection.cursor().executemany(
            "INSERT INTO ip_exclusions (cidr, version, effective_from, excluded, made_by, door, made_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            rows,
        )


def _log(connection: psycopg.Connection[Any], entry: ChangeEntry) -> None:
    connection.execute(
        "INSERT INTO catalog_changes (version, kind, entry) VALUES (%s, %s, %s::jsonb)",
        (entry.version, entry.kind, json.dumps({k: v for k, v in asdict(entry).items() if v is not None})),
    )


def _set_head(connection: psycopg.Connection[Any], version: int, generation: int) -> None:
    connection.execute(
        "INSERT INTO catalog_head (version, generation) VALUES (%s, %s) "
        "ON CONFLICT (one) DO UPDATE SET version = excluded.version, generation = excluded.generation",
        (version, generation),
    )


def _clear(connection: psycopg.Connection[Any]) -> None:
    """Every row of a catalog without history (replaced by a new one); its log's rows stay (each start is a change)."""
    connection.execute("TRUNCATE ad_prices, budgets, ip_exclusions, ads, campaigns, advertisers")
