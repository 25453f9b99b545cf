"""The simulator's ground truth (`GroundTruth`): what a simulated run must be billed, worked out from every arrival
it sent by the plain rule (`billing.rule.bill`) with the catalog as it changed, held on disk in partitions for long
runs; the charged clicks and those not charged with their reasons (`Truth`), written beside the run's other files.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import os
import pickle  # only for the ground truth's own spill files, written and read by this process  # nosec B403
import shutil
import tempfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from billing.budgets import OVER_BUDGET, Candidate, charge_in_order, parse_day, utc_day
from billing.catalog import Catalog, Unbillable
from billing.events import Click, Event, Impression
from billing.intake import Intake, QuarantineReason
from billing.invalid import DEFAULT_RULES, INVALID_REASONS, IvtRules
from billing.periods import DAY_MS
from billing.rule import (
    BILLABLE_FIELDS,
    NOT_CHARGED_FIELDS,
    BillableClick,
    NotCharged,
    bill,
    not_charged_row,
)
from billing.store.crawler_list import CrawlerList, crawler_list
from billing.store.durable import write_whole
from producers.arrivals import Arrival, ArrivalKind, Made, Timing
from producers.wire import RawRecord

EVENTS_PER_TRUTH_PARTITION = 500_000
"""Events the ground truth holds in memory at a time; a longer run is partitioned on disk."""


RECEIVED_TIME = "arrival_ms: the simulated receive time (event time + arrival delay), never before event_time"

NOT_CHARGED_REASONS: tuple[str, ...] = (
    Unbillable.UNKNOWN_AD.value,
    Unbillable.AD_PAUSED.value,
    *INVALID_REASONS,
    OVER_BUDGET,
)
"""Why a billable click is not charged, in the contract's order of precedence."""

NOT_CHARGED_FILE = "not_charged.jsonl"
"""The billable clicks not charged, beside the charged ones (`billable.jsonl`) in a run folder."""


@dataclass
class Truth:
    """The charged clicks (in a file, sorted by click_id), the billable ones not charged with their reasons (another
    file, sorted the same way), and the counts of one run."""

    billable_path: Path
    counts: dict[str, Any] = field(default_factory=dict)
    not_charged_path: Path | None = None

    def billable(self) -> Iterator[dict[str, Any]]:
        """The charged clicks, one dict (`BillableClick.to_dict()`) each, by click_id."""
        with open(self.billable_path, encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)

    def not_charged(self) -> Iterator[dict[str, Any]]:
        """The billable clicks not charged, one dict (`NotCharged.to_dict()`, with its `reason`) each, by click_id."""
        if self.not_charged_path is None:
            return
        with open(self.not_charged_path, encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)

    def outcomes(self) -> dict[str, str]:
        """click_id -> `charged` or the reason it is not, for every billable click (held in memory: for tests)."""
        found = {row["click_id"]: "charged" for row in self.billable()}
        found.update((row["click_id"], row["reason"]) for row in self.not_charged())
        return found


