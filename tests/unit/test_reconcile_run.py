"""The reconciliation workflow in plain Python, over ports held in memory: due and held periods, a refused back-fill,
corrections booked once, exports written once, and a run stopped after its export completed by the next."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from billing.budgets import BudgetChange, DaysMovedError, utc_day
from billing.catalog import Ad, AdChange, Catalog
from billing.corrections import ArrivalFacts, Correction
from billing.export import export_totals
from billing.periods import Periods
from billing.reconcile_plan import PeriodState, StreamPosition
from billing.reconcile_run import (
    DAY_TRIES,
    ConflictKey,
    DaysUnsettledError,
    HeldError,
    ReconcilePorts,
    RunReport,
    reconcile_periods,
)
from billing.rule import BillableClick, charge
from billing.store.export_files import export_table, exported_bills

H = 3_600_000
PERIOD = "20260101T0000Z"
START = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) * 1000
PAST_HORIZON = START + 2 * H
AD = Ad("ad-1", "cmp-1", "adv-1", 250_000, "EUR")
CATALOG = Catalog([AD])
OFFSETS = {"clicks": {0: 10}}
KEY = Periods(H).key_of
KEY_START = Periods(H).parse_key


def bill(click_id: str) -> BillableClick:
    at = START + 60_000
    return BillableClick(
        click_id, "i1", AD.ad_id, AD.campaign_id, AD.advertiser_id, "u1", at, at - 1000, 250_000, "EUR"
    )


@dataclass
class Final:
    """The rule over every click received, priced: charged in each campaign's UTC day in event-time order
    (`billing.rule.charge`), as the Spark port charges its matches; each period's share by the click's time."""

    priced: list[BillableClick]
    catalog: Catalog = CATALOG
    late: frozenset[str] = frozenset()
    conflicts: list[ConflictKey] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bills, self.refused = charge(self.priced, {}, self.catalog)

    @property
    def facts(self) -> ArrivalFacts:
        return ArrivalFacts(late_click_ids=self.late, not_charged_reasons={r.click_id: r.reason for r in self.refused})

    @property
    def clicks(self) -> int:
        return len(self.bills)

    def of_period(self, period: str) -> list[BillableClick]:
        return [r for r in self.bills if KEY(r.click_time) == period]

    def not_charged_of(self, period: str) -> list[Any]:
        return [r.to_dict() for r in self.refused if KEY(r.click_time) == period]

    @property
    def judged_with(self) -> dict[str, Any]:
        return {}


@dataclass
class Ledger:
    rows: list[BillableClick]
    read_through: int | None = None
    """The batch the rows were read through (None: not known, nothing newer is looked for)."""
    later: dict[int, list[BillableClick]] = field(default_factory=dict)
    """The bills of the stream's batches after the read point, by batch."""

    def of_period(self, period: str) -> list[BillableClick]:
        return [r for r in self.rows if KEY(r.click_time) == period]

    def newer(self, after_batch: int, through_batch: int, periods: Iterable[str]) -> list[BillableClick]:
        wanted = set(periods)
        return [
            r
            for batch, rows in sorted(self.later.items())
            if after_batch < batch <= through_batch
            for r in rows
            if KEY(r.click_time) in wanted
        ]

    def billed_after_close(self, period: str, given: list[Any]) -> set[str]:
        return {r.click_id for r in self.of_period(period)} - {r["click_id"] for r in given}


