"""The streaming job's charging step, on the driver: each matched click of a micro-batch priced, judged by the invalid
traffic rules and held to its campaign's daily budget, then written as the ledger (charged), `unbilled/` (no price)
and `not_charged/` (an invalid traffic rule, `over_budget`). Pure pyarrow and Python over the batch's bills: no Spark.

In: the batch's matched clicks (`attribution.join.MATCH_COLUMNS` with the click's `ip` and `user_agent`), the batch's
valid clicks (`click_id`, `ad_id`,
`user_id`, `event_time`), the catalog version the batch is priced with, the watermark the batch ran with, and each
campaign's charged total per UTC day so far (Redis). Out: `Charged`: the tables to write and the figures for Redis.

- **Invalid traffic.** `known_bot`: the crawler list searched once per distinct user agent, its answer remembered
  (`billing.store.crawler_list`; traffic repeats its user agents, and a new one costs about 50 us); `excluded_ip`:
  the catalog's exclusion list at the click's time; `click_flood` and `duplicate_click` read the user's recent
  clicks (`RecentClicks`: every valid click the stream received, by user, kept while the watermark allows a bill to
  need it, evicted behind it). The stream judges with what it has received so far: a flood's first clicks, billed
  before the 21st arrived, and a click whose earlier twin arrives late are charged, and reconciliation retracts them
  (the rule's name as the reason).
- **Budgets.** The valid clicks are taken in order of event time, then click id, each charged when its day's total
  so far plus its price fits the budget in force at its time (`billing.budgets.BudgetLedger`), so the live totals
  never pass a budget.
- **Exactly once.** What an attempt at batch N decided is kept (`DataLayout.decisions`, written before any file of
  the batch). A replay of a batch Redis has already counted decides the same, whatever the recent clicks or the day
  totals are by then, so the files a replay writes are the ones Redis counted; a bill it has that the first attempt
  had not is left to reconciliation (Redis applies a batch once). A replay of a batch Redis has not counted decides
  again, on the day totals Redis holds then (after a restore, the restored ones): nothing else has counted its first
  decisions (reconciliation reads committed batches only).
- **The day totals it decided on.** The batch applies to Redis only while each campaign's day it charged on still
  holds the total it read (`Charged.day_totals_read`); a reconciliation run that moved one in between (an addition,
  a retraction) makes the batch decide again on the day as it is.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from attribution.batch_output import constant_column, with_period
from attribution.pricing import UNBILLED_COLUMNS, price_matches
from billing.budgets import BudgetLedger, Candidate, day_start, utc_day
from billing.catalog import Catalog
from billing.invalid import IvtRules, first_reason
from billing.layout import DataLayout
from billing.periods import Periods
from billing.store.columns import schema
from billing.store.compaction import SOURCE_BATCH, batch_of, compacted_span, read_listed
from billing.store.crawler_list import crawler_list
from billing.store.durable import make_folder, replace_files
from billing.store.parquet_ledger import LEDGER_COLUMNS
from billing.store.redis_totals import BudgetDayCount, NotChargedCount, TotalsRow, UnbilledCount

log = logging.getLogger(__name__)

CHARGED = "charged"
"""A decision: the click is charged (the ledger)."""

NOT_CHARGED_ROWS = (*LEDGER_COLUMNS[:-3], "reason", *LEDGER_COLUMNS[-3:])
"""The not-charged table's columns: a ledger row and its `reason`; partitioned by period and batch_id."""

UNBILLED_ROWS = (*UNBILLED_COLUMNS, "period_start_ms", "period", "batch_id")
"""The unbilled table's columns; partitioned by period and batch_id."""

CLICK_KEY_COLUMNS = ("click_id", "ad_id", "user_id", "event_time")
"""What the invalid traffic rules read of every valid click the stream receives."""

DECISION_SCHEMA = schema(("click_id", "outcome"))