class GroundTruth:
    """Observes arrivals in send order and computes, with `Intake` and `billing.rule.bill`, what must be charged and
    why the other billable clicks are not.

    `crawlers` is the crawler list the rule `known_bot` matches (default: the installed one), `rules` the invalid
    traffic thresholds. With `partitions` > 1 the events are spilled to `workdir` by event id (the intake's state is
    per id), the accepted ones re-spilled by user (attribution's state is per ad and user, the invalid traffic rules
    need all of a user's clicks) and billed without budgets, and the clicks that would be charged spilled once more
    by campaign and UTC day, where the budgets take them in event-time order (`charge_in_order`): each step holds
    one partition in memory.
    """

    def __init__(
        self,
        catalog: Catalog,
        partitions: int = 1,
        workdir: str | os.PathLike[str] | None = None,
        crawlers: CrawlerList | None = None,
        rules: IvtRules = DEFAULT_RULES,
    ) -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        self.catalog = catalog
        self.partitions = partitions
        self.crawlers = crawlers if crawlers is not None else crawler_list()
        self.rules = rules
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="adbill-truth-") if workdir is None else workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sent: Counter[str] = Counter()
        self.primary: Counter[str] = Counter()
        self.timing: Counter[str] = Counter()
        self.duplicates: Counter[str] = Counter()
        self.bad: Counter[str] = Counter()
        self.raw_quarantined: Counter[str] = Counter()
        self.made: Counter[str] = Counter()
        self.first_event_ms: int | None = None
        self.last_event_ms: int | None = None
        self._intake = Intake() if partitions == 1 else None
        self._spill = _Spill(self.workdir / "by-id", partitions) if partitions > 1 else None

    @classmethod
    def for_arrivals(cls, expected_arrivals: int, catalog: Catalog, workdir: str | None = None) -> GroundTruth:
        """Sized for the run (`SimulationConfig.expected_arrivals`): one partition per `EVENTS_PER_TRUTH_PARTITION`
        arrivals."""
        partitions = max(1, math.ceil(expected_arrivals / EVENTS_PER_TRUTH_PARTITION))
        return cls(catalog, partitions, workdir)

    def observe(self, arrival: Arrival) -> None:
        """Take the next arrival, in send order."""
        item = arrival.item
        if isinstance(item, RawRecord):
            self.sent["raw"] += 1
            reason = arrival.expected_reason or QuarantineReason.UNDECODABLE
            self.bad[reason.value] += 1
            # Raw records never decode to an event: the pipeline quarantines them before the intake.
            self.raw_quarantined[reason.value] += 1
            return
        self.sent[item.type] += 1
        if arrival.kind == ArrivalKind.EVENT:
            self.primary[item.type] += 1
            self.timing[arrival.timing.value] += 1
            if arrival.made is not None and isinstance(item, Click):
                self.made[arrival.made.value] += 1
            if self.first_event_ms is None or item.event_time < self.first_event_ms:
                self.first_event_ms = item.event_time
            if self.last_event_ms is None or item.event_time > self.last_event_ms:
                self.last_event_ms = item.event_time
        elif arrival.kind == ArrivalKind.DUPLICATE:
            self.duplicates[item.type] += 1
        elif arrival.expected_reason is not None:
            self.bad[arrival.expected_reason.value] += 1
        if self._intake is not None:
            self._intake.admit(item, arrival.arrival_ms)
        else:
            assert self._spill is not None
            self._spill.add(item.event_id, (arrival.arrival_ms, *_event_tuple(item)))

    def finish(
        self, billable_path: str | os.PathLike[str], not_charged_path: str | os.PathLike[str] | None = None
    ) -> Truth:
        """Write the charged clicks to `billable_path` and the billable ones not charged to `not_charged_path`
        (default: `not_charged.jsonl` beside it), both JSON Lines by click_id, and return the counts."""
        billable_target = Path(billable_path)
        refused_target = Path(not_charged_path) if not_charged_path else billable_target.with_name(NOT_CHARGED_FILE)
        intake_counts: Counter[str] = Counter()
        charged_runs: list[Path] = []
        refused_runs: list[Path] = []
        figures = _Figures(self.catalog)
        is_bot = self.crawlers.matches
        if self._intake is not None:
            intake_counts.update(self._intake.counts)
            billing = bill(self._intake.impressions, self._intake.clicks, self.catalog, is_bot=is_bot, rules=self.rules)
            self._intake = Intake()  # release the events
            charged_runs.append(self._write_charged(billing.charged, figures, 0))
            refused_runs.append(self._write_refused(billing.not_charged, figures, 0))
        else:
            assert self._spill is not None
            by_user = _Spill(self.workdir / "by-user", self.partitions)
            for arrivals in self._spill.partitions():
                intake = Intake()
                for received_ms, *stored in arrivals:
                    intake.admit(_event_of(stored), received_ms)
                intake_counts.update(intake.counts)
                accepted: list[Event] = [*intake.impressions, *intake.clicks]
                for event in accepted:
                    by_user.add(event.user_id, _event_tuple(event))
            self._spill.remove()
            # Everything but budgets, one user at a time: the clicks that would be charged are the candidates.
            unbudgeted = Catalog(list(self.catalog), self.catalog.version, None, self.catalog.exclusions)
            by_day = _Spill(self.workdir / "by-campaign-day", self.partitions)
            for number, tuples in enumerate(by_user.partitions()):
                events = [_event_of(stored) for stored in tuples]
                impressions = [e for e in events if isinstance(e, Impression)]
                clicks = [e for e in events if isinstance(e, Click)]
                billing = bill(impressions, clicks, unbudgeted, is_bot=is_bot, rules=self.rules)
                refused_runs.append(self._write_refused(billing.not_charged, figures, number))
                for row in billing.charged:
                    by_day.add(f"{row.campaign_id}\x00{utc_day(row.click_time)}", _row_tuple(row))
            by_user.remove()
            # Budgets, each campaign's UTC day whole and in event-time order.
            for number, tuples in enumerate(by_day.partitions()):
                priced = [BillableClick(*stored) for stored in tuples]
                fits, _ = charge_in_order(
                    (Candidate(r.click_id, r.campaign_id, r.click_time, r.amount_micros) for r in priced),
                    self.catalog.budget_at,
                )
                priced.sort(key=lambda row: row.click_id)
                charged = [row for row in priced if row.click_id in fits]
                over = [not_charged_row(row, OVER_BUDGET) for row in priced if row.click_id not in fits]
                charged_runs.append(self._write_charged(charged, figures, self.partitions + number))
                refused_runs.append(self._write_refused(over, figures, self.partitions + number))
            by_day.remove()
        for reason, count in self.raw_quarantined.items():
            intake_counts[reason] += count
        _merge_runs(charged_runs, billable_target)
        _merge_runs(refused_runs, refused_target)
        for run in (*charged_runs, *refused_runs):
            run.unlink()
        self.close()
        counts = {
            "arrivals": sum(self.sent.values()),
            "sent": _ordered(self.sent, ("impression", "click", "raw")),
            "primary": _ordered(self.primary, ("impression", "click")),
            "timing": _ordered(self.timing, [t.value for t in Timing]),
            "duplicates": _ordered(self.duplicates, ("impression", "click")),
            "bad": {
                **_ordered(self.bad, [r.value for r in QuarantineReason]),
                "total": sum(self.bad.values()),
            },
            "intake": dict(sorted(intake_counts.items())),
            "first_event_time": self.first_event_ms,
            "last_event_time": self.last_event_ms,
            "made": _ordered(self.made, [m.value for m in Made]),
            "crawler_list": self.crawlers.version,
            **figures.as_dict(),
        }
        return Truth(billable_target, counts, refused_target)

    def close(self) -> None:
        """Remove the spill files (and the work folder when this object made it)."""
        if self._spill is not None:
            self._spill.remove()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_charged(self, rows: list[BillableClick], figures: _Figures, number: int) -> Path:
        return self._write_run(f"charged-{number:05d}.jsonl", rows, BILLABLE_FIELDS, figures.charge)

    def _write_refused(self, rows: list[NotCharged], figures: _Figures, number: int) -> Path:
        return self._write_run(f"not-charged-{number:05d}.jsonl", rows, NOT_CHARGED_FIELDS, figures.refuse)

    def _write_run(self, name: str, rows: Sequence[Any], fields: Sequence[str], count: Callable[[Any], None]) -> Path:
        """One run file, a row a line (by click_id), each row counted in the figures as it is written."""
        path = self.workdir / name
        with open(path, "w", encoding="utf-8") as out:
            for row in rows:
                count(row)
                # `to_dict()` goes through `asdict`, which is slow; this is the same dict.
                out.write(json.dumps({field: getattr(row, field) for field in fields}) + "\n")
        return path