@dataclass
class Memory:
    """Every port of a run, in memory."""

    final: list[BillableClick]
    ledger: list[BillableClick]
    committed: dict[str, dict[int, int]] | None = None
    corrections: list[Correction] = field(default_factory=list)
    files: int = 0
    exports: dict[str, tuple[pa.Table, int]] = field(default_factory=dict)
    states: dict[str, PeriodState] = field(default_factory=dict)
    closed_in_totals: dict[str, Any] = field(default_factory=dict)
    not_charged_in_totals: dict[str, Any] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)
    totals_made: int = 0
    records: list[dict[str, object]] = field(default_factory=list)
    catalog: Catalog = CATALOG
    release: Released | None = None
    late: frozenset[str] = frozenset()
    writes: list[list[Correction]] = field(default_factory=list)
    """Each corrections file, in the order written."""
    applications: list[list[Correction]] = field(default_factory=list)
    """Each call that applied corrections to the totals, in order, with what it was given in order."""
    read_through: int | None = None
    later: dict[int, list[BillableClick]] = field(default_factory=dict)
    """The stream's batches after `read_through` (the ledger's `newer`)."""
    last_applied: int | None = None
    """The stream's last batch the totals hold."""
    moving: int = 0
    """How many more applies find a guarded day moved (the stream charging it meanwhile)."""
    reads: int = 0

    # CorrectionsStore
    def read(self) -> list[Correction]:
        return list(self.corrections)

    def write(self, period: str, run_id: str, corrections: list[Correction]) -> None:
        self.corrections += corrections
        self.files += 1
        self.writes.append(list(corrections))

    # ConflictsStore
    def keep(self, due: list[str], found: list[ConflictKey]) -> list[ConflictKey]:
        return found

    def send(self, progress: Callable[[str], None]) -> tuple[int, int] | None:
        return None

    # Totals
    def closed_periods(self) -> list[str]:
        return list(self.closed_in_totals)

    def close_period(self, period: str, period_start_ms: int, exported: Any) -> None:
        self.closed_in_totals[period] = exported

    def set_not_charged(self, period: str, period_start_ms: int, counts: Any) -> None:
        self.not_charged_in_totals[period] = counts

    def read_days(self, pairs: Iterable[tuple[str, str]]) -> Any:
        self.reads += 1
        return SimpleNamespace(last_applied=self.last_applied, day_charged=dict.fromkeys(pairs, 0))

    def apply_corrections(
        self,
        corrections: Iterable[Correction],
        period_start_ms: Mapping[str, int],
        days_read: Mapping[tuple[str, str], int] | None = None,
    ) -> int:
        given = list(corrections)
        if days_read and self.moving:
            self.moving -= 1
            given = [c for c in given if (c.campaign_id, utc_day(KEY_START(c.corrects_period))) not in days_read]
            self.applied |= {c.correction_id for c in given}
            raise DaysMovedError(days_read)
        self.applications.append(given)
        new = {c.correction_id for c in given} - self.applied
        self.applied |= new
        return len(new)

    def add_conflicts(self, conflicts: Iterable[ConflictKey]) -> int:
        return len(list(conflicts))

    def record_reconciliation(self, record: Mapping[str, Any]) -> None:
        pass

    def make_totals(self) -> Memory:
        self.totals_made += 1
        return self

    # Exports
    def exported(self) -> list[str]:
        return sorted(self.exports)

    def closed_at_ms(self, period: str) -> int:
        return self.exports[period][1]

    def given(self, period: str) -> list[Any]:
        return exported_bills(self.exports[period][0]).to_pylist()

    def totals(self, period: str) -> Any:
        return export_totals(self.exports[period][0].to_pylist())

    def write_export(
        self,
        period: str,
        export: list[Any],
        start_ms: int,
        end_ms: int,
        closed_at_ms: int,
        not_charged: Any = None,
        judged_with: Any = None,
    ) -> None:
        assert period not in self.exports, "an export is never rewritten"
        self.exports[period] = (export_table(export), closed_at_ms)

    def not_charged(self, period: str) -> list[Any]:
        return []

    # StateStore
    def load(self) -> dict[str, PeriodState]:
        return dict(self.states)

    def save(self, states: Mapping[str, PeriodState]) -> None:
        self.states = dict(states)

    def record_run(self, record: dict[str, object]) -> None:
        self.records.append(record)

    def ports(self, now_ms: int) -> ReconcilePorts:
        exports = SimpleNamespace(
            exported=self.exported,
            closed_at_ms=self.closed_at_ms,
            given=self.given,
            totals=self.totals,
            write=self.write_export,
            not_charged=self.not_charged,
        )
        states = SimpleNamespace(load=self.load, save=self.save, record_run=self.record_run)
        return ReconcilePorts(
            catalog=self.catalog,
            final_bills=lambda due: Final(self.final, self.catalog, self.late),
            ledger=lambda: Ledger(self.ledger, self.read_through, self.later),
            corrections=self,
            conflicts=self,
            totals=self.make_totals,
            exports=exports,  # type: ignore[arg-type]
            states=states,  # type: ignore[arg-type]
            versions=lambda: {KEY(r.click_time): 1 for r in self.final + self.ledger} or {PERIOD: 1},
            position=lambda: StreamPosition(
                committed=self.committed, end=OFFSETS, silent_for_ms=1_000 if self.committed else None
            ),
            clock=lambda: now_ms,
            release=lambda run_id, progress: nullcontext(
                self.release if self.release is not None and not self.release.written else None
            ),
        )


