"""Which periods reconciliation takes up, where adjustments are booked, and `adbill export`'s refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from billing.closing import PeriodState, due_periods, load_states, open_period, save_states
from billing.periods import Periods
from ops.reconciling import export_periods, parse_time
from ops.settings import Settings

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
P0, P1, P2 = "20260101T0000Z", "20260101T0100Z", "20260101T0200Z"
HORIZON = 900_000


@pytest.mark.parametrize(
    ("now", "until", "states", "versions", "due"),
    [
        # P0 ends at 01:00; its horizon passes at 01:15 exactly: due then, not a millisecond before.
        (T0 + H + HORIZON - 1, None, {}, {P0: 3}, []),
        (T0 + H + HORIZON, None, {}, {P0: 3}, [P0]),
        # --until closes every period that ends by then, whatever the horizon.
        (T0, T0 + 2 * H, {}, {P0: 3, P1: 4, P2: 5}, [P0, P1]),
        # A closed period is taken up again only when its data version grew (late data for it).
        (T0 + 5 * H, None, {P0: PeriodState(3, T0 + H)}, {P0: 3}, []),
        (T0 + 5 * H, None, {P0: PeriodState(3, T0 + H)}, {P0: 4}, [P0]),
        # An open period that was reconciled but not closed is still due once its horizon passed.
        (T0 + 5 * H, None, {P1: PeriodState(2)}, {P1: 2}, [P1]),
    ],
)
def test_due_periods(now: int, until: int | None, states: dict, versions: dict, due: list[str]) -> None:
    assert due_periods(versions, states, Periods(), now, HORIZON, until) == due


def test_adjustments_are_booked_in_the_period_of_now_or_until_whichever_is_later() -> None:
    assert open_period(Periods(), T0 + 90 * 60_000) == P1
    assert open_period(Periods(), T0, until_ms=T0 + 2 * H) == P2


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "reconcile" / "periods.json"
    assert load_states(path) == {}
    states = {P0: PeriodState(7, T0 + H), P1: PeriodState(9)}
    save_states(path, states)
    assert load_states(path) == states
    assert states[P0].closed and not states[P1].closed


@pytest.mark.parametrize(
    ("text", "ms"),
    [("1767225600000", T0), ("2026-01-01T00:00Z", T0), ("2026-01-01T01:00:00+01:00", T0), ("2026-01-01T00:00", T0)],
)
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time(text) == ms


def test_parse_time_refuses_nonsense() -> None:
    with pytest.raises(SystemExit, match="neither epoch ms nor an ISO-8601"):
        parse_time("yesterday")


def test_export_refuses_a_period_that_is_not_closed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings.from_env({}, home=tmp_path)
    assert export_periods(settings, P0, P1, tmp_path / "out") == 1
    assert "not closed yet (no export): 20260101T0000Z, 20260101T0100Z" in capsys.readouterr().err
    assert export_periods(settings, P1, P0, tmp_path / "out") == 2
    assert export_periods(settings, "last week", None, tmp_path / "out") == 2
