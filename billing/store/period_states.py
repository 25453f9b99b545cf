"""The per-period state file of reconciliation (`billing.closing.PeriodState` per period, as JSON)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from billing.closing import PeriodState
from billing.store.durable import make_folder, replace_files


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
    """Replace the state file atomically and durably (write a sibling, flush it, rename, flush the folder)."""
    touched = make_folder(path.parent)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({p: asdict(s) for p, s in sorted(states.items())}, indent=1))
    replace_files([(temporary, path)], touched)