class RecentClicks:
    """Every valid click received recently, by user: what the flood and duplicate rules read. A click stays while a
    bill may still need it (event time within `rules.flood_window_ms` of the watermark or after) and is evicted
    behind; an id is held once."""

    def __init__(self, rules: IvtRules) -> None:
        self.rules = rules
        self.by_user: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
        """user -> sorted (event_time, click_id, ad_id)."""
        self.by_user_ad: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
        """(user, ad) -> sorted (event_time, click_id): a click's predecessor on its ad, however many clicks of the
        user on other ads lie between."""
        self.ids: set[str] = set()
        self._by_second: dict[int, list[tuple[str, int, str, str]]] = defaultdict(list)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, click_ids: list[str], ad_ids: list[str], user_ids: list[str], times: list[int]) -> None:
        for click_id, ad_id, user_id, at in zip(click_ids, ad_ids, user_ids, times, strict=True):
            if click_id in self.ids:
                continue
            self.ids.add(click_id)
            bisect.insort(self.by_user[user_id], (at, click_id, ad_id))
            bisect.insort(self.by_user_ad[(user_id, ad_id)], (at, click_id))
            self._by_second[at // 1000].append((user_id, at, click_id, ad_id))

    def evict_before(self, floor_ms: int) -> int:
        """Forget the clicks whose event time is before `floor_ms`; how many."""
        gone = 0
        for second in [s for s in self._by_second if s * 1000 + 999 < floor_ms]:
            for user_id, at, click_id, ad_id in self._by_second.pop(second):
                held = self.by_user.get(user_id)
                if held is not None:
                    index = bisect.bisect_left(held, (at, click_id, ad_id))
                    if index < len(held) and held[index] == (at, click_id, ad_id):
                        del held[index]
                    if not held:
                        del self.by_user[user_id]
                on_ad = self.by_user_ad.get((user_id, ad_id))
                if on_ad is not None:
                    index = bisect.bisect_left(on_ad, (at, click_id))
                    if index < len(on_ad) and on_ad[index] == (at, click_id):
                        del on_ad[index]
                    if not on_ad:
                        del self.by_user_ad[(user_id, ad_id)]
                self.ids.discard(click_id)
                gone += 1
        return gone

    def flood(self, user_id: str, at: int, click_id: str) -> bool:
        """Whether the click is in a run of more than `flood_clicks` of the user's clicks within the window
        (`billing.invalid.flood_clicks`): whether some `flood_clicks + 1` of them in a row, by time and id, hold it and
        span at most the window. A longer run that holds it holds such a one too, so a click costs at most
        `flood_clicks + 1` comparisons, however many clicks a flooding user has in the window (judging each click
        over all of them made a flood cost the square of its clicks)."""
        held = self.by_user.get(user_id, [])
        run = self.rules.flood_clicks + 1
        index = bisect.bisect_left(held, (at, click_id))
        if len(held) < run or index == len(held) or held[index][:2] != (at, click_id):
            return False
        return any(
            held[start + run - 1][0] - held[start][0] <= self.rules.flood_window_ms
            for start in range(max(0, index - run + 1), min(index, len(held) - run) + 1)
        )

    def duplicate(self, user_id: str, ad_id: str, at: int, click_id: str) -> bool:
        """Whether the user's previous click on the ad (by time, then id) is at most the duplicate window before."""
        held = self.by_user_ad.get((user_id, ad_id), [])
        index = bisect.bisect_left(held, (at, click_id))
        return index > 0 and at - held[index - 1][0] <= self.rules.duplicate_window_ms


@dataclass(frozen=True)
class Charged:
    """One batch's bills, decided: the tables to write and the figures for Redis."""

    ledger: pa.Table
    unbilled: pa.Table
    not_charged: pa.Table
    totals: list[TotalsRow]
    unbilled_counts: list[UnbilledCount]
    not_charged_counts: list[NotChargedCount]
    budget_days: list[BudgetDayCount]
    decisions: dict[str, str] = field(default_factory=dict)
    replayed: bool = False
    """Decided as the first attempt decided (Redis had counted the batch)."""
    day_totals_read: dict[tuple[str, str], int] = field(default_factory=dict)
    """(campaign, day) -> the charged total the decisions were taken on: the batch applies only on those."""


DayTotals = Callable[[Iterable[tuple[str, str]]], Mapping[tuple[str, str], int]]
"""(campaign, day) pairs -> micros charged that day so far."""


class Charging:
    """The stream's charging step (module doc); one per query run, on the driver."""

    def __init__(
        self,
        layout: DataLayout,
        periods: Periods,
        rules: IvtRules,
        judge: bool = True,
        budgets: bool = True,
        first_batch_id: int = 0,
    ) -> None:
        self.layout = layout
        self.periods = periods
        self.rules = rules
        self.judge = judge
        """False: no click is found invalid (to measure what the rules cost; reconciliation applies them)."""
        self.budgets = budgets
        """False: every valid click is charged (to measure what the budget check costs)."""
        self.first_batch_id = first_batch_id
        """The checkpoint's first batch id (its epoch's base, `attribution.epoch`)."""
        self.recent = RecentClicks(rules)
        self._loaded = False

    def charge(
        self,
        batch_id: int,
        bills: pa.Table,
        clicks: pa.Table,
        catalog: Catalog,
        watermark_ms: int,
        billed_at_ms: int,
        day_totals: DayTotals,
        counted: bool = False,
    ) -> Charged:
        """Decide the batch's bills (module doc). `counted`: Redis has already applied this batch (a replay after a
        crash between Redis and the checkpoint's commit)."""
        if self.judge and not self._loaded:
            self._load_recent(batch_id, watermark_ms)
        if self.judge:
            self.recent.add(*(clicks.column(name).to_pylist() for name in CLICK_KEY_COLUMNS))
        priced = price_matches(bills, catalog)
        bills_priced = priced.bills
        rows = bills_priced.to_pylist()
        pinned = self._pinned(batch_id) if counted else None
        read: dict[tuple[str, str], int] = {}
        if pinned is None:
            decisions = self._decide(rows, catalog, _reading(day_totals, read))
            self._pin(batch_id, decisions)
        else:
            decisions = {row["click_id"]: pinned[row["click_id"]] for row in rows if row["click_id"] in pinned}
            extra = [row for row in rows if row["click_id"] not in pinned]
            if extra:
                # Redis counted the first attempt's bills and applies a batch once: a bill charged now would be in
                # the ledger and never in the live totals. Reconciliation bills it, judged like every other click.
                left = pa.array([row["click_id"] for row in extra], pa.string())
                bills_priced = bills_priced.filter(pc.invert(pc.is_in(bills_priced.column("click_id"), left)))
                log.warning(
                    "batch %d replayed with %d bill(s) its first attempt did not have, after Redis had counted the "
                    "batch: left to reconciliation (%s)",
                    batch_id,
                    len(extra),
                    ", ".join(sorted(left.to_pylist())[:5]),
                )
        self.recent.evict_before(watermark_ms - self.rules.flood_window_ms)
        return self._tables(batch_id, bills_priced, priced.unbilled, decisions, billed_at_ms, pinned is not None, read)

    def _decide(self, rows: list[dict], catalog: Catalog, day_totals: DayTotals) -> dict[str, str]:  # type: ignore[type-arg]
        decisions: dict[str, str] = {}
        valid: list[Candidate] = []
        crawlers = crawler_list()
        for row in sorted(rows, key=lambda r: (r["click_time"], r["click_id"])):
            at = row["click_time"]
            if not self.judge:
                valid.append(Candidate(row["click_id"], row["campaign_id"], at, row["amount_micros"]))
                continue
            reason = first_reason(
                bot=crawlers.matches(row.get("user_agent")),
                excluded=catalog.exclusions.excluding(row.get("ip"), at) is not None,
                flood=self.recent.flood(row["user_id"], at, row["click_id"]),
                duplicate=self.recent.duplicate(row["user_id"], row["ad_id"], at, row["click_id"]),
            )
            if reason is not None:
                decisions[row["click_id"]] = reason.value
            else:
                valid.append(Candidate(row["click_id"], row["campaign_id"], at, row["amount_micros"]))
        if not self.budgets:
            decisions.update((c.click_id, CHARGED) for c in valid)
            return decisions
        budgeted = [c for c in valid if catalog.budgets.get(c.campaign_id)]
        spent = day_totals({(c.campaign_id, utc_day(c.click_time)) for c in budgeted})
        ledger = BudgetLedger(spent)
        for candidate in valid:
            fits = ledger.decide(candidate, catalog.budget_at) if catalog.budgets.get(candidate.campaign_id) else True
            decisions[candidate.click_id] = CHARGED if fits else "over_budget"
        return decisions

    def _tables(
        self,
        batch_id: int,
        bills: pa.Table,
        unbilled: pa.Table,
        decisions: Mapping[str, str],
        billed_at_ms: int,
        replayed: bool,
        day_totals_read: Mapping[tuple[str, str], int],
    ) -> Charged:
        outcome = pa.array([decisions.get(c, CHARGED) for c in bills.column("click_id").to_pylist()], pa.string())
        charged_mask = pc.equal(outcome, CHARGED)
        dated = with_period(bills, "click_time", self.periods)
        dated = dated.append_column("billed_at_ms", constant_column(billed_at_ms, dated.num_rows))
        dated = dated.append_column("batch_id", constant_column(batch_id, dated.num_rows))
        ledger = dated.filter(charged_mask).select(list(LEDGER_COLUMNS))
        refused = dated.append_column("reason", outcome).filter(pc.invert(charged_mask))
        refused = refused.select(list(NOT_CHARGED_ROWS))
        held = with_period(unbilled.select(list(UNBILLED_COLUMNS)), "click_time", self.periods)
        held = held.append_column("batch_id", constant_column(batch_id, held.num_rows)).select(list(UNBILLED_ROWS))
        return Charged(
            ledger=ledger,
            unbilled=held,
            not_charged=refused,
            totals=_totals(ledger),
            unbilled_counts=_unbilled_counts(held),
            not_charged_counts=not_charged_counts(refused),
            budget_days=budget_day_counts(ledger, refused),
            decisions=dict(decisions),
            replayed=replayed,
            day_totals_read=dict(day_totals_read),
        )

    # --- What the first attempt decided ---------------------------------------------------------------------

    def _pin_path(self, batch_id: int) -> Path:
        return self.layout.decisions / f"{batch_id}.parquet"

    def _pinned(self, batch_id: int) -> dict[str, str] | None:
        path = self._pin_path(batch_id)
        if not path.exists():
            return None
        table = pq.read_table(path)
        return dict(zip(table.column("click_id").to_pylist(), table.column("outcome").to_pylist(), strict=True))

    def _pin(self, batch_id: int, decisions: Mapping[str, str]) -> None:
        folder = self.layout.decisions
        touched = make_folder(folder)
        staging = folder / f".{batch_id}.parquet.{os.getpid()}.tmp"
        table = pa.table({"click_id": list(decisions), "outcome": list(decisions.values())}, schema=DECISION_SCHEMA)
        pq.write_table(table, staging)
        replace_files([(staging, self._pin_path(batch_id))], touched)
        if batch_id % 100 == 0:  # keep the decisions of the last thousand batches
            for old in folder.glob("*.parquet"):
                if old.stem.isdigit() and int(old.stem) < batch_id - 1000:
                    old.unlink(missing_ok=True)

    # --- The recent clicks after a start ---------------------------------------------------------------------

    def _load_recent(self, batch_id: int, watermark_ms: int) -> None:
        """After a start, the recent clicks from the archive: every valid click of the batches before `batch_id`
        whose event time a bill of this batch may need (the flood window behind the watermark, or later).

        A batch that runs without a watermark yet (0: the checkpoint's second batch, its first having set none)
        needs every click its checkpoint received before it, whatever their times: the first batch's, at most one
        batch of records. The clicks of an earlier checkpoint are not read then (a new epoch's first batches: a
        pair of clicks across the change is reconciliation's, as a match across it is)."""
        self._loaded = True
        if batch_id <= self.first_batch_id:
            return
        floor = watermark_ms - self.rules.flood_window_ms if watermark_ms > 0 else None
        first = self.first_batch_id if watermark_ms <= 0 else None
        table = recent_clicks(self.layout.archive_of("click"), self.periods, batch_id, first, floor)
        self.recent.add(*(table.column(name).to_pylist() for name in RECENT_COLUMNS))
        log.info("the invalid traffic rules start with %d recent click(s) from the archive", len(self.recent))


RECENT_COLUMNS = ("event_id", "ad_id", "user_id", "event_time")

_RECENT_SCHEMA = schema((*RECENT_COLUMNS, SOURCE_BATCH, "period", "batch_id"))


def recent_clicks(folder: Path, periods: Periods, before: int, first: int | None, floor: int | None) -> pa.Table:
    """`RECENT_COLUMNS` of the archive's clicks (`folder`) that the batches before `before` wrote (from batch `first`
    on, when given), of event time `floor` or later (when given; only the periods from `floor`'s are listed), each
    row once.

    The open periods' batch files are compacted while the stream runs (`billing.store.compaction.compact_open`, no
    lock here): the files are listed by `read_listed`, which skips the batch files a compacted file beside them
    holds and lists again when a file listed is gone before it is read, and a compacted file's rows are taken by
    the batch that wrote each (`source_batch_id`), not its folder's."""
    if not folder.is_dir():
        return _RECENT_SCHEMA.empty_table().select(list(RECENT_COLUMNS))
    since = periods.start_of(floor) if floor is not None else None
    low = first if first is not None else -1

    def wanted(path: Path) -> bool:
        """The file may hold rows of the batches and periods asked for (its path says which)."""
        key = path.parent.parent.name.removeprefix("period=")
        if since is not None:
            try:
                if periods.parse_key(key) < since:
                    return False
            except ValueError:
                return False
        batch = batch_of(path.parent.name)
        if batch is None:
            return False
        span = compacted_span(path.name) or (batch, batch)
        return span[0] < before and span[1] >= low

    def read(files: list[Path]) -> pa.Table:
        mine = [str(f) for f in files if wanted(f)]
        if not mine:
            return _RECENT_SCHEMA.empty_table()
        own_batch = pc.coalesce(pc.field(SOURCE_BATCH), pc.field("batch_id"))
        which = (own_batch < before) & (own_batch >= low)
        if floor is not None:
            which = which & (pc.field("event_time") >= floor)
        dataset = ds.dataset(
            mine,
            schema=_RECENT_SCHEMA,
            format="parquet",
            partitioning=ds.partitioning(pa.schema([("period", pa.string()), ("batch_id", pa.int64())]), flavor="hive"),
            partition_base_dir=str(folder),
        )
        return dataset.to_table(filter=which)

    return read_listed(folder, 2, read).select(list(RECENT_COLUMNS))


def _reading(day_totals: DayTotals, read: dict[tuple[str, str], int]) -> DayTotals:
    """`day_totals`, keeping in `read` every figure it gave."""

    def reads(pairs: Iterable[tuple[str, str]]) -> Mapping[tuple[str, str], int]:
        got = day_totals(pairs)
        read.update(got)
        return got

    return reads


def _grouped(table: pa.Table, keys: list[str], sums: list[str]) -> list[dict]:  # type: ignore[type-arg]
    if table.num_rows == 0:
        return []
    aggregates = [([], "count_all"), *((name, "sum") for name in sums)]
    return table.group_by(keys).aggregate(aggregates).to_pylist()  # type: ignore[arg-type]


def _totals(ledger: pa.Table) -> list[TotalsRow]:
    keys = ["period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id"]
    return [
        TotalsRow(
            r["period"],
            r["period_start_ms"],
            r["advertiser_id"],
            r["campaign_id"],
            r["ad_id"],
            r["count_all"],
            r["amount_micros_sum"],
        )
        for r in _grouped(ledger, keys, ["amount_micros"])
    ]


def _unbilled_counts(unbilled: pa.Table) -> list[UnbilledCount]:
    keys = ["period", "period_start_ms", "advertiser_id", "ad_id", "reason"]
    return [
        UnbilledCount(
            r["period"], r["period_start_ms"], r["advertiser_id"] or "", r["ad_id"], r["reason"], r["count_all"]
        )
        for r in _grouped(unbilled, keys, [])
    ]


def not_charged_counts(refused: pa.Table) -> list[NotChargedCount]:
    keys = ["period", "period_start_ms", "advertiser_id", "campaign_id", "ad_id", "reason"]
    return [
        NotChargedCount(
            r["period"],
            r["period_start_ms"],
            r["advertiser_id"],
            r["campaign_id"],
            r["ad_id"],
            r["reason"],
            r["count_all"],
            r["amount_micros_sum"],
        )
        for r in _grouped(refused, keys, ["amount_micros"])
    ]


def budget_day_counts(ledger: pa.Table, refused: pa.Table) -> list[BudgetDayCount]:
    """Per period and campaign, the clicks charged and over budget, by UTC day (a period lies in one day)."""
    days: dict[tuple[str, int, str], list[int]] = {}
    for table, charged in ((ledger, True), (refused.filter(pc.equal(refused.column("reason"), "over_budget")), False)):
        for r in _grouped(table, ["period", "period_start_ms", "campaign_id"], ["amount_micros"]):
            entry = days.setdefault((r["period"], r["period_start_ms"], r["campaign_id"]), [0, 0, 0, 0])
            offset = 0 if charged else 2
            entry[offset] += r["count_all"]
            entry[offset + 1] += r["amount_micros_sum"]
    return [
        BudgetDayCount(period, campaign, utc_day(start), day_start(start), *figures)
        for (period, start, campaign), figures in sorted(days.items())
    ]
