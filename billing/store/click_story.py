"""A click's story from the data folder: the evidence found in its Parquet files (`billing.store.click_files`, read
with DuckDB; no index), told by `billing.story.tell` with the catalog, its change log and the crawler list.

One lookup reads: the rows of the click id in its day's periods (the click's day, when given; else the newest day
that holds it), the handful of files they name, the archive's files of the click's ad and user around its time (the
few whose statistics of event times meet the window), the export's manifest of a closed period, and, for a campaign
with a daily budget, the books of its day up to the click.

With a horizon (`story_days`, from the doors' settings, counted back from the newest day the data folder holds, or
today by the clock they pass when that is earlier: `newest_day`): without a day, only the last `story_days` days
are searched, and a click not among them while the data folder holds older days gets the plain
answer (`billing.story.beyond_horizon`), never "never received"; a day older than them is told from its exports only
(`billing.story.tell_from_exports`); a day after today is refused. Used by `adbill explain`, the click's page and
`GET /api/v1/clicks/ID` (each with an optional day), and for an ad's clicks by price.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from billing.budgets import day_start
from billing.invalid import DEFAULT_RULES, IvtRules
from billing.layout import DataLayout
from billing.periods import Periods
from billing.rule import ATTRIBUTION_WINDOW_MS
from billing.store.archive import ARCHIVE_COLUMNS
from billing.store.catalog_db import CatalogSource, LogEntries
from billing.store.click_files import (
    ARCHIVE_CLICK,
    ARCHIVE_IMPRESSION,
    CONFLICTS,
    CORRECTION,
    EXPORT,
    EXPORT_NOT_CHARGED,
    LEDGER,
    NOT_CHARGED,
    QUARANTINE,
    RELEASED,
    UNBILLED,
    ClickFiles,
    read_located,
)
from billing.store.compaction import SOURCE_BATCH
from billing.store.crawler_list import crawler_list, kept_list
from billing.store.export_files import read_manifest
from billing.story import (
    NOT_RECEIVED,
    QUARANTINED,
    ClickStory,
    Evidence,
    Searched,
    beyond_horizon,
    by_price_counted,
    tell,
    tell_from_exports,
)

NEARBY_IMPRESSIONS_MS = 60_000
"""How far before the click its ad's and user's impressions are shown (the nearest outside the 10 s window too)."""

_ARCHIVE_COLUMNS = (
    *(c for c in ARCHIVE_COLUMNS if c not in ("event_type", "value", "period_start_ms", "period", "batch_id")),
    SOURCE_BATCH,
)
"""What a story reads of an archive file: the event's fields but its raw bytes, and the batch a compacted row came
from (the type, period and batch of a row written by the stream are in its path)."""


class ClickStories:
    """Stories of the clicks of one data folder."""

    def __init__(
        self,
        layout: DataLayout,
        catalog: CatalogSource,
        periods: Periods | None = None,
        rules: IvtRules = DEFAULT_RULES,
        clicks_topic: str | None = None,
        files: ClickFiles | None = None,
        story_days: int | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.layout = layout
        self.catalog = catalog
        self.periods = periods or Periods()
        self.rules = rules
        self.clicks_topic = clicks_topic
        self.files = files or ClickFiles(layout)
        self.story_days = story_days
        self.clock = clock or (lambda: int(time.time() * 1000))

    def today(self) -> dt.date:
        """Today's UTC day by the clock."""
        return dt.datetime.fromtimestamp(self.clock() / 1000, dt.UTC).date()

    def newest_day(self, today: dt.date) -> dt.date:
        """The day the horizon counts back from: the newest day the data folder holds a period of, or today when
        it holds none or one after today. While the stream runs that is today; a folder of recorded traffic, or one
        whose stream stopped weeks ago, keeps its last `story_days` days told in full."""
        newest = next(iter(self.files.periods()), None)
        if newest is None:
            return today
        return min(today, dt.datetime.strptime(newest[:8], "%Y%m%d").date())

    def searched(self, day: dt.date | None = None) -> Searched:
        """Where a story of a click of `day` (None: not given) looks: that day, or the `story_days` days before the
        newest day the data holds, and that day (`newest_day`; every day without a horizon); a day past the
        horizon, in its exports only. A day after today is refused (ValueError)."""
        today = self.today()
        if day is not None and day > today:
            raise ValueError(f"{day.isoformat()} is after today ({today.isoformat()}, UTC): no click of it yet")
        if self.story_days is None:
            return Searched(day.isoformat() if day else None)
        since = self.newest_day(today) - dt.timedelta(days=self.story_days)
        if day is None:
            return Searched(None, since.isoformat(), self.story_days)
        past = day < since
        return Searched(day.isoformat(), since.isoformat(), self.story_days, past, past)

    def tell(self, click_id: str, day: dt.date | None = None) -> ClickStory:
        """The click's whole story (`billing.story.tell`), found in `day`'s periods when given (its UTC day); without
        it, in the last `story_days` days; a day past them from its exports (`billing.story.tell_from_exports`). A
        day after today is refused (ValueError)."""
        searched = self.searched(day)
        if day is not None and searched.from_exports:
            found = read_located(self.files.export_rows_of(click_id, day))
            evidence = Evidence(
                click_id,
                export_rows=[r for r in found if r["found_in"] == EXPORT],
                export_not_charged=[r for r in found if r["found_in"] == EXPORT_NOT_CHARGED],
            )
            exported = len(self.files.exported_periods(day))
            return tell_from_exports(evidence, replace(searched, exported_periods=exported))
        since = dt.date.fromisoformat(searched.since) if day is None and searched.since else None
        evidence = self.evidence(click_id, day=day, since=since)
        story = replace(self._tell(evidence), searched=searched)
        if since is not None and story.outcome.status in (NOT_RECEIVED, QUARANTINED) and self._older(since):
            return beyond_horizon(evidence, searched)
        return story

    def _older(self, since: dt.date) -> bool:
        """Whether the data folder holds a period of a day before `since` (past the horizon)."""
        first = since.strftime("%Y%m%d")
        return any(p[:8] < first for p in self.files.periods())

    def _tell(self, evidence: Evidence) -> ClickStory:
        catalog = self.catalog.current()
        crawlers = crawler_list()

        def bot_patterns(user_agent: str, version: str | None) -> list[str]:
            # A closed period's own version where its patterns were kept (`billing.store.crawler_list.keep_list`).
            listed = (kept_list(self.layout.crawler_lists, version) if version else None) or crawlers
            return listed.matching(user_agent) if listed.matches(user_agent) else []

        return tell(
            evidence,
            catalog,
            LogEntries(self.catalog),
            self.periods,
            self.rules,
            bot_patterns=bot_patterns,
            crawler_list_version=crawlers.version,
        )

    def evidence(self, click_id: str, day: dt.date | None = None, since: dt.date | None = None) -> Evidence:
        """Everything the data folder holds of `click_id` and around it (`billing.story.Evidence`), in `day`'s
        periods when given, else in the days from `since` (every day when None)."""
        found = read_located(self.files.rows_of(click_id, day, since))
        kinds: dict[str, list[dict[str, Any]]] = {}
        for row in found:
            kinds.setdefault(row["found_in"], []).append(row)
        copies = kinds.get(ARCHIVE_CLICK, [])
        topics = {self.clicks_topic} if self.clicks_topic else {r.get("topic") for r in copies}
        evidence = Evidence(
            click_id,
            copies=copies,
            quarantined=[r for r in kinds.get(QUARANTINE, []) if r.get("topic") in topics],
            released=[r for r in kinds.get(RELEASED, []) if r.get("event_type") == "click"],
            conflicts=[r for r in kinds.get(CONFLICTS, []) if r.get("event_type") == "click"],
            ledger=kinds.get(LEDGER, []),
            unbilled=kinds.get(UNBILLED, []),
            not_charged=kinds.get(NOT_CHARGED, []),
            corrections=kinds.get(CORRECTION, []),
            export_rows=kinds.get(EXPORT, []),
            export_not_charged=kinds.get(EXPORT_NOT_CHARGED, []),
        )
        standing = _first(copies)
        closed = self.files.closed_periods()
        named = {r.get("period") for r in found} | {r.get("corrects_period") for r in found}
        if standing is not None:
            named.add(self.periods.key_of(standing["event_time"]))
        evidence.closed = {p for p in named if p in closed}
        for period in evidence.closed:
            try:
                evidence.judged_with[period] = read_manifest(self.layout.export(period)).judged_with
            except (OSError, ValueError, KeyError):
                evidence.judged_with[period] = {}
        if standing is None:
            return evidence
        at, ad_id, user_id = standing["event_time"], standing["ad_id"], standing["user_id"]
        evidence.impressions = self._archive(
            ARCHIVE_IMPRESSION, at - NEARBY_IMPRESSIONS_MS, at + ATTRIBUTION_WINDOW_MS, user_id, ad_id
        )
        judged = evidence.judged_with.get(self.periods.key_of(at), {})
        window = max(
            self.rules.flood_window_ms,
            self.rules.duplicate_window_ms,
            int(judged.get("flood_window_ms") or 0),
            int(judged.get("duplicate_window_ms") or 0),
        )
        evidence.user_clicks = self._archive(ARCHIVE_CLICK, at - window, at + window, user_id)
        catalog = self.catalog.current()
        ad = catalog.get(ad_id)
        if ad is not None and catalog.budgets.get(ad.campaign_id):
            evidence.budget_day = self.files.book_rows(
                self.periods.key_of(day_start(at)), self.periods.key_of(at), campaign_id=ad.campaign_id
            )
        return evidence

    def _archive(self, kind: str, low: int, high: int, user_id: str, ad_id: str | None = None) -> list[dict[str, Any]]:
        """The archive's rows of `user_id` (and `ad_id`) with event times in [low, high], from the files whose span
        meets it."""
        periods = self.periods.range_keys(self.periods.start_of(low), self.periods.end_of(high))
        rows: list[dict[str, Any]] = []
        for path in self.files.archive_files(kind, periods, low, high):
            rows += _matching(path, user_id, ad_id, low, high)
        return rows

    def by_price(self, ad_id: str, first_period: str, last_period: str) -> list[tuple[int, int]]:
        """(price, net clicks) of the ad's clicks in the periods `first_period` to `last_period`, as the books
        count them (`billing.story.by_price`), dearest first."""
        closed = self.files.closed_periods()
        rows = self.files.price_rows(first_period, last_period, ad_id)
        return by_price_counted(rows, lambda period: period in closed)


