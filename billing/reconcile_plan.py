"""Which periods a reconciliation run takes up, which it may close, and where its corrections are booked.

A period is *due* for reconciliation when

- it is open and its lateness horizon has passed (`end + horizon <= now`), or it ends at or before the time a
  back-fill asks to close everything up to (`until`); the run reconciles it and closes it, but only once the
  streaming job has provably passed it (below); until then the period is *held*, with the reason;
- it is closed and data for it arrived since it was last reconciled (its *version*, the largest micro-batch id
  of the archive and ledger files that can change it, grew), or a change of the catalog's history since then
  prices a click of its time otherwise (a back-fill: `Catalog.repriced_since` the catalog version it was last
  reconciled with); the run books adjustments in the open period. Records released from quarantine into a batch
  the period has already seen (by reconciliation, into the stream's last committed batch) lower its recorded version
  first (`mark_changed`).

Closing follows the stream. The first run that finds a period's horizon passed records the end offsets Kafka
then held (the period's *target*: every record that can still belong to the period and was in Kafka when the
horizon passed, and a few more); the period closes once the billing query is alive and its committed offsets
(the checkpoint's last committed batch) reach that target. A job that is down or behind holds the period, so
nothing still unread in Kafka is left out of its export. `force` (a back-fill that knows better) closes anyway.

Pure: the caller lists the files, reads the offsets and the job's heartbeat, and passes them in; the state file
is `billing.store.period_states`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field

from billing.catalog import Catalog
from billing.periods import Periods, format_elapsed

Offsets = dict[str, dict[int, int]]
"""Kafka offsets: topic -> partition -> the next offset to read (or the end offset)."""


@dataclass(frozen=True)
class PeriodState:
    """What reconciliation last did for a period: the data version it saw, when it closed it (None: open), the
    Kafka end offsets recorded when its horizon was first found passed (None: not yet), and the catalog version
    its final bills were priced with (None: not recorded, a state from before it was kept)."""

    version: int
    closed_at_ms: int | None = None
    target_offsets: Offsets | None = None
    catalog_version: int | None = None

    @property
    def closed(self) -> bool:
        return self.closed_at_ms is not None


@dataclass(frozen=True)
class StreamPosition:
    """Where the streaming job stands, as reconciliation sees it when it starts."""

    committed: Offsets | None
    """The offsets of the billing query's last committed micro-batch; None when it has committed none."""
    end: Offsets | None
    """The topics' end offsets now; None when Kafka could not be asked (`error` says why)."""
    silent_for_ms: int | None
    """How long since the job last reported (a batch, or an idle trigger); None when it never has."""
    alive_within_ms: int = 120_000
    """A job silent for longer than this is down."""
    error: str | None = None
    waiting: str | None = None
    """What the job says it is waiting for, and since when (its status record: `waiting for disk space for 3
    min`); None when it says nothing. A waiting job bills nothing, and holds the periods it has not passed."""

    @property
    def alive(self) -> bool:
        return self.silent_for_ms is not None and self.silent_for_ms <= self.alive_within_ms

    def behind(self, target: Offsets) -> int:
        """Records of `target` the job has not read yet."""
        committed = self.committed or {}
        return sum(
            max(0, offset - committed.get(topic, {}).get(partition, 0))
            for topic, parts in target.items()
            for partition, offset in parts.items()
        )


@dataclass(frozen=True)
class Plan:
    """What a run does: the periods to reconcile (oldest first), which of them it closes, the periods it holds
    with the reason, the targets it recorded for periods whose horizon it found passed, the closed periods due
    because the catalog re-priced them, and the closed periods the catalog's changes since their last
    reconciliation left alone (recorded as priced with the run's catalog version: the next run compares from
    there)."""

    due: list[str]
    closing: list[str]
    held: dict[str, str] = field(default_factory=dict)
    targets: dict[str, Offsets] = field(default_factory=dict)
    repriced: list[str] = field(default_factory=list)
    priced_alike: list[str] = field(default_factory=list)