@dataclass
class Released:
    """Records a run is about to release into batch `batch_id` (a batch the period has seen), with their click."""

    memory: Memory
    batch_id: int
    periods: frozenset[str]
    click: BillableClick
    written: bool = False

    @property
    def count(self) -> int:
        return 1

    def write(self) -> None:
        assert self.memory.states[PERIOD].version < self.batch_id, "the period is marked changed before the write"
        self.memory.final.append(self.click)
        self.written = True


def run(memory: Memory, now_ms: int = PAST_HORIZON, **kwargs: Any) -> Any:
    return reconcile_periods(memory.ports(now_ms), Periods(H), 15 * 60_000, **kwargs)


def test_a_period_the_stream_passed_is_reconciled_booked_exported_and_closed_once() -> None:
    memory = Memory(final=[bill("c1"), bill("c2")], ledger=[bill("c1")], committed=OFFSETS)
    report = run(memory)
    assert (report.periods, report.closed, report.additions, report.retractions) == ([PERIOD], [PERIOD], 1, 0)
    assert [c.click_id for c in memory.corrections] == ["c2"]
    assert memory.applied == {memory.corrections[0].correction_id}
    assert exported_bills(memory.exports[PERIOD][0])["click_id"].to_pylist() == ["c1", "c2"]
    assert PERIOD in memory.closed_in_totals and memory.states[PERIOD].closed
    again = run(memory)
    assert (again.periods, again.closed, memory.files) == ([], [], 1)


def test_a_period_ahead_of_the_stream_is_held_and_a_backfill_is_refused_before_redis() -> None:
    memory = Memory(final=[bill("c1")], ledger=[])
    report = run(memory)
    assert report.periods == [] and report.held == {PERIOD: "held: the streaming job has never reported"}
    assert memory.states[PERIOD].target_offsets == OFFSETS  # the target, recorded once
    with pytest.raises(HeldError):
        run(memory, until_ms=START + H)
    assert memory.totals_made == 1 and not memory.exports  # the refused run made no Redis client
    forced = run(memory, until_ms=START + H, force=True)
    assert forced.closed == [PERIOD]


def test_a_run_stopped_after_its_export_is_completed_by_the_next_with_nothing_twice() -> None:
    memory = Memory(final=[bill("c1"), bill("c2")], ledger=[bill("c1")], committed=OFFSETS)

    def stop(message: str) -> None:
        if message == f"period {PERIOD}: exported":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(memory, progress=stop)
    assert PERIOD in memory.exports and PERIOD not in memory.closed_in_totals and not memory.states[PERIOD].closed
    report = run(memory)  # the export closed the period: compared with it, nothing is missing
    assert report.closed == [] and (report.additions, report.retractions) == (0, 0)
    assert memory.states[PERIOD].closed and PERIOD in memory.closed_in_totals
    assert memory.files == 1 and len(memory.applied) == 1


def test_a_backfill_that_reprices_a_closed_period_is_booked_as_adjustments_in_the_open_period() -> None:
    memory = Memory(final=[bill("c1")], ledger=[bill("c1")], committed=OFFSETS)
    assert run(memory).closed == [PERIOD]
    assert memory.states[PERIOD].catalog_version == CATALOG.version
    # A back-fill re-prices the closed hour (no event for it comes after): the final bill is priced by the history.
    memory.catalog = CATALOG.with_change(AdChange(AD.ad_id, START, 400_000), PAST_HORIZON, backfill=True)
    memory.final = [dataclasses.replace(bill("c1"), amount_micros=400_000)]
    later = PAST_HORIZON + 3 * H
    report = run(memory, now_ms=later)
    assert report.periods == [PERIOD] and report.closed == []
    booked = Periods(H).key_of(later)
    assert [(c.kind, c.reason, c.amount_micros, c.corrects_period, c.booked_period) for c in memory.corrections] == [
        ("retraction", "catalog_change", -250_000, PERIOD, booked),
        ("addition", "catalog_change", 400_000, PERIOD, booked),
    ]
    assert memory.states[PERIOD].catalog_version == memory.catalog.version
    # Reconciled with that version, the period is not due again; a change that leaves its hour alone moves its
    # recorded version on, without a reconciliation.
    assert run(memory, now_ms=later).periods == []
    memory.catalog = memory.catalog.with_change(AdChange(AD.ad_id, later, 500_000), later)
    assert run(memory, now_ms=later).periods == []
    assert memory.states[PERIOD].catalog_version == memory.catalog.version