def _first(copies: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The copy that stands: the first by arrival."""
    ordered = sorted(copies, key=lambda r: (r.get("received_ms") or 0, r.get("partition") or 0, r.get("offset") or 0))
    return ordered[0] if ordered else None


def _matching(path: Path, user_id: str, ad_id: str | None, low: int, high: int) -> list[dict[str, Any]]:
    """A file's archive rows of the user (and ad) within [low, high], with its `period` and `batch_id`."""
    try:
        parquet = pq.ParquetFile(path)
        names = set(parquet.schema_arrow.names)
        table = parquet.read(columns=[c for c in _ARCHIVE_COLUMNS if c in names])
    except (OSError, pa.ArrowException):
        return []
    mask = pc.and_(
        pc.equal(table.column("user_id"), user_id),
        pc.and_(pc.greater_equal(table.column("event_time"), low), pc.less_equal(table.column("event_time"), high)),
    )
    if ad_id is not None:
        mask = pc.and_(mask, pc.equal(table.column("ad_id"), ad_id))
    period = next((p.removeprefix("period=") for p in path.parts if p.startswith("period=")), None)
    batch = next((int(p.removeprefix("batch_id=")) for p in path.parts if p.startswith("batch_id=")), None)
    out = []
    for row in table.filter(mask).to_pylist():
        source = row.pop(SOURCE_BATCH, None)  # a compacted file's (`billing.store.compaction`): the row's own batch
        out.append({**row, "period": period, "batch_id": batch if source is None else source})
    return out