def plan_run(
    versions: Mapping[str, int],
    states: Mapping[str, PeriodState],
    periods: Periods,
    now_ms: int,
    horizon_ms: int,
    position: StreamPosition,
    until_ms: int | None = None,
    force: bool = False,
    catalog: Catalog | None = None,
) -> Plan:
    """The periods to reconcile now, the ones to close and the ones held (see the module's docstring). `catalog` is
    the one the run prices with (None: the catalog's changes are not looked at)."""
    due: list[str] = []
    closing: list[str] = []
    held: dict[str, str] = {}
    targets: dict[str, Offsets] = {}
    repriced: list[str] = []
    priced_alike: list[str] = []
    moved = _CatalogMoves(catalog)
    for period in sorted(versions, key=periods.parse_key):
        state = states.get(period)
        if state is not None and state.closed:
            start = periods.parse_key(period)
            if versions[period] > state.version:
                due.append(period)
            elif catalog is None or state.catalog_version == catalog.version:
                pass
            elif moved.within(state.catalog_version, start, start + periods.length_ms):
                due.append(period)
                repriced.append(period)
            else:
                priced_alike.append(period)
            continue
        end = periods.parse_key(period) + periods.length_ms
        if not (end + horizon_ms <= now_ms or (until_ms is not None and end <= until_ms)):
            continue
        target = state.target_offsets if state is not None and state.target_offsets is not None else None
        if target is None and position.end is not None:
            target = targets[period] = _copy(position.end)
        if force:
            reason = None
        elif target is None:
            reason = f"held: Kafka's end offsets are unknown ({position.error})"
        else:
            reason = hold_reason(position, target)
        if reason is None:
            due.append(period)
            closing.append(period)
        else:
            held[period] = reason
    return Plan(due=due, closing=closing, held=held, targets=targets, repriced=repriced, priced_alike=priced_alike)


class _CatalogMoves:
    """Whether the catalog's changes since a version re-price a span of time (`Catalog.repriced_since`, worked out
    once per version asked about)."""

    def __init__(self, catalog: Catalog | None) -> None:
        self.catalog = catalog
        self._spans: dict[int, tuple[list[int], list[tuple[int, int]]]] = {}

    def within(self, since_version: int | None, start_ms: int, end_ms: int) -> bool:
        """Whether a change made after `since_version` (None: unknown, so any) prices some time of `[start, end)`
        otherwise."""
        if self.catalog is None:
            return False
        if since_version is None:
            return True
        if since_version not in self._spans:
            spans = self.catalog.repriced_since(since_version)
            self._spans[since_version] = ([s for s, _ in spans], spans)
        starts, spans = self._spans[since_version]
        # The spans are sorted and apart: the last one starting before `end` is the only one that can reach `start`.
        index = bisect_left(starts, end_ms) - 1
        return index >= 0 and spans[index][1] > start_ms


def mark_changed(states: dict[str, PeriodState], periods: set[str] | frozenset[str], batch_id: int) -> bool:
    """Mark each of `periods` as not having seen batch `batch_id` (its version at most `batch_id - 1`), so that a
    data version of `batch_id` makes it due again: data of that batch reached it after it was reconciled (records
    released from quarantine into a batch already committed). Whether a state changed."""
    changed = False
    for period in periods:
        state = states.get(period)
        if state is not None and state.version >= batch_id:
            states[period] = PeriodState(batch_id - 1, state.closed_at_ms, state.target_offsets)
            changed = True
    return changed


def hold_reason(position: StreamPosition, target: Offsets) -> str | None:
    """Why a period whose horizon passed cannot close yet (None: it can)."""
    if position.waiting is not None:
        return f"held: the streaming job is {position.waiting}"
    if position.silent_for_ms is None:
        return "held: the streaming job has never reported"
    if not position.alive:
        return f"held: the streaming job has been down for {format_elapsed(position.silent_for_ms)}"
    if position.committed is None:
        return "held: the streaming job has not committed a batch yet"
    behind = position.behind(target)
    if behind:
        return f"held: the streaming job is {_count(behind)} record(s) behind"
    return None


def open_period(periods: Periods, now_ms: int, until_ms: int | None = None) -> str:
    """The period where adjustments of closed periods are booked: the one holding now (or `until`, if later)."""
    return periods.key_of(max(now_ms, until_ms if until_ms is not None else now_ms))


def _copy(offsets: Offsets) -> Offsets:
    return {topic: dict(parts) for topic, parts in offsets.items()}


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} M"
    if n >= 10_000:
        return f"{n / 1000:.0f} k"
    return f"{n:,}"