def test_a_release_into_a_batch_a_closed_period_has_seen_takes_it_up_again_even_after_a_stop() -> None:
    memory = Memory(final=[bill("c1")], ledger=[bill("c1")], committed=OFFSETS)
    assert run(memory).closed == [PERIOD] and memory.states[PERIOD].version == 1
    memory.release = Released(memory, 1, frozenset({PERIOD}), bill("c-released"))

    def stop(message: str) -> None:
        if message.startswith("released 1 quarantined record(s)"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # stopped right after the release was written
        run(memory, progress=stop)
    assert memory.release.written and memory.states[PERIOD].version == 0
    report = run(memory)
    assert report.periods == [PERIOD] and report.additions == 1
    (adjustment,) = memory.corrections
    assert (adjustment.click_id, adjustment.corrects_period, adjustment.booked_period) == (
        "c-released",
        PERIOD,
        "20260101T0200Z",
    )
    assert run(memory).periods == [], "taken up once"


def test_an_export_says_when_its_period_closed_not_when_the_run_started() -> None:
    memory = Memory(final=[bill("c1")], ledger=[bill("c1")], committed=OFFSETS)
    ticks = iter(range(PAST_HORIZON, PAST_HORIZON + 1_000_000, 7_000))  # each look at the clock, 7 s later
    ports = replace(memory.ports(PAST_HORIZON), clock=lambda: next(ticks))
    report = reconcile_periods(ports, Periods(H), 15 * 60_000)
    closed_at = memory.exports[PERIOD][1]
    assert closed_at > report.started_at_ms and memory.states[PERIOD].closed_at_ms == closed_at


def test_the_run_that_closes_a_months_last_period_has_its_invoices_issued() -> None:
    memory = Memory(final=[bill("c1")], ledger=[bill("c1")], committed=OFFSETS)
    asked: list[tuple[dict[str, int], dict[str, PeriodState]]] = []

    def invoices(versions: Mapping[str, int], states: Mapping[str, PeriodState], now_ms: int) -> list[str]:
        asked.append((dict(versions), dict(states)))
        return ["invoices of 2026-01: 1 issued (INV-000001)"]

    ports = replace(memory.ports(PAST_HORIZON), invoices=invoices)
    report = reconcile_periods(ports, Periods(H), 15 * 60_000)
    assert report.invoices == ["invoices of 2026-01: 1 issued (INV-000001)"]
    assert asked and asked[0][1][PERIOD].closed, "asked once the period is closed"
    assert report.record()["invoices"] == report.invoices
    reconcile_periods(ports, Periods(H), 15 * 60_000)  # nothing due: asked again all the same (an earlier one failed)
    assert len(asked) == 2


def test_a_runs_record_keeps_every_field_of_its_report() -> None:
    report = RunReport("r1", 1_000, periods=["p"], closed=["p"], additions=2, held={"q": "why"}, finished_at_ms=4_000)
    report.net_micros_by_currency.update({"USD": 7, "EUR": -3})
    record = report.record()
    assert set(record) == {f.name for f in dataclasses.fields(RunReport)} | {"duration_ms"}
    assert record["duration_ms"] == 3_000 and list(record["net_micros_by_currency"]) == ["EUR", "USD"]
    assert {k: v for k, v in record.items() if k not in ("duration_ms", "net_micros_by_currency")} == {
        f.name: getattr(report, f.name) for f in dataclasses.fields(RunReport) if f.name != "net_micros_by_currency"
    }


# --- A late click inside a budget: the room it needs is taken back in the same run --------------------------------

EUR = 1_000_000
BUDGETED = Catalog([Ad("ad-e", "cmp-b", "adv-1", EUR, "EUR")], budgets={"cmp-b": [BudgetChange(0, 3 * EUR)]})
P09, P10 = KEY(START + 9 * H), KEY(START + 10 * H)
CLOSES_09 = START + 10 * H + 20 * 60_000  # 10:20: 09:00 is past its horizon, 10:00 is open
CLOSES_10 = START + 11 * H + 20 * 60_000


def click_at(click_id: str, at: int) -> BillableClick:
    user = f"u-{click_id}"
    return BillableClick(click_id, f"i-{click_id}", "ad-e", "cmp-b", "adv-1", user, at, at - 1000, EUR, "EUR")


def day_books(memory: Memory, open_periods: Iterable[str]) -> int:
    """The day's charged micros as finance and the live figures have them: the closed periods' exports with the
    adjustments booked for them, the open periods' ledger with their corrections."""
    exported = sum(row["net_micros"] for table, _ in memory.exports.values() for row in table.to_pylist())
    live = [r for r in memory.ledger if KEY(r.click_time) in set(open_periods)]
    pending = [c for c in memory.corrections if c.booked_period in set(open_periods)]
    return exported + sum(r.amount_micros for r in live) + sum(c.amount_micros for c in pending)


def late_click_in_a_full_day() -> Memory:
    """3.00 EUR a day; the stream charged three 1.00 clicks at 10:05 (10:00 still open); a click of 09:50 arrives
    late, first in event time: the complete data charges it and finds the last 10:05 click (by id) over budget."""
    at_1005 = START + 10 * H + 5 * 60_000
    stream = [click_at(c, at_1005) for c in ("c-10a", "c-10b", "c-10c")]
    late = click_at("c-0950", START + 9 * H + 50 * 60_000)
    return Memory(final=[late, *stream], ledger=stream, committed=OFFSETS, catalog=BUDGETED, late=frozenset({"c-0950"}))


def test_the_run_that_adds_a_late_click_takes_back_in_the_open_period_the_click_it_makes_over_budget() -> None:
    memory = late_click_in_a_full_day()
    report = run(memory, now_ms=CLOSES_09)
    assert report.closed == [P09] and P10 not in memory.states
    assert [(c.click_id, c.kind, c.reason, c.corrects_period, c.booked_period) for c in memory.corrections] == [
        ("c-10c", "retraction", "over_budget", P10, P10),
        ("c-0950", "addition", "late_click", P09, P09),
    ]
    # The day's books: 09:00's export (the late click) and 10:00's ledger less its retraction, within 3.00.
    assert day_books(memory, [P10]) == 3 * EUR
    # Booked no later than the addition: in a file written before it, and applied to the totals first, in the
    # same call.
    retraction, addition = memory.corrections
    assert memory.writes == [[retraction], [addition]]
    (together,) = [call for call in memory.applications if addition in call]
    assert retraction in together and together.index(retraction) < together.index(addition)
    assert (report.additions, report.retractions, report.net_micros_by_currency) == (1, 1, {"EUR": 0})
    assert run(memory, now_ms=CLOSES_09).periods == [] and memory.files == 2, "a second run writes nothing"


def test_closing_the_open_period_later_counts_the_retraction_already_booked_and_the_books_equal_the_rule() -> None:
    memory = late_click_in_a_full_day()
    run(memory, now_ms=CLOSES_09)
    later = run(memory, now_ms=CLOSES_10)
    assert later.closed == [P10] and (later.additions, later.retractions) == (0, 0)
    assert memory.files == 2, "nothing retracted twice"
    # Ledger + corrections = the rule: the late click and the first two of 10:05.
    net: dict[str, int] = {}
    for r in memory.ledger:
        net[r.click_id] = net.get(r.click_id, 0) + r.amount_micros
    for c in memory.corrections:
        net[c.click_id] = net.get(c.click_id, 0) + c.amount_micros
    assert {c for c, micros in net.items() if micros} == {"c-0950", "c-10a", "c-10b"}
    assert exported_bills(memory.exports[P10][0])["click_id"].to_pylist() == ["c-10a", "c-10b"]
    assert day_books(memory, []) == 3 * EUR
    assert run(memory, now_ms=CLOSES_10).periods == [] and memory.files == 2


def test_a_retraction_that_later_data_proves_wrong_is_booked_back_with_its_reason() -> None:
    memory = late_click_in_a_full_day()
    run(memory, now_ms=CLOSES_09)
    # A back-fill raises the day's budget to 4.00 from 10:00 (recorded history): the third 10:05 click fits again.
    memory.catalog = memory.catalog.with_budget("cmp-b", START + 10 * H, 4 * EUR, CLOSES_09, backfill=True)
    assert run(memory, now_ms=CLOSES_10).closed == [P10]
    booked_back = [c for c in memory.corrections if c.click_id == "c-10c"]
    assert [(c.kind, c.reason, c.corrects_period, c.booked_period) for c in booked_back] == [
        ("retraction", "over_budget", P10, P10),
        ("addition", "over_budget", P10, P10),
    ]
    assert len({c.correction_id for c in booked_back}) == 2
    assert exported_bills(memory.exports[P10][0])["click_id"].to_pylist() == ["c-10a", "c-10b", "c-10c"]


def a_bill_charged_while_the_run_reads() -> Memory:
    """3.00 EUR a day; the stream charged 2.00 at 10:05 (batch 0, read by the run); a 09:50 click arrives late (the
    plan: 3.00, no room needed); batch 1, applied to the totals after the run's read, charged 1.00 at 10:06."""
    at_1005 = START + 10 * H + 5 * 60_000
    stream = [click_at(c, at_1005) for c in ("c-10a", "c-10b")]
    late = click_at("c-0950", START + 9 * H + 50 * 60_000)
    return Memory(
        final=[late, *stream],
        ledger=stream,
        committed=OFFSETS,
        catalog=BUDGETED,
        late=frozenset({"c-0950"}),
        read_through=0,
        later={1: [click_at("c-1006", at_1005 + 60_000)]},
        last_applied=1,
    )


def test_a_bill_the_stream_charged_after_the_runs_read_is_counted_and_the_last_one_taken_back() -> None:
    memory = a_bill_charged_while_the_run_reads()
    report = run(memory, now_ms=CLOSES_09)
    assert report.closed == [P09]
    assert [(c.click_id, c.kind, c.reason, c.corrects_period, c.booked_period) for c in memory.corrections] == [
        ("c-1006", "retraction", "over_budget", P10, P10),
        ("c-0950", "addition", "late_click", P09, P09),
    ]
    (together,) = [call for call in memory.applications if memory.corrections[1] in call]
    assert together.index(memory.corrections[0]) < together.index(memory.corrections[1])
    # The run that closes 10:00 reads batch 1 too: the retraction already stands, nothing is written twice.
    memory.ledger.append(memory.later.pop(1)[0])
    memory.final.append(memory.ledger[-1])
    memory.read_through = 1
    assert run(memory, now_ms=CLOSES_10).closed == [P10] and memory.files == 2
    assert exported_bills(memory.exports[P10][0])["click_id"].to_pylist() == ["c-10a", "c-10b"]
    assert day_books(memory, []) == 3 * EUR


def test_a_day_the_stream_keeps_charging_is_tried_a_bounded_number_of_times_then_the_next_run_completes() -> None:
    memory = a_bill_charged_while_the_run_reads()
    memory.moving = DAY_TRIES
    with pytest.raises(DaysUnsettledError, match="campaign cmp-b on 2026-01-01"):
        run(memory, now_ms=CLOSES_09)
    assert memory.reads == DAY_TRIES and not memory.exports
    assert not {c.correction_id for c in memory.corrections} & memory.applied, "nothing of the day was applied"
    report = run(memory, now_ms=CLOSES_09)
    assert report.closed == [P09] and (report.additions, report.retractions) == (0, 0)
    assert sorted((c.click_id, c.kind) for c in memory.corrections) == [
        ("c-0950", "addition"),
        ("c-1006", "retraction"),
    ]
    assert {c.correction_id for c in memory.corrections} <= memory.applied
