"""Reconciliation's per-period state file."""

from __future__ import annotations

import json
from pathlib import Path

from billing.reconcile_plan import PeriodState
from billing.store.period_states import load_states, save_states

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P0, P1 = "20260101T0000Z", "20260101T0100Z"


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "reconcile" / "periods.json"
    assert load_states(path) == {}
    states = {
        P0: PeriodState(7, T0 + H, catalog_version=12),
        P1: PeriodState(9, target_offsets={"clicks": {0: 12, 3: 4}}),
    }
    save_states(path, states)
    assert load_states(path) == states
    assert states[P0].closed and not states[P1].closed


def test_a_state_file_from_before_the_catalog_version_was_kept_reads_as_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "periods.json"
    path.write_text(json.dumps({P0: {"version": 7, "closed_at_ms": T0 + H, "target_offsets": None}}))
    assert load_states(path) == {P0: PeriodState(7, T0 + H, catalog_version=None)}
