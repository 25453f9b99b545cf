"""Which periods a reconciliation run takes up, and where its corrections are booked.

A period is *due* for reconciliation when

- it is open and its lateness horizon has passed (`end + horizon <= now`), or it ends at or before the time a
  back-fill asks to close everything up to (`until`); the run reconciles it and closes it; or
- it is closed and data for it arrived since it was last reconciled (its *version*, the largest micro-batch id
  of the archive and ledger files that can change it, grew); the run books adjustments in the open period.

Pure: the caller lists the files and passes versions and state in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from billing.periods import Periods


@dataclass(frozen=True)
class PeriodState:
    """What reconciliation last did for a period: the data version it saw, and when it closed it (None: open)."""

    version: int
    closed_at_ms: int | None = None

    @property
    def closed(self) -> bool:
        return self.closed_at_ms is not None


def due_periods(
    versions: Mapping[str, int],
    states: Mapping[str, PeriodState],
    periods: Periods,
    now_ms: int,
    horizon_ms: int,
    until_ms: int | None = None,
) -> list[str]:
    """The periods to reconcile now, oldest first (see the module's docstring)."""
    due = []
    for period, version in versions.items():
        state = states.get(period)
        if state is not None and state.closed:
            if version > state.version:
                due.append(period)
            continue
        end = periods.parse_key(period) + periods.length_ms
        if end + horizon_ms <= now_ms or (until_ms is not None and end <= until_ms):
            due.append(period)
    return sorted(due, key=periods.parse_key)


def open_period(periods: Periods, now_ms: int, until_ms: int | None = None) -> str:
    """The period where adjustments of closed periods are booked: the one holding now (or `until`, if later)."""
    return periods.key_of(max(now_ms, until_ms if until_ms is not None else now_ms))


def load_states(path: Path) -> dict[str, PeriodState]:
    """The per-period state file (`{}` when there is none yet)."""
    if not path.exists():
        return {}
    return {period: PeriodState(**value) for period, value in json.loads(path.read_text()).items()}


def save_states(path: Path, states: Mapping[str, PeriodState]) -> None:
    """Replace the state file atomically (write a sibling, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({p: asdict(s) for p, s in sorted(states.items())}, indent=1))
    temporary.replace(path)