_EventTuple = tuple[bool, str, str, str, int, str | None, str | None]


def _event_tuple(event: Event) -> _EventTuple:
    """A compact, picklable form of an event: (is_click, id, ad_id, user_id, event_time, user_agent, ip)."""
    return (
        isinstance(event, Click),
        event.event_id,
        event.ad_id,
        event.user_id,
        event.event_time,
        event.user_agent,
        event.ip,
    )


def _event_of(stored: _EventTuple | list[Any]) -> Event:
    is_click, event_id, ad_id, user_id, event_time, user_agent, ip = stored
    return (Click if is_click else Impression)(event_id, ad_id, user_id, event_time, user_agent, ip)


def _row_tuple(row: BillableClick) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in BILLABLE_FIELDS)


def _ordered(counter: Counter[str], keys: Iterable[str]) -> dict[str, int]:
    return {key: counter.get(key, 0) for key in keys}


class _Figures:
    """The counts of the outcomes: the charged clicks (`billable`: clicks and micros, by currency and by
    advertiser), the not charged ones by reason (`not_charged`), and each budgeted campaign's UTC days
    (`budgets`: the budgets in force that day, what was charged and what was over budget)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.clicks = 0
        self.by_advertiser: dict[str, dict[str, Any]] = {}
        self.by_currency: Counter[str] = Counter()
        self.refused: dict[str, Counter[str]] = {reason: Counter() for reason in NOT_CHARGED_REASONS}
        self.refused_clicks: Counter[str] = Counter()
        self.days: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)

    def charge(self, row: BillableClick) -> None:
        self.clicks += 1
        entry = self.by_advertiser.setdefault(row.advertiser_id, {"clicks": 0, "micros": 0, "currency": row.currency})
        entry["clicks"] += 1
        entry["micros"] += row.amount_micros
        self.by_currency[row.currency] += row.amount_micros
        if row.campaign_id in self.catalog.budgets:
            day = self.days[(row.campaign_id, utc_day(row.click_time))]
            day["charged_clicks"] += 1
            day["charged_micros"] += row.amount_micros

    def refuse(self, row: NotCharged) -> None:
        self.refused_clicks[row.reason] += 1
        if row.amount_micros is not None and row.currency is not None:
            self.refused[row.reason][row.currency] += row.amount_micros
        if row.reason == OVER_BUDGET and row.campaign_id is not None and row.amount_micros is not None:
            day = self.days[(row.campaign_id, utc_day(row.click_time))]
            day["over_budget_clicks"] += 1
            day["over_budget_micros"] += row.amount_micros

    def as_dict(self) -> dict[str, Any]:
        budgets: dict[str, dict[str, Any]] = {}
        for (campaign, day), figures in sorted(self.days.items()):
            midnight = parse_day(day)
            budgets.setdefault(campaign, {})[day] = {
                "budgets": [
                    {"effective_from": entry.effective_from, "daily_budget_micros": entry.daily_budget_micros}
                    for entry in self.catalog.budgets[campaign]
                    if entry.effective_from < midnight + DAY_MS
                    and (entry is self.catalog.budget_entry_at(campaign, midnight) or entry.effective_from > midnight)
                ],
                **_ordered(figures, ("charged_clicks", "charged_micros", "over_budget_clicks", "over_budget_micros")),
            }
        return {
            "billable": {
                "clicks": self.clicks,
                "total_micros_by_currency": dict(sorted(self.by_currency.items())),
                "by_advertiser": dict(sorted(self.by_advertiser.items())),
            },
            "not_charged": {
                "clicks": sum(self.refused_clicks.values()),
                "by_reason": {
                    reason: {
                        "clicks": self.refused_clicks.get(reason, 0),
                        "micros_by_currency": dict(sorted(self.refused[reason].items())),
                    }
                    for reason in NOT_CHARGED_REASONS
                },
            },
            "budgets": budgets,
        }


class _Spill:
    """Items spread over N files by a stable hash of a key; read back a partition at a time, in order."""

    _BATCH = 4096

    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.count = count
        self._buffers: list[list[Any]] = [[] for _ in range(count)]
        self._files: list[IO[bytes]] = [open(folder / f"{n:05d}.pickle", "wb") for n in range(count)]  # noqa: SIM115

    def add(self, key: str, item: Any) -> None:
        number = zlib.crc32(key.encode("utf-8")) % self.count
        buffer = self._buffers[number]
        buffer.append(item)
        if len(buffer) >= self._BATCH:
            pickle.dump(buffer, self._files[number], protocol=pickle.HIGHEST_PROTOCOL)
            buffer.clear()

    def partitions(self) -> Iterator[list[Any]]:
        """Each partition's items in the order they were added; closes the files for writing first."""
        for number, out in enumerate(self._files):
            if self._buffers[number]:
                pickle.dump(self._buffers[number], out, protocol=pickle.HIGHEST_PROTOCOL)
                self._buffers[number] = []
            out.close()
        for number in range(self.count):
            items: list[Any] = []
            with open(self.folder / f"{number:05d}.pickle", "rb") as source:
                while True:
                    try:
                        items.extend(pickle.load(source))  # our own spill file, in our temp folder  # nosec B301
                    except EOFError:
                        break
            yield items

    def remove(self) -> None:
        for out in self._files:
            out.close()
        self._buffers = [[] for _ in range(self.count)]
        shutil.rmtree(self.folder, ignore_errors=True)


def _merge_runs(runs: list[Path], target: Path) -> None:
    """Merge sorted JSON Lines runs by click_id into `target`, atomically."""
    with contextlib.ExitStack() as stack:
        sources = [stack.enter_context(open(run, encoding="utf-8")) for run in runs]
        write_whole(target, lambda out: out.writelines(heapq.merge(*sources, key=lambda t: json.loads(t)["click_id"])))
