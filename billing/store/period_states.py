"""Adapter: reconciliation's records in the data folder's reconcile folder: the per-period state file
(`billing.reconcile_plan.PeriodState` per period, as JSON), the last run's and the last audit's records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from billing.layout import DataLayout
from billing.reconcile_plan import PeriodState
from billing.reconcile_run import closed_by_exports
from billing.store.durable import write_whole
from billing.store.export_files import ExportFolders


def load_states(path: Path) -> dict[str, PeriodState]:
    """The per-period state file (`{}` when there is none yet)."""
    if not path.exists():
        return {}
    states = {}
    for period, value in json.loads(path.read_text()).items():
        target = value.get("target_offsets")
        if target is not None:
            value["target_offsets"] = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in target.items()}
        states[period] = PeriodState(**value)
    return states


def save_states(path: Path, states: Mapping[str, PeriodState]) -> None:
    """Replace the state file whole (`billing.store.durable.write_whole`)."""
    write_whole(path, json.dumps({p: asdict(s) for p, s in sorted(states.items())}, indent=1))


@dataclass(frozen=True)
class StateFile:
    """The periods' states and the last run's record, in the layout's reconcile folder."""

    layout: DataLayout

    def load(self) -> dict[str, PeriodState]:
        return load_states(self.layout.periods_file)

    def save(self, states: Mapping[str, PeriodState]) -> None:
        save_states(self.layout.periods_file, states)

    def record_run(self, record: dict[str, object]) -> None:
        save_record(self.layout.last_run_file, record)


def save_record(path: Path, record: dict[str, object]) -> None:
    """Keep a reconciliation or audit record (`DataLayout.last_run_file`, `last_audit_file`): written, flushed,
    renamed into place."""
    write_whole(path, json.dumps(record, indent=1, default=str))


def closed_periods(layout: DataLayout) -> set[str]:
    """The periods closing marked closed, each with its export (`billing.reconcile_run.closed_by_exports`)."""
    return {p for p, s in closed_by_exports(ExportFolders(layout), StateFile(layout).load()).items() if s.closed}
