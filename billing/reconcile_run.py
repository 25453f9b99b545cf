"""One reconciliation run: the due periods reconciled, their corrections booked, the open ones exported and closed.

Plain Python over its ports (`ReconcilePorts`): the final bills (computed by Spark from the archive), the ledger,
the corrections store, the id conflicts, the totals (Redis), the exports, the state, the data versions, the
stream's position and a clock. The steps, in order (`reconcile_periods`):

0. **release**: quarantined records whose schema id the registry now knows are released (the port; the
   periods they can change are marked changed in the state first, `billing.reconcile_plan.mark_changed`, so that a run
   stopped right after still takes them up);
1. **plan**: the due periods and the held ones (`billing.reconcile_plan.plan_run`, with the stream's position and the
   catalog: a closed period whose prices a back-fill moved is due again); a back-fill (`until`) that would close
   periods ahead of the stream is refused (`HeldError`) unless forced;
2. **settle**: a closed period that Redis does not know as closed is closed there from its export
   (`settle_closed_in_redis`);
3. **final bills**: the rule over every event received of the due periods (the port; id conflicts are kept
   and counted, then sent to the quarantine topic once each);
4. **reconcile**, per due period, oldest first: the new corrections (`billing.corrections.reconcile_period`) of
   an open period against its ledger and earlier corrections; of a closed period against what finance was given
   (its export plus the adjustments booked since), booked in the open period (a bill the stream made after the
   close: `billed_after_close`); the invariant is checked for every due period before anything is written
   (`check_reconciled`);
5. **room**: where an addition raises a campaign's UTC day (a late click earlier in the day, a catalog change),
   the bills of that day's periods that stay open after the run which the budget, taken in event-time order over
   everything received so far, finds over it are retracted now, `over_budget`, corrected and booked in their open
   period (`budget_room`): otherwise the day's closed exports and live totals would charge past the budget until
   those periods close. When such a period is reconciled later, the retraction already stands (nothing is
   retracted twice); a click the complete data charges after all is added back, `over_budget` again;
6. **book**: the new corrections written (one file per period and run; the files that take back before those that
   add), then applied to the totals in one call, retractions first, once per correction id (earlier ones too, of
   the due periods and of their days' open periods: a run that stopped between the two is completed). A budgeted
   day an addition raises is held against every bill of the stream Redis holds for it, not only those the plan
   read (`RaisedDays`): read with the stream's last batch applied, the bills of the batches since are counted and
   the latest that no longer fit retracted, `over_budget`, before the write; the day's corrections then reach
   Redis together only while it holds the total read, and when the stream charged it meanwhile, its newer bills
   are counted and the apply tried again, up to `DAY_TRIES` times (`DaysUnsettledError`);
7. per due period, oldest first: **export** and **close**, an open period only: its export written
   (`billing.export.build_export`, never rewritten after), the period closed in the totals (its figures become
   the export's), then in the state; the period's state records the data version and the catalog version it was
   reconciled with.

A run killed at any point is completed by the next: an export closes its period whatever the state says
(`closed_by_exports`), the totals are closed from the export when they do not know the period as closed, and
corrections already written are applied once per id. Running it again with no new data writes nothing:
corrections have deterministic ids and `reconcile_period` returns only what is missing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from billing.budgets import (
    OVER_BUDGET,
    DaysMovedError,
    StandingBill,
    day_start,
    over_budget_standing,
    parse_day,
    utc_day,
)
from billing.catalog import Catalog
from billing.corrections import (
    ArrivalFacts,
    BillRow,
    Correction,
    CorrectionKind,
    check_reconciled,
    over_budget_room,
    reconcile_period,
    standing_bills,
)
from billing.export import build_export
from billing.money import Amounts
from billing.periods import ANY_PERIOD, DAY_MS, Periods
from billing.reconcile_plan import PeriodState, StreamPosition, mark_changed, open_period, plan_run

Bills = Any
"""A table of bills, as `billing.corrections` and `billing.export` take them (the adapters' choice of rows)."""

ConflictKey = tuple[str, str, str | None]
"""An id conflict as the totals count it: its `topic/partition/offset`, its topic and its ad's advertiser."""


class HeldError(RuntimeError):
    """A back-fill (`until`) would close periods the streaming job has not passed yet."""

    def __init__(self, held: dict[str, str]) -> None:
        self.held = held
        listed = "; ".join(f"{period} {reason}" for period, reason in held.items())
        super().__init__(
            f"refused: closing up to --until would close {len(held)} period(s) ahead of the stream ({listed}); "
            "start the streaming job and let it catch up, or pass --force to close them anyway (what the stream "
            "bills for them later becomes adjustments)"
        )


class ReconcileBusyError(RuntimeError):
    """Another reconciliation run holds the lock."""


DAY_TRIES = 5
"""How many times a run applies its corrections of a budgeted day that the stream keeps charging meanwhile, each time
with the stream's newer bills of the day counted (`RaisedDays`)."""


class DaysUnsettledError(RuntimeError):
    """The stream charged a day the run raises between its read and its apply, `DAY_TRIES` times over."""

    def __init__(self, days: Iterable[tuple[str, str]], tries: int) -> None:
        self.days = sorted(days)
        listed = ", ".join(f"campaign {campaign} on {day}" for campaign, day in self.days)
        super().__init__(
            f"reconciliation could not apply its corrections of {listed}: the streaming job charged the day again "
            f"between the run's read and its apply, {tries} times; the corrections are written and nothing of "
            "those days reached Redis. Run reconciliation again: it applies them"
        )


@dataclass
class RunReport:
    """What one run did."""

    run_id: str
    started_at_ms: int
    periods: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    additions: int = 0
    retractions: int = 0
    net_micros_by_currency: dict[str, int] = field(default_factory=dict)
    """What the run's new corrections add up to, per currency (no figure adds micros of two currencies)."""
    conflicts: int = 0
    conflicts_sent: int = 0
    """Id conflicts sent to the quarantine topic by this run."""
    conflicts_unsent: int = 0
    """Id conflicts that are not on the quarantine topic yet (Kafka refused them or did not answer); the next run
    sends them."""
    final_clicks: int = 0
    events: int = 0
    released: int = 0
    """Quarantined records this run released to the archive (their schema id is known now)."""
    held: dict[str, str] = field(default_factory=dict)
    """Periods past their horizon that the stream has not passed yet, with the reason."""
    invoices: list[str] = field(default_factory=list)
    """What the run did of the monthly invoices: the months it issued, the month that waits and why."""
    finished_at_ms: int = 0

    @property
    def duration_ms(self) -> int:
        return self.finished_at_ms - self.started_at_ms

    def record(self) -> dict[str, object]:
        """The run as its record keeps it (the runs log, Redis' last run): every field, the duration, and the net
        per currency in the currencies' order."""
        net = dict(sorted(self.net_micros_by_currency.items()))
        return {**asdict(self), "net_micros_by_currency": net, "duration_ms": self.duration_ms}


class FinalBills(Protocol):
    """The rule applied to every event received of a run's due periods."""

    @property
    def clicks(self) -> int:
        """Final billable clicks of all the due periods."""

    @property
    def facts(self) -> ArrivalFacts:
        """The late and conflicting events' ids, for the corrections' reasons."""

    @property
    def conflicts(self) -> Any:
        """The id-conflict records of the due periods, for `ConflictsStore.keep`."""

    def of_period(self, period: str) -> Bills:
        """The final bills of one due period."""

    def not_charged_of(self, period: str) -> Bills:
        """The billable clicks of one due period that are not charged, with the reason; with budgets, of any other
        period of a due period's UTC day too (a period still open: as received so far), for `budget_room`."""

    @property
    def judged_with(self) -> dict[str, Any]:
        """What the clicks were judged with (the crawler list's version, the invalid traffic rules)."""


class Ledger(Protocol):
    """The stream's provisional bills, as the run read them."""

    def of_period(self, period: str) -> Bills: ...

    def billed_after_close(self, period: str, given: Bills) -> set[str]:
        """Click ids the stream billed for `period` that `given` (its export's bills) lacks."""

    @property
    def read_through(self) -> int | None:
        """The last of the stream's batches whose bills were read; None when not known (nothing newer is read)."""

    def newer(self, after_batch: int, through_batch: int, periods: Collection[str]) -> Bills:
        """The bills of `periods` that the stream's batches after `after_batch` up to `through_batch` wrote."""


class CorrectionsStore(Protocol):
    def read(self) -> list[Correction]:
        """Every correction written so far."""

    def write(self, period: str, run_id: str, corrections: list[Correction]) -> None:
        """The new corrections of a period, by one run, in one file renamed into place."""


class ConflictsStore(Protocol):
    def keep(self, due: list[str], found: Any) -> list[ConflictKey]:
        """Keep the id conflicts of the due periods (all of a period's, replaced whole); returns them keyed."""

    def send(self, progress: Callable[[str], None]) -> tuple[int, int] | None:
        """Send the kept conflicts not yet on the quarantine topic, once each: (sent, not sent), None when none
        was pending."""


class Totals(Protocol):
    """The figures the UI shows (Redis, `billing.store.redis_totals.RedisTotals`)."""

    def closed_periods(self) -> list[str]: ...

    def close_period(self, period: str, period_start_ms: int, exported: Any) -> None: ...

    def apply_corrections(
        self,
        corrections: Iterable[Correction],
        period_start_ms: Mapping[str, int],
        days_read: Mapping[tuple[str, str], int] | None = None,
    ) -> Any:
        """Each correction once per id; those of the (campaign, day) pairs of `days_read` only while the day still
        holds the charged total read there, all of a day's or none (DaysMovedError names the days that moved)."""

    def read_days(self, pairs: Iterable[tuple[str, str]]) -> DaysRead:
        """The stream's last batch applied and (campaign, day) -> charged micros, read together."""

    def add_conflicts(self, conflicts: Iterable[ConflictKey]) -> int: ...

    def set_not_charged(self, period: str, period_start_ms: int, counts: Any) -> None: ...

    def record_reconciliation(self, record: Mapping[str, Any]) -> None: ...


class DaysRead(Protocol):
    """Campaigns' day totals and the stream's last batch applied, read together (`Totals.read_days`)."""

    @property
    def last_applied(self) -> int | None:
        """The stream's last batch the day totals hold (None: no record)."""

    @property
    def day_charged(self) -> dict[tuple[str, str], int]:
        """(campaign, UTC day) -> micros charged that day so far."""


class Exports(Protocol):
    """The closed periods' finance exports."""

    def exported(self) -> list[str]:
        """The periods with a complete export."""

    def closed_at_ms(self, period: str) -> int: ...

    def given(self, period: str) -> Bills:
        """The bills finance was given in a period's export."""

    def totals(self, period: str) -> Any:
        """A period's figures as its export has them (`billing.export.export_totals`)."""

    def write(
        self,
        period: str,
        export: Any,
        start_ms: int,
        end_ms: int,
        closed_at_ms: int,
        not_charged: Any = None,
        judged_with: Mapping[str, Any] | None = None,
    ) -> None: ...

    def not_charged(self, period: str) -> Any:
        """A closed period's not-charged figures as its export has them (the clicks of the period and the
        adjustments booked in it)."""


class PendingRelease(Protocol):
    """Quarantined records a run is about to release (`attribution.release`), into a batch already committed."""

    @property
    def batch_id(self) -> int:
        """The batch they are released into."""

    @property
    def periods(self) -> frozenset[str]:
        """Every period whose bills they can change."""

    @property
    def count(self) -> int:
        """Records that go to the archive (the others stay in quarantine with their reason)."""

    def write(self) -> None:
        """Write them, and apply their counts to the totals."""


class StateStore(Protocol):
    def load(self) -> dict[str, PeriodState]: ...

    def save(self, states: Mapping[str, PeriodState]) -> None: ...

    def record_run(self, record: dict[str, object]) -> None:
        """Keep the run's record beside the state (for `adbill restore-redis`)."""


@dataclass(frozen=True)
class ReconcilePorts:
    """What a reconciliation run reads and writes, and its clock."""

    catalog: Catalog
    """The catalog the run prices with (`final_bills` prices by it): its history tells which closed periods a
    back-fill re-priced, and its version is recorded with each period the run reconciles."""
    final_bills: Callable[[list[str]], FinalBills]
    ledger: Callable[[], Ledger]
    corrections: CorrectionsStore
    conflicts: ConflictsStore
    totals: Callable[[], Totals]
    """Made once the run is not refused."""
    exports: Exports
    states: StateStore
    versions: Callable[[], dict[str, int]]
    """Per period with data, its data version (`billing.reconcile_plan`)."""
    position: Callable[[], StreamPosition]
    """Where the stream stands now."""
    clock: Callable[[], int]
    release: Callable[[str, Callable[[str], None]], AbstractContextManager[PendingRelease | None]] = (
        lambda run_id, progress: nullcontext(None)
    )
    """The records the run with this id releases (saying on `progress` why it does not), held from the other
    releaser until the block ends; None: nothing to release."""
    invoices: Callable[[Mapping[str, int], Mapping[str, PeriodState], int], list[str]] = (
        lambda versions, states, now_ms: []
    )
    """Issue the monthly invoices of every month whose periods are all closed now
    (`billing.invoices.Issuer.issue_ready`, from the periods' data versions and states); what it did, in words."""


def reconcile_periods(
    ports: ReconcilePorts,
    periods: Periods,
    horizon_ms: int,
    until_ms: int | None = None,
    progress: Callable[[str], None] = lambda message: None,
    position: StreamPosition | None = None,
    force: bool = False,
) -> RunReport:
    """One reconciliation run (see the module's docstring). `position` is where the stream stands (asked of the port
    when not given); `force` closes periods the stream has not passed (a back-fill that knows better)."""
    now_ms = ports.clock()
    report = RunReport(run_id=f"{now_ms}-{uuid.uuid4().hex[:8]}", started_at_ms=now_ms)
    states = closed_by_exports(ports.exports, ports.states.load())
    if position is None:
        # A forced run closes whatever the stream did: it need not ask (the job and Kafka may be gone for good).
        unasked = StreamPosition(committed=None, end=None, silent_for_ms=None, error="not asked: forced")
        position = unasked if force else ports.position()
    # After the position: the data the run reads (up to the stream's committed batch, read now) holds at least
    # what the position says the stream has passed. The release goes into that batch, before the versions.
    _release(ports, states, report, progress)
    versions = ports.versions()
    every_correction = ports.corrections.read()
    for booked in {c.booked_period for c in every_correction}:
        versions.setdefault(booked, -1)
    catalog_version = ports.catalog.version
    plan = plan_run(versions, states, periods, now_ms, horizon_ms, position, until_ms, force, ports.catalog)
    for period, target in plan.targets.items():
        states[period] = replace(states.get(period, PeriodState(version=-1)), target_offsets=target)
    for period in plan.priced_alike:
        states[period] = replace(states[period], catalog_version=catalog_version)
    if plan.targets or plan.priced_alike:
        ports.states.save(states)
    report.held = plan.held
    for period, reason in plan.held.items():
        progress(f"period {period} {reason}")
    for period in plan.repriced:
        progress(f"period {period}: the catalog's history prices it otherwise now (version {catalog_version})")
    if until_ms is not None and plan.held and not force:
        raise HeldError(plan.held)
    totals = ports.totals()
    closed = {p for p, s in states.items() if s.closed}
    settle_closed_in_redis(ports.exports, totals, closed, periods)
    due = plan.due
    report.periods = due
    if not due:
        _send_conflicts(ports.conflicts, report, progress)  # what an earlier run could not send
        _invoice(ports, versions, states, report, progress)
        _finish(ports, totals, report)
        return report
    progress(f"reconciling {len(due)} period(s): {due[0]} .. {due[-1]}")
    final_all = ports.final_bills(due)
    report.final_clicks = final_all.clicks
    facts = final_all.facts
    ledger = ports.ledger()
    booked_in = open_period(periods, now_ms, until_ms)
    if booked_in in closed:
        raise RuntimeError(f"the open period {booked_in} is already closed: is the clock behind the data?")
    report.conflicts = totals.add_conflicts(ports.conflicts.keep(due, final_all.conflicts))
    _send_conflicts(ports.conflicts, report, progress)
    # Reconcile every due period first: nothing is written unless all of them balance.
    new_of: dict[str, list[Correction]] = {}
    for period in due:
        progress(f"period {period}")
        final = final_all.of_period(period)
        of_period = [c for c in every_correction if c.corrects_period == period]
        if period in closed:
            # What finance was given: the export's bills and the adjustments booked for the period since.
            given = ports.exports.given(period)
            earlier = [c for c in of_period if c.booked_period != period]
            new = reconcile_period(
                period,
                final,
                given,
                earlier,
                booked_period=booked_in,
                now_ms=now_ms,
                facts=replace(facts, billed_after_close_click_ids=ledger.billed_after_close(period, given)),
                reserved_ids={c.correction_id for c in of_period},
            )
            problems = check_reconciled(final, given, earlier + new)
        else:
            ledger_rows = ledger.of_period(period)
            new = reconcile_period(
                period, final, ledger_rows, of_period, booked_period=period, now_ms=now_ms, facts=facts
            )
            problems = check_reconciled(final, ledger_rows, of_period + new)
        if problems:
            raise RuntimeError(f"reconciliation of {period} does not balance: {problems[:5]}")
        new_of[period] = new
    # The room a raise needs: the bills of the day's still open periods that the budget no longer lets stand.
    still_open = _open_on_days_of(due, versions, closed, periods)
    room = budget_room(new_of, final_all, ledger, every_correction, still_open, now_ms)
    # And the bills the stream charged on those days since the run read the ledger, which Redis holds.
    raised = RaisedDays(ports.catalog, periods, closed, due, final_all, ledger, ports.exports, now_ms)
    raised.count([*every_correction, *(c for new in (*room.values(), *new_of.values()) for c in new)])
    days = raised.days_of(
        c
        for c in [*every_correction, *(c for new in new_of.values() for c in new)]
        if c.corrects_period in new_of or c.corrects_period in still_open
    )
    read = totals.read_days(days) if days else None
    if read is not None:
        for period, extra in raised.room(days, read.last_applied).items():
            room[period] = [*room.get(period, []), *extra]
    # Book: what takes back is written before what adds, and reaches the totals first, in the same call.
    for period, new in sorted([*room.items(), *new_of.items()], key=lambda item: _raises(item[1])):
        if new:
            ports.corrections.write(period, report.run_id, new)
            every_correction += new
        if period in room:
            progress(f"period {period}: {len(new)} over-budget retraction(s) written, room for a raise of its day")
        else:
            progress(f"period {period}: {len(new)} new correction(s) written")
    # Earlier ones too: a run that stopped between its files and Redis is completed (each id applies once).
    to_apply = [c for c in every_correction if c.corrects_period in new_of or c.corrects_period in still_open]
    to_apply += [c for period in room.keys() - new_of.keys() - set(still_open) for c in room[period]]
    for attempt in range(1, DAY_TRIES + 1):
        to_apply.sort(key=lambda c: c.kind != CorrectionKind.RETRACTION)
        try:
            totals.apply_corrections(
                to_apply, _starts(periods, to_apply), days_read=None if read is None else read.day_charged
            )
            break
        except DaysMovedError as moved:
            if attempt == DAY_TRIES:
                raise DaysUnsettledError(moved.days, DAY_TRIES) from moved
            # The stream charged a raised day meanwhile: its newer bills counted, retracted where over, again.
            progress(f"{moved}; counting the stream's newer bills there (try {attempt + 1})")
            read = totals.read_days(moved.days)
            for period, extra in sorted(raised.room(moved.days, read.last_applied).items()):
                ports.corrections.write(period, f"{report.run_id}-{attempt + 1}", extra)
                progress(
                    f"period {period}: {len(extra)} over-budget retraction(s) written, room for a raise of its day"
                )
                every_correction += extra
                to_apply += extra
                room[period] = [*room.get(period, []), *extra]
    for period in due:
        progress(f"period {period}: corrections applied to Redis")
    for new in [*room.values(), *new_of.values()]:
        report.additions += sum(1 for c in new if c.kind == CorrectionKind.ADDITION)
        report.retractions += sum(1 for c in new if c.kind == CorrectionKind.RETRACTION)
        net = Amounts(report.net_micros_by_currency) + Amounts.of((c.currency, c.amount_micros) for c in new)
        report.net_micros_by_currency = net.as_dict()
    for period in due:
        state = states.get(period, PeriodState(version=-1))
        if period not in closed:
            export = build_export(
                period,
                final_all.of_period(period),
                ledger.of_period(period),
                [c for c in every_correction if c.corrects_period == period],
                [c for c in every_correction if c.booked_period == period and c.corrects_period != period],
            )
            start = periods.parse_key(period)
            closed_at = ports.clock()  # when it closes: the export is written now, not when the run started
            ports.exports.write(
                period,
                export,
                start,
                start + periods.length_ms,
                closed_at,
                final_all.not_charged_of(period),
                final_all.judged_with,
            )
            progress(f"period {period}: exported")
            totals.close_period(period, start, ports.exports.totals(period))
            totals.set_not_charged(period, start, ports.exports.not_charged(period))
            progress(f"period {period}: closed in Redis")
            state = replace(state, closed_at_ms=closed_at)
            closed.add(period)
            report.closed.append(period)
        states[period] = replace(state, version=versions[period], catalog_version=catalog_version)
        ports.states.save(states)
    _invoice(ports, versions, states, report, progress)
    _finish(ports, totals, report)
    return report


def closed_by_exports(exports: Exports, states: dict[str, PeriodState]) -> dict[str, PeriodState]:
    """The states, with every period that has an export marked closed: a run that stopped after writing an
    export and before its state file closed the period all the same (an export is never rewritten)."""
    for period in exports.exported():
        state = states.get(period)
        if state is None or not state.closed:
            states[period] = replace(state or PeriodState(version=-1), closed_at_ms=exports.closed_at_ms(period))
    return states


def settle_closed_in_redis(exports: Exports, totals: Totals, closed: set[str], periods: Periods) -> None:
    """Close in Redis, from its export, every closed period Redis does not know as closed (a run that stopped
    between the export and Redis, or a Redis that lost its data)."""
    for period in sorted(closed - set(totals.closed_periods())):
        totals.close_period(period, periods.parse_key(period), exports.totals(period))
        totals.set_not_charged(period, periods.parse_key(period), exports.not_charged(period))


def _release(
    ports: ReconcilePorts, states: dict[str, PeriodState], report: RunReport, progress: Callable[[str], None]
) -> None:
    """Release what the registry lets the run decode now; the periods it changes are marked changed first."""
    with ports.release(report.run_id, progress) as pending:
        if pending is None:
            return
        if mark_changed(states, pending.periods, pending.batch_id):
            ports.states.save(states)
        pending.write()
        report.released = pending.count
        progress(
            f"released {pending.count} quarantined record(s) whose schema id the registry now knows, into batch "
            f"{pending.batch_id}"
        )


def _send_conflicts(conflicts: ConflictsStore, report: RunReport, progress: Callable[[str], None]) -> None:
    outcome = conflicts.send(progress)
    if outcome is not None:
        report.conflicts_sent, report.conflicts_unsent = outcome


def _invoice(
    ports: ReconcilePorts,
    versions: Mapping[str, int],
    states: Mapping[str, PeriodState],
    report: RunReport,
    progress: Callable[[str], None],
) -> None:
    """The monthly invoices of the months this run (or an earlier one) closed the last period of."""
    report.invoices = ports.invoices(versions, states, ports.clock())
    for line in report.invoices:
        progress(line)


def _finish(ports: ReconcilePorts, totals: Totals, report: RunReport) -> None:
    """The run's record, for the health page, in Redis and beside the state (for `adbill restore-redis`)."""
    report.finished_at_ms = ports.clock()
    record = report.record()
    ports.states.record_run(record)
    totals.record_reconciliation(record)


def budget_room(
    new_of: Mapping[str, list[Correction]],
    final_all: FinalBills,
    ledger: Ledger,
    every_correction: Iterable[Correction],
    still_open: Iterable[str],
    now_ms: int,
) -> dict[str, list[Correction]]:
    """Per period still open, the `over_budget` retractions that make room for what the run's new corrections
    raise (`billing.corrections.over_budget_room`): for each campaign and UTC day an addition raises, the bills of
    the day's open periods that the budget, taken in event-time order over everything received so far, finds over
    it. Without them, the day's closed exports and live totals would charge past the budget until those periods
    close."""
    raised = {
        (c.campaign_id, _day_of(c.corrects_period))
        for new in new_of.values()
        for c in new
        if c.kind == CorrectionKind.ADDITION and c.amount_micros > 0
    }
    if not raised:
        return {}
    earlier = list(every_correction)
    room: dict[str, list[Correction]] = {}
    for period in still_open:
        day = _day_of(period)
        over = {
            row["click_id"]
            for row in final_all.not_charged_of(period)
            if row["reason"] == OVER_BUDGET and (row["campaign_id"], day) in raised
        }
        if not over:
            continue
        retractions = over_budget_room(
            period,
            over,
            ledger.of_period(period),
            [c for c in earlier if c.corrects_period == period],
            now_ms=now_ms,
        )
        if retractions:
            room[period] = retractions
    return room


class RaisedDays:
    """The budgeted campaign days a run's corrections raise, held to their budget with every bill of the stream that
    Redis holds for them: those the run's plan read and those of the batches the stream applied since
    (`Ledger.newer`, from the batch the plan read through to the last Redis applied).

    On each day the bills that stand are taken in the budget's order (event time, then click id,
    `billing.budgets.over_budget_standing`): the closed periods' (their export and the adjustments booked for them),
    the due periods' (their final bills, and the stream's newer ones, which Redis counts until they are adjusted),
    and the open periods', the only ones a correction may take back now (their ledger and newer bills less the
    corrections booked); the later ones the budget no longer lets stand are retracted, `over_budget`, in their open
    period, with the ids `over_budget_room` gives (the period's own reconciliation finds them booked)."""

    def __init__(
        self,
        catalog: Catalog,
        periods: Periods,
        closed: Collection[str],
        due: Collection[str],
        final_all: FinalBills,
        ledger: Ledger,
        exports: Exports,
        now_ms: int,
    ) -> None:
        self.catalog, self.periods, self.closed, self.due = catalog, periods, set(closed), set(due)
        self.final_all, self.ledger, self.exports, self.now_ms = final_all, ledger, exports, now_ms
        self.read_through = ledger.read_through
        self.newer: list[BillRow] = []
        self._corrections: dict[str, list[Correction]] = {}
        self._rows: dict[str, dict[str, list[BillRow]]] = {}

    def count(self, corrections: Iterable[Correction]) -> None:
        """Corrections booked (or about to be): they stand in their periods' books."""
        for c in corrections:
            self._corrections.setdefault(c.corrects_period, []).append(c)

    def days_of(self, corrections: Iterable[Correction]) -> list[tuple[str, str]]:
        """(campaign, UTC day) of each addition that raises a day with a budget."""
        days = set()
        for c in corrections:
            if c.kind == CorrectionKind.ADDITION and c.amount_micros > 0:
                start = self.periods.parse_key(c.corrects_period)
                if self._budgeted(c.campaign_id, day_start(start)):
                    days.add((c.campaign_id, utc_day(start)))
        return sorted(days)

    def room(self, days: Iterable[tuple[str, str]], last_applied: int | None) -> dict[str, list[Correction]]:
        """Per open period, the `over_budget` retractions the `days` need, counting the stream's bills up to batch
        `last_applied` (what Redis holds); they are counted as booked."""
        days = sorted(days)
        if self.read_through is not None and last_applied is not None and last_applied > self.read_through:
            of_days = [p for day in sorted({day for _, day in days}) for p in self._periods_of(day)]
            self.newer += list(self.ledger.newer(self.read_through, last_applied, of_days))
            self.read_through = last_applied
            self._rows = {}
        room: dict[str, list[Correction]] = {}
        for campaign, day in days:
            bills, movable = self._standing(campaign, day)
            over = over_budget_standing(bills, self.catalog.budget_at) if movable else set()
            for period, (rows, standing) in movable.items():
                clicks = over & standing
                if not clicks:
                    continue
                earlier = [c for c in self._corrections.get(period, []) if c.click_id in clicks]
                retractions = over_budget_room(period, clicks, rows, earlier, now_ms=self.now_ms)
                self.count(retractions)
                room.setdefault(period, []).extend(retractions)
        return room

    def _standing(
        self, campaign: str, day: str
    ) -> tuple[list[StandingBill], dict[str, tuple[list[BillRow], set[str]]]]:
        """The bills that stand on the campaign's day; per open period with bills that may move, its rows and the
        click ids standing there."""
        bills: list[StandingBill] = []
        movable: dict[str, tuple[list[BillRow], set[str]]] = {}
        fixed: list[str] = []
        for period in self._periods_of(day):
            if period in self.closed or period in self.due:
                fixed.append(period)
                continue
            rows = self._rows_of(period).get(campaign, [])
            corrections = [c for c in self._corrections.get(period, []) if c.campaign_id == campaign]
            standing = self._bills(period, rows, corrections, movable=True)
            if standing:
                bills += standing
                movable[period] = (rows, {bill.click_id for bill in standing})
        if not movable:
            return bills, movable  # nothing a correction may take back: the rest need not be read
        for period in fixed:
            if period in self.closed:
                given = [r for r in self.exports.given(period) if _field(r, "campaign_id") == campaign]
                adjustments = [
                    c
                    for c in self._corrections.get(period, [])
                    if c.campaign_id == campaign and c.booked_period != period
                ]
                bills += self._bills(period, given, adjustments, movable=False)
            else:
                rows = self._rows_of(period).get(campaign, [])
                bills += self._bills(period, rows, [], movable=False)
        return bills, movable

    def _rows_of(self, period: str) -> dict[str, list[BillRow]]:
        """A period's bills by campaign, as the books count them now: a due period's final bills, an open period's
        ledger rows; with the stream's newer bills of either (a closed period's are adjustments to come)."""
        if period not in self._rows:
            rows = list(self.final_all.of_period(period) if period in self.due else self.ledger.of_period(period))
            rows += [row for row in self.newer if self.periods.key_of(_field(row, "click_time")) == period]
            by_campaign: dict[str, list[BillRow]] = {}
            for row in rows:
                by_campaign.setdefault(_field(row, "campaign_id"), []).append(row)
            self._rows[period] = by_campaign
        return self._rows[period]

    def _bills(
        self, period: str, rows: list[BillRow], corrections: list[Correction], *, movable: bool
    ) -> list[StandingBill]:
        times = {_field(row, "click_id"): _field(row, "click_time") for row in rows}
        start = self.periods.parse_key(period)
        return [
            StandingBill(click_id, charge.campaign_id, times.get(click_id, start), charge.amount_micros, movable)
            for click_id, charge in standing_bills(rows, corrections)
        ]

    def _periods_of(self, day: str) -> list[str]:
        midnight = parse_day(day)
        return [self.periods.key(at) for at in range(midnight, midnight + DAY_MS, self.periods.length_ms)]

    def _budgeted(self, campaign: str, midnight: int) -> bool:
        """Whether the campaign has a budget at some time of the day."""
        if self.catalog.budget_at(campaign, midnight) is not None:
            return True
        return any(
            change.daily_budget_micros is not None and midnight <= change.effective_from < midnight + DAY_MS
            for change in self.catalog.budget_history(campaign)
        )


def _field(row: BillRow, name: str) -> Any:
    """A field of a bill, a mapping's or a `BillableClick`'s."""
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def _open_on_days_of(
    due: Iterable[str], versions: Mapping[str, int], closed: Collection[str], periods: Periods
) -> list[str]:
    """The periods with data, neither closed nor due, on the UTC day of a due period: still open after the run."""
    days = {_day_of(period) for period in due}
    due_now = set(due)
    return sorted(
        (p for p in versions if p not in closed and p not in due_now and _day_of(p) in days),
        key=periods.parse_key,
    )


def _day_of(period: str) -> int:
    """The UTC day a period lies in (its midnight, epoch ms): periods divide a day evenly."""
    return day_start(ANY_PERIOD.parse_key(period))


def _raises(corrections: Iterable[Correction]) -> bool:
    """Whether a file of corrections adds more than it takes back."""
    return sum(c.amount_micros for c in corrections) > 0


def _starts(periods: Periods, corrections: Iterable[Correction]) -> dict[str, int]:
    return {c.booked_period: periods.parse_key(c.booked_period) for c in corrections}
